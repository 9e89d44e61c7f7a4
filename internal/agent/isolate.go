package agent

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/confine"
)

// Isolation of trusted commands (issue 13). The edge splits the sandbox's
// cgroup in the cgroup v2 hierarchy (internal/runtime/container/split.go):
// the agent lives in the sandbox's cgroup, every process it starts for the
// sandbox is moved into its child work/ right after the fork (so all their
// descendants are born there), and a trusted command stays beside the
// agent. (clone3's CLONE_INTO_CGROUP would avoid the move, but the seccomp
// profile refuses clone3: its flags cannot be filtered.) For a trusted
// command's whole duration the agent:
//
//  1. holds the spawn gate (a.gate) for writing, so it starts no ordinary
//     process meanwhile and none is between its fork and its move;
//  2. moves into work/ any process still beside it (the children an
//     ordinary process forked before its own move), then freezes work/ and
//     waits until the kernel reports it frozen: every process the sandbox
//     started, and any it forks while the freeze is under way, is stopped
//     before the trusted process exists;
//  3. starts the trusted process with fresh pipes as its stdio, non-dumpable
//     when it runs as the agent's own user (confine.SealedFork);
//  4. when it has ended: kills every process beside the agent (what the
//     trusted command left behind), thaws work/ and releases the gate, also
//     when it failed or timed out, and whether or not the edge's
//     connection is still there.
//
// Lock order: a.gate before anything the spawn path locks (reaper.mu).

// freezeWait bounds the wait for work/ to be frozen (a task in
// uninterruptible sleep delays it); past it the trusted command is refused.
const freezeWait = 10 * time.Second

// killWait bounds the wait for a trusted command's leftovers to die.
const killWait = 2 * time.Second

// trustSplit holds the descriptors of the split's files the edge passed
// (agentproto.CgroupFiles, in that order).
type trustSplit struct {
	procs     int // the sandbox's cgroup.procs (the agent's own)
	workProcs int // work/cgroup.procs
	freeze    int // work/cgroup.freeze
	events    int // work/cgroup.events
}

// inheritedSplit takes the split's descriptors the edge passed (the first
// named by agentproto.CgroupFDEnv), made close-on-exec; nil without them.
func inheritedSplit() (*trustSplit, error) {
	v := os.Getenv(agentproto.CgroupFDEnv)
	os.Unsetenv(agentproto.CgroupFDEnv)
	if v == "" {
		return nil, nil
	}
	first, err := strconv.Atoi(v)
	if err != nil || first <= ListenFD {
		return nil, fmt.Errorf("bad %s=%q", agentproto.CgroupFDEnv, v)
	}
	fds := make([]int, len(agentproto.CgroupFiles))
	for i := range fds {
		fds[i] = first + i
		if _, err := unix.FcntlInt(uintptr(fds[i]), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
			return nil, fmt.Errorf("cgroup descriptor %d: %w", fds[i], err)
		}
	}
	return &trustSplit{procs: fds[0], workProcs: fds[1], freeze: fds[2], events: fds[3]}, nil
}

// moveToWork moves process pid into work/.
func (s *trustSplit) moveToWork(pid int) error {
	err := writeAll(s.workProcs, []byte(strconv.Itoa(pid)))
	if err == unix.ESRCH {
		return nil // gone already (and so are its children: they were reaped or moved)
	}
	return err
}

