package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/warrenhq/warren/internal/agentproto"
)

// The trust split (issue 13): a sandbox's cgroup in the cgroup v2 hierarchy
// holds the agent (and trusted commands), and its child agentproto.CgroupWork
// every other process of the sandbox. The agent freezes work
// (cgroup.freeze) while a trusted command runs, so nothing the sandbox
// started runs beside it (internal/agent/isolate.go). The v2 freezer is used
// on hybrid hosts too, on their unified mount, which needs no controller
// for it: unlike v1's it lets a frozen process die of SIGKILL, and it
// freezes whole processes, never a thread of the agent.

// makeSplit creates dir (with its parents when parents) and its child.
func makeSplit(dir string, parents bool) error {
	mk := os.Mkdir
	if parents {
		mk = os.MkdirAll
	}
	if err := mk(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("container: create cgroup %s: %w", dir, err)
	}
	if err := os.Mkdir(filepath.Join(dir, agentproto.CgroupWork), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("container: create cgroup %s/%s: %w", dir, agentproto.CgroupWork, err)
	}
	return nil
}

// splitDirs are the split's directories that exist, children first.
func splitDirs(dir string) []string {
	var out []string
	for _, d := range []string{filepath.Join(dir, agentproto.CgroupWork), dir} {
		if _, err := os.Stat(d); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// removeSplit removes the split's (empty) directories.
func removeSplit(dir string) error {
	for _, d := range splitDirs(dir) {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("container: delete cgroup %s: %w", d, err)
		}
	}
	return nil
}

// splitFiles opens the trust split's files for the agent (its descriptors
// from 4 on, the first named in its environment); none when the host has no
// cgroup v2 hierarchy. The edge opens them, not the agent: they carry the
// edge's credentials and cgroup namespace, whatever the agent's are.
func (r *Runtime) splitFiles(cgPath string) ([]*os.File, []string, error) {
	u := r.cg.unified(cgPath)
	if u == "" {
		return nil, []string{}, nil
	}
	var fs []*os.File
	for _, c := range agentproto.CgroupFiles {
		flag := os.O_RDONLY
		if c.Write {
			flag = os.O_WRONLY
		}
		f, err := os.OpenFile(filepath.Join(u, c.Name), flag, 0)
		if errors.Is(err, os.ErrNotExist) && c.Name != "cgroup.procs" {
			// A kernel without the v2 freezer (before 5.2): the sandbox
			// runs, but its agent refuses trusted commands.
			closeFiles(fs)
			r.log.Warn("container: no cgroup v2 freezer: trusted commands are refused", "err", err)
			return nil, []string{}, nil
		}
		if err != nil {
			closeFiles(fs)
			return nil, nil, fmt.Errorf("container: open cgroup file: %w", err)
		}
		fs = append(fs, f)
	}
	const first = agentListenFD + 1
	return fs, []string{agentproto.CgroupFDEnv + "=" + strconv.Itoa(first)}, nil
}

// agentListenFD is the agent's listening socket (agent.ListenFD).
const agentListenFD = 3

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}
