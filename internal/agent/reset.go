package agent

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/confine"
)

// resetWait bounds how long a reset waits for every process to be gone.
const resetWait = 5 * time.Second

// reset returns a stateless sandbox to the state it had after setup. The
// caller (the edge's FnCall tier) sends no other request meanwhile.
func (a *Agent) reset(ctx context.Context) (any, error) {
	a.mu.Lock()
	dirs := a.cfg.Stateless
	a.mu.Unlock()
	if len(dirs) == 0 {
		return nil, errf(agentproto.ErrInvalid, "reset: the sandbox is not stateless")
	}
	res := &agentproto.ResetResult{}
	if a.pool != nil {
		a.pool.invalidate()
	}
	// 1. Every process but ourselves. kill(-1) from PID 1 signals every
	// process of the pid namespace except PID 1; repeat until none is
	// left, so a fork racing the signal is caught by the next round.
	deadline := time.Now().Add(resetWait)
	for {
		pids := otherPids()
		if len(pids) == 0 {
			break
		}
		if res.Killed == 0 {
			res.Killed = len(pids)
		}
		if os.Getpid() == 1 {
			_ = unix.Kill(-1, unix.SIGKILL)
		} else {
			for _, p := range pids {
				_ = unix.Kill(p, unix.SIGKILL)
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, errf(agentproto.ErrInternal, "reset: processes survive: %v", pids)
		}
		time.Sleep(200 * time.Microsecond)
	}
	if a.pool != nil {
		a.pool.invalidate() // shells spawned while we were killing
	}
	// 2. The agent's own memory of past commands and sessions.
	a.sessions.clear()
	a.procs.clear()
	a.tars.clear()
	// 3. Files: the stateless dirs and the message queues.
	for _, d := range append(append([]string{}, dirs...), "/dev/shm", confine.MqueueDir) {
		res.Removed += emptyDir(d)
	}
	// 4. SysV IPC objects of the sandbox's IPC namespace.
	removeSysVIPC()
	// 5. Warm shells again (the old ones were killed above).
	if a.pool != nil {
		a.pool.refill()
	}
	return res, nil
}

// otherPids lists the live processes of the pid namespace other than the
// agent (from the sandbox's /proc).
func otherPids() []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// A zombie is gone already (the reaper collects it).
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && b[i+2] == 'Z' {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// emptyDir removes everything inside d (not d itself) and reports how many
// entries were there.
func emptyDir(d string) int {
	ents, err := os.ReadDir(d)
	if err != nil {
		return 0
	}
	for _, e := range ents {
		p := filepath.Join(d, e.Name())
		_ = makeRemovable(p)
		_ = os.RemoveAll(p)
	}
	return len(ents)
}

// makeRemovable clears the immutable/append-only attributes a task may not
// set anyway (no CAP_LINUX_IMMUTABLE), and gives directories write
// permission back so RemoveAll can descend (root without DAC_OVERRIDE).
func makeRemovable(p string) error {
	return filepath.Walk(p, func(q string, fi os.FileInfo, err error) error {
		if err == nil && fi.IsDir() {
			_ = os.Chmod(q, 0o700)
		}
		return nil
	})
}

// removeSysVIPC removes every SysV shared memory segment, message queue and
// semaphore set listed in /proc/sysvipc.
func removeSysVIPC() {
	for _, kind := range []string{"shm", "msg", "sem"} {
		b, err := os.ReadFile("/proc/sysvipc/" + kind)
		if err != nil {
			continue
		}
		lines := strings.Split(string(b), "\n")
		for _, l := range lines[1:] {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			id, err := strconv.Atoi(f[1])
			if err != nil {
				continue
			}
			switch kind {
			case "shm":
				_, _ = unix.SysvShmCtl(id, unix.IPC_RMID, nil)
			case "msg":
				_, _, _ = unix.Syscall(unix.SYS_MSGCTL, uintptr(id), unix.IPC_RMID, 0)
			case "sem":
				_, _, _ = unix.Syscall6(unix.SYS_SEMCTL, uintptr(id), 0, unix.IPC_RMID, 0, 0, 0)
			}
		}
	}
}

func (s *sessions) clear() {
	s.mu.Lock()
	s.m = make(map[string]*session)
	s.mu.Unlock()
}

func (t *procTable) clear() {
	t.mu.Lock()
	t.m = make(map[string]*bgProc)
	t.doneIDs, t.doneBytes = nil, 0
	t.mu.Unlock()
}

func (t *tarPuts) clear() {
	t.mu.Lock()
	t.m = make(map[string]*tarPut)
	t.mu.Unlock()
}
