package agent

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

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
	if os.Getpid() != 1 {
		// Killing "every other process" outside a pid namespace of our
		// own would reach the host's.
		return nil, errf(agentproto.ErrInvalid, "reset: the agent is not the init of a pid namespace")
	}
	res := &agentproto.ResetResult{}
	if a.pool != nil {
		a.pool.invalidate()
	}
	// 1. Every process but ourselves (and the idle zygote, checked after).
	deadline := time.Now().Add(resetWait)
	if zygote := a.idleZygote(); zygote > 0 {
		killed, err := killAllBut(ctx, deadline, zygote)
		if err != nil {
			return nil, errf(agentproto.ErrInternal, "reset: %v", err)
		}
		res.Killed = killed
		a.checkZygoteAfterReset()
	} else {
		killed, err := killAllAsInit(ctx, deadline)
		if err != nil {
			return nil, errf(agentproto.ErrInternal, "reset: %v", err)
		}
		if killed {
			res.Killed = 1
		}
	}
	if a.pool != nil {
		a.pool.invalidate() // shells spawned while we were killing
	}
	// 2. The agent's own memory of past commands and sessions.
	a.sessions.clear()
	a.procs.clear()
	a.tars.clear()
	// 3. Files: the stateless dirs, the message queues and what the
	// commands' FIFO directory holds.
	for _, d := range append(append([]string{}, dirs...), "/dev/shm", confine.MqueueDir, a.live.dir) {
		res.Removed += emptyDir(d)
	}
	// 4. SysV IPC objects of the sandbox's IPC namespace.
	removeSysVIPC()
	// 5. The zygote, or else warm shells, again (the old ones were killed
	// above).
	if a.zygoteUsable() {
		a.mu.Lock()
		start := a.zyg.ls == nil && !a.zyg.busy && !a.zyg.off
		a.mu.Unlock()
		if start {
			ls, err := a.startZygote()
			if err != nil {
				a.log.Warn("agent: zygote", "err", err)
			}
			if ls != nil {
				a.putZygote(ls)
			}
		}
	}
	if a.pool != nil && a.idleZygote() == 0 {
		a.pool.refill()
	}
	return res, nil
}