// beside lists the processes in the agent's own cgroup other than the agent.
func (s *trustSplit) beside() ([]int, error) {
	b := make([]byte, 64<<10)
	n, err := unix.Pread(s.procs, b, 0)
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var pids []int
	for _, f := range strings.Fields(string(b[:n])) {
		if pid, err := strconv.Atoi(f); err == nil && pid != self && pid != 0 {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// eventsHas reports whether the cgroup.events file behind fd has line.
func eventsHas(fd int, line string) (bool, error) {
	b := make([]byte, 256)
	n, err := unix.Pread(fd, b, 0)
	if err != nil {
		return false, err
	}
	return strings.Contains("\n"+string(b[:n]), "\n"+line+"\n"), nil
}

// waitEvents waits until fd's cgroup.events has line, for up to d.
// cgroup.events signals a change with POLLPRI, but the kernel holds a
// notification back for up to 10 ms after the previous one (a freeze
// right after a thaw): the file is read again every eventsPoll as well.
func waitEvents(fd int, line string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		ok, err := eventsHas(fd, line)
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %q after %v", line, d)
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}}
		ts := unix.NsecToTimespec(int64(eventsPoll))
		_, _ = unix.Ppoll(fds, &ts, nil)
	}
}

// eventsPoll is how often waitEvents reads cgroup.events.
const eventsPoll = 200 * time.Microsecond

// isolate prepares a trusted command: the gate taken, work/ frozen. The
// returned release undoes both (and kills the command's leftovers); it
// must be called once the command has ended. Without a split (an
// unconfined agent: tests), only the gate is taken.
func (a *Agent) isolate() (release func(), err error) {
	a.gate.Lock()
	s := a.split
	if s == nil {
		return a.gate.Unlock, nil
	}
	thaw := func() {
		if err := writeAll(s.freeze, []byte("0")); err != nil {
			a.log.Error("agent: thaw the sandbox", "err", err)
		}
	}
	fail := func(err error) (func(), error) {
		thaw()
		a.gate.Unlock()
		return nil, errf(agentproto.ErrInternal, "exec: trusted: isolate: %v", err)
	}
	if err := s.sweep(); err != nil {
		return fail(err)
	}
	if err := writeAll(s.freeze, []byte("1")); err != nil {
		return fail(err)
	}
	if err := waitEvents(s.events, "frozen 1", freezeWait); err != nil {
		return fail(err)
	}
	// Nothing can have come back: moving out of work/ needs the cgroupfs.
	if left, err := s.beside(); err != nil || len(left) > 0 {
		return fail(fmt.Errorf("processes %v beside the agent (%v)", left, err))
	}
	return func() {
		a.killBeside(s)
		thaw()
		a.gate.Unlock()
	}, nil
}

// sweep moves every process beside the agent into work/, until none is
// left (one may fork while it is being moved).
func (s *trustSplit) sweep() error {
	for range 1000 {
		pids, err := s.beside()
		if err != nil || len(pids) == 0 {
			return err
		}
		for _, pid := range pids {
			if err := s.moveToWork(pid); err != nil {
				return fmt.Errorf("move %d into %s: %w", pid, agentproto.CgroupWork, err)
			}
		}
	}
	return errors.New("processes keep appearing beside the agent")
}

// killBeside kills what a trusted command left behind (every process
// beside the agent) and waits, bounded, until none is left: nothing
// outside work/ may run once the sandbox is thawed.
func (a *Agent) killBeside(s *trustSplit) {
	deadline := time.Now().Add(killWait)
	for {
		pids, err := s.beside()
		if err != nil {
			a.log.Error("agent: a trusted command's leftovers", "err", err)
			return
		}
		if len(pids) == 0 {
			return
		}
		if time.Now().After(deadline) {
			a.log.Error("agent: a trusted command's leftovers outlived SIGKILL", "pids", pids)
			return
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		time.Sleep(time.Millisecond)
	}
}

// forkTrusted starts a trusted command's process beside the agent (the caller
// holds the gate). Run as the agent's own user (root), it is
// non-dumpable (confine.SealedFork); a Credential's setuid would undo that.
func (a *Agent) forkTrusted(path string, argv []string, env map[string]string, dir string, cred *credential, files []uintptr) (int, <-chan exitInfo, error) {
	fork := forkFunc(path, argv, env, dir, cred, files)
	if cred == nil {
		fork = confine.SealedFork(fork)
	}
	return a.spawnUngated(fork)
}
