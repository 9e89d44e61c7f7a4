package container

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"

	"github.com/warrenhq/warren/internal/runtime"
)

// OOMKills implements runtime.KillCounter: the OOM kills in the sandbox's
// memory cgroup (v1: memory.oom_control's oom_kill; v2: memory.events').
func (r *Runtime) OOMKills(h runtime.Handle) (int64, error) {
	return r.killCounter(h, "memory", "memory.oom_control", "memory.events", "oom_kill")
}

// PidsRefused implements runtime.KillCounter: the forks and threads the
// sandbox's pids limit refused (pids.events' max).
func (r *Runtime) PidsRefused(h runtime.Handle) (int64, error) {
	return r.killCounter(h, "pids", "pids.events", "pids.events", "max")
}

// killCounter reads key of the flat-keyed file v1file in the v1 hierarchy of
// controller, or of v2file in the unified hierarchy. In v1 it adds the
// box's (cgroups.go), where the sandbox's processes are limited: a v1
// cgroup counts only its own events, not its children's.
func (r *Runtime) killCounter(h runtime.Handle, controller, v1file, v2file, key string) (int64, error) {
	if h.Cgroup == "" {
		h.Cgroup = r.cgroupPath(h.ID)
	}
	var path, box string
	switch d := r.cg.(type) {
	case *v1Driver:
		for _, hi := range d.hierarchies {
			if hi.controller == controller {
				path = filepath.Join(hi.mount, h.Cgroup, v1file)
				box = filepath.Join(hi.mount, h.Cgroup, boxName, v1file)
				break
			}
		}
	case *v2Driver:
		path = filepath.Join(d.mount, h.Cgroup, v2file)
	}
	if path == "" {
		return 0, errors.New("container: no " + controller + " cgroup")
	}
	n, err := readCounter(path, key)
	if errors.Is(err, os.ErrNotExist) {
		return 0, runtime.ErrGone
	} else if err != nil || box == "" {
		return n, err
	}
	m, err := readCounter(box, key)
	if errors.Is(err, os.ErrNotExist) { // a container made before the box
		return n, nil
	}
	return n + m, err
}

// readCounter reads key of the flat-keyed file path.
func readCounter(path, key string) (int64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := bytes.Cut(sc.Bytes(), []byte{' '})
		if ok && string(k) == key {
			return strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		}
	}
	return 0, errors.New("container: no " + key + " in " + path)
}
