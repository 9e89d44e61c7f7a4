package agent

import (
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/warrenhq/warren/internal/agentproto"
)

// trustedRequest rewrites a trusted exec into an argv command run by the
// first protected toolkit's own shell (<mount>/bin/sh), and returns the
// PATH prefix of every protected toolkit's bin directories. The toolkit is
// a read-only mount the sandbox can neither change nor shadow, so the shell
// and the programs found first on PATH are the toolkit's. (Toolkit binaries
// should be static: a dynamic one would load the sandbox's libc.)
func (a *Agent) trustedRequest(req *agentproto.ExecRequest) (*agentproto.ExecRequest, string, error) {
	var dirs []string
	sh := ""
	for _, b := range a.cfg.Binds {
		if !b.Protected {
			continue
		}
		if sh == "" {
			sh = path.Join(b.Target, "bin/sh")
			// bin/sh may be a link (to busybox, say), but only within the
			// toolkit: never to the sandbox's own programs.
			real, err := filepath.EvalSymlinks(sh)
			if err != nil || !strings.HasPrefix(real, b.Target+"/") {
				return nil, "", errf(agentproto.ErrInvalid, "exec: trusted: %s is missing or leads out of the toolkit", sh)
			}
		}
		for _, d := range []string{"bin", "usr/bin", "sbin", "usr/sbin"} {
			dirs = append(dirs, path.Join(b.Target, d))
		}
	}
	if sh == "" {
		return nil, "", errf(agentproto.ErrInvalid, "exec: trusted needs a layer attached with protected: true")
	}
	if st, err := os.Stat(sh); err != nil || !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
		return nil, "", errf(agentproto.ErrInvalid, "exec: trusted: the toolkit has no executable %s", sh)
	}
	r := *req
	r.Session = ""
	if req.Cmd != "" {
		r.Argv = []string{sh, "-c", req.Cmd}
	} else {
		r.Argv = append([]string{sh, "-c", `exec "$@"`, "sh"}, req.Argv...)
	}
	r.Cmd = ""
	return &r, strings.Join(dirs, ":"), nil
}

// unsafeForTrusted reports whether environment variable k may change what
// a trusted command runs: the dynamic loader's variables (glibc's and
// musl's LD_*, and those glibc drops for setuid programs), shell start-up
// files and interpreters' search paths and options. A trusted command gets
// none of them from the sandbox's environment; only its request may set
// them.
func unsafeForTrusted(k string) bool {
	if strings.HasPrefix(k, "LD_") {
		return true
	}
	switch k {
	case "ENV", "BASH_ENV", "IFS", "CDPATH", "SHELLOPTS", "BASHOPTS", "PS4",
		"GCONV_PATH", "GETCONF_DIR", "HOSTALIASES", "LOCALDOMAIN", "LOCPATH", "MALLOC_TRACE",
		"NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TMPDIR", "TZDIR",
		"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONINSPECT",
		"PERL5LIB", "PERLLIB", "PERL5OPT", "RUBYLIB", "RUBYOPT", "NODE_OPTIONS", "NODE_PATH",
		"GLIBC_TUNABLES", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "GIT_EXEC_PATH", "GIT_CONFIG_PARAMETERS":
		return true
	}
	return false
}
