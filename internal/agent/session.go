package agent

import (
	"bytes"
	"maps"
	"strconv"
	"strings"
	"sync"
)

// sessions are named, terminal-like contexts: each keeps a working directory
// and exported variables between commands.
type sessions struct {
	mu sync.Mutex
	m  map[string]*session
}

type session struct {
	name string // as the sessions map keys it

	mu  sync.Mutex
	env map[string]string // nil until the first command updates it
	cwd string

	live     *liveShell // idle live shell (see liveshell.go)
	liveBusy bool       // its live shell is running a command
	reaping  bool       // reapWatch watches its shell's children
}

func newSessions() *sessions { return &sessions{m: make(map[string]*session)} }

func (s *sessions) get(name string) *session {
	if name == "" {
		name = "default"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.m[name]
	if ss == nil {
		ss = &session{name: name}
		s.m[name] = ss
	}
	return ss
}

// snapshot returns a copy of the session's environment (base when the
// session has none yet) and its cwd ("" when unset).
func (s *session) snapshot(base map[string]string) (map[string]string, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.env == nil {
		return maps.Clone(base), s.cwd
	}
	return maps.Clone(s.env), s.cwd
}

// notPersisted are variables the shell maintains itself.
var notPersisted = map[string]bool{"PWD": true, "SHLVL": true, "_": true}

// update stores what a command left behind. Variables the agent injected for
// this command only (request env, HOME/USER of the user) that came back
// unchanged revert to their prior session value. Last writer wins.
func (s *session) update(pwd string, exported, injected, prior map[string]string) {
	env := make(map[string]string, len(exported))
	for k, v := range exported {
		if !notPersisted[k] {
			env[k] = v
		}
	}
	for k, v := range injected {
		if nv, ok := env[k]; ok && nv == v {
			if pv, ok := prior[k]; ok {
				env[k] = pv
			} else {
				delete(env, k)
			}
		}
	}
	s.mu.Lock()
	s.env = env
	if pwd != "" {
		s.cwd = pwd
	}
	s.mu.Unlock()
}

// stateTrap makes the shell, on exit, close its stdout and stderr and then
// write "<exit status>\0$PWD\0<export -p>\0" to fd 4. The command's result
// is then known before the shell process has ended and been reaped: the
// agent answers as soon as the report and the end of the output arrive.
const stateTrap = `trap '__warren_rc=$?; exec >&- 2>&-; { printf "%s\0%s\0" "$__warren_rc" "$PWD"; export -p; printf "\0"; } >&4 2>/dev/null' EXIT` + "\n"

// stateFields is the number of NUL-terminated fields of a state report.
const stateFields = 3

// buildScript returns the script a shell spawned with spawnEnv in spawnDir
// runs to execute cmd with env in cwd, or ok=false when env cannot be
// expressed in shell syntax.
func buildScript(spawnEnv map[string]string, spawnDir string, env map[string]string, cwd, cmd string) (string, bool) {
	var b strings.Builder
	b.Grow(len(cmd) + 256)
	if !writeEnvDiff(&b, spawnEnv, spawnDir, env, cwd) {
		return "", false
	}
	b.WriteString(stateTrap)
	b.WriteString("__warren_cmd=" + shellQuote(cmd) + "\n")
	b.WriteString(`eval "$__warren_cmd" 3<&- 4>&-` + "\n")
	return b.String(), true
}

// writeEnvDiff writes the commands that take a shell whose exported
// variables are have and whose directory is haveDir to env and cwd, or
// returns false when env cannot be expressed in shell syntax. Variables the
// shell maintains itself (notPersisted) are left alone.
func writeEnvDiff(b *strings.Builder, have map[string]string, haveDir string, env map[string]string, cwd string) bool {
	for k := range have {
		if _, ok := env[k]; !ok && !notPersisted[k] {
			if !validName(k) {
				return false
			}
			b.WriteString("\\unset " + k + "\n")
		}
	}
	for k, v := range env {
		if old, ok := have[k]; ok && old == v {
			continue
		}
		if !validName(k) {
			return false
		}
		b.WriteString("\\export " + k + "=" + shellQuote(v) + "\n")
	}
	if cwd != haveDir {
		b.WriteString("\\cd -- " + shellQuote(cwd) + " || exit 1\n")
	}
	return true
}

// shellState is what the exit trap reported.
type shellState struct {
	status int
	cwd    string
	env    map[string]string
}

// parseState splits the trap's output into exit status, cwd and exported
// variables.
func parseState(b []byte) (shellState, bool) {
	var f [stateFields]string
	for i := range f {
		j := bytes.IndexByte(b, 0)
		if j < 0 {
			return shellState{}, false
		}
		f[i], b = string(b[:j]), b[j+1:]
	}
	rc, err := strconv.Atoi(f[0])
	if err != nil || rc < 0 || rc > 255 {
		return shellState{}, false
	}
	return shellState{status: rc, cwd: f[1], env: parseExports(f[2])}, true
}