// killAllBut kills every process of the agent's pid namespace but the
// agent and keep, and waits until none is left (zombies aside: the reaper
// collects them). Each round kills what /proc lists, so a process forked
// during a round dies in the next. It reports how many were killed.
func killAllBut(ctx context.Context, deadline time.Time, keep int) (int, error) {
	killed := 0
	for {
		n := 0
		for _, p := range otherPids() {
			if p != keep {
				_ = unix.Kill(p, unix.SIGKILL)
				n++
			}
		}
		if n == 0 {
			return killed, nil
		}
		killed += n
		if time.Now().After(deadline) || ctx.Err() != nil {
			return killed, fmt.Errorf("processes survive: %v", otherPids())
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// beginReset marks a reset pending, so that requests arriving from now on
// wait for it (the edge sends the next one as soon as it has the answer),
// and returns the function that runs it.
func (a *Agent) beginReset(ctx context.Context) func() {
	done := make(chan struct{})
	a.mu.Lock()
	a.resetDone = done
	a.mu.Unlock()
	return func() {
		_, err := a.reset(ctx)
		a.mu.Lock()
		if err != nil && a.resetErr == nil {
			a.resetErr = err
			a.log.Error("agent: reset after exec failed", "err", err)
		}
		a.mu.Unlock()
		close(done)
	}
}

// waitReset waits for a pending reset; after a failed one the sandbox
// serves nothing more.
func (a *Agent) waitReset(ctx context.Context) error {
	a.mu.Lock()
	done := a.resetDone
	a.mu.Unlock()
	if done != nil {
		select {
		case <-done:
		case <-ctx.Done():
			return errf(agentproto.ErrUnusable, "the connection ended during a reset")
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.resetErr != nil {
		return errf(agentproto.ErrUnusable, "a reset failed: %v", a.resetErr)
	}
	return nil
}

// killAllAsInit kills every other process of the agent's pid namespace,
// whose init it is, and waits until none is left. kill(-1) from PID 1
// signals every process of the namespace but PID 1; each one that dies is,
// or its orphans become, a child of init, so once the agent has no child
// at all (alive or zombie: waitid says ECHILD) the namespace holds only
// the agent. Repeating the kill catches a fork that raced it. killed says
// whether anything was there.
func killAllAsInit(ctx context.Context, deadline time.Time) (killed bool, err error) {
	for {
		if unix.Kill(-1, unix.SIGKILL) == nil {
			killed = true
		}
		var info unix.Siginfo
		// WNOWAIT: only look; the reaper collects the statuses.
		err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
		switch {
		case err == unix.ECHILD:
			return killed, nil
		case err != nil && err != unix.EINTR:
			return killed, fmt.Errorf("waitid: %w", err)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return killed, fmt.Errorf("processes survive: %v", otherPids())
		}
		time.Sleep(100 * time.Microsecond)
	}
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
		f := statFields(e.Name())
		// A zombie is gone already (the reaper collects it).
		if len(f) == 0 || f[0] == "Z" {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// statFields reads /proc/<pid>/stat and returns its fields after the
// command name (which may hold spaces and parentheses): f[0] is the state,
// field 3 of the line, and f[i] is field i+3. nil when it cannot be read.
func statFields(pid string) []string {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// emptyDir removes everything inside d (not d itself) and reports how many
// entries were there.
func emptyDir(d string) int {
	// A file system holding one inode holds only its root: the stateless
	// directories are tmpfs mounts, and most tasks leave nothing in most of
	// them. (Elsewhere the count covers far more than d: it is read.)
	var st unix.Statfs_t
	if unix.Statfs(d, &st) == nil && st.Files > 0 && st.Files-st.Ffree <= 1 {
		return 0
	}
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
// semaphore set listed in /proc/sysvipc. The kernel's counts (SHM_INFO,
// MSG_INFO, SEM_INFO) are asked first: when nothing exists, as after most
// tasks, no file is read.
func removeSysVIPC() {
	for _, kind := range []string{"shm", "msg", "sem"} {
		if n, err := sysvCount(kind); err == nil && n == 0 {
			continue
		}
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

// SHM_INFO, MSG_INFO and SEM_INFO (linux/shm.h, msg.h, sem.h).
const (
	shmInfo = 14
	msgInfo = 12
	semInfo = 19
)

// sysvCount is how many SysV IPC objects of kind exist in the namespace:
// struct shm_info's used_ids, struct msginfo's msgpool (the number of
// queues, for MSG_INFO) and struct seminfo's semusz (the number of sets,
// for SEM_INFO), all int fields of a buffer large enough for each struct.
func sysvCount(kind string) (int32, error) {
	var buf [64]int32
	p := uintptr(unsafe.Pointer(&buf[0]))
	var errno syscall.Errno
	switch kind {
	case "shm":
		_, _, errno = unix.Syscall(unix.SYS_SHMCTL, 0, shmInfo, p)
		return buf[0], errnoErr(errno)
	case "msg":
		_, _, errno = unix.Syscall(unix.SYS_MSGCTL, 0, msgInfo, p)
		return buf[0], errnoErr(errno)
	default:
		_, _, errno = unix.Syscall6(unix.SYS_SEMCTL, 0, 0, semInfo, p, 0, 0)
		return buf[7], errnoErr(errno)
	}
}

func errnoErr(e syscall.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

// closeAll forgets every session and ends their idle live shells (whose
// processes a wipe has killed already).
func (s *sessions) closeAll(a *Agent) {
	s.mu.Lock()
	m := s.m
	s.m = make(map[string]*session)
	s.mu.Unlock()
	for _, ss := range m {
		ss.mu.Lock()
		ls := ss.live
		ss.live = nil
		ss.mu.Unlock()
		if ls != nil {
			ls.close(a)
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
