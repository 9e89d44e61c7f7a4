package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"syscall"

	"golang.org/x/sys/unix"
)

// closedFD marks a child descriptor slot that is closed.
const closedFD = ^uintptr(0)

// forkExec starts one process in its own process group, registered with the
// reaper. files are the child's descriptors 0..n (closedFD = closed).
func (a *Agent) forkExec(path string, argv []string, env map[string]string, dir string, cred *credential, files []uintptr) (int, <-chan exitInfo, error) {
	return a.spawnFork(forkFunc(path, argv, env, dir, cred, files))
}

// forkFunc is the fork and exec of one process in its own process group.
func forkFunc(path string, argv []string, env map[string]string, dir string, cred *credential, files []uintptr) func() (int, error) {
	sys := &syscall.SysProcAttr{Setpgid: true}
	if cred != nil {
		sys.Credential = &syscall.Credential{Uid: cred.uid, Gid: cred.gid, Groups: cred.groups}
	}
	attr := &syscall.ProcAttr{Dir: dir, Env: envList(env), Files: files, Sys: sys}
	return func() (int, error) { return syscall.ForkExec(path, argv, attr) }
}

// spawnFork runs fork (on the spawner thread when confined), registers the
// child with the reaper and moves it into the sandbox's work cgroup. It
// waits while a trusted command runs (the gate: isolate.go).
func (a *Agent) spawnFork(fork func() (int, error)) (int, <-chan exitInfo, error) {
	a.gate.RLock()
	defer a.gate.RUnlock()
	pid, exit, err := a.spawnUngated(fork)
	if errors.Is(err, syscall.EAGAIN) && a.reapSessions() {
		// At the pids limit: idle session shells may hold zombies.
		pid, exit, err = a.spawnUngated(fork)
	}
	if err != nil || a.split == nil {
		return pid, exit, err
	}
	if err := a.split.moveToWork(pid); err != nil {
		_ = unix.Kill(pid, unix.SIGKILL) // never a sandbox process outside work
		return 0, nil, fmt.Errorf("move into the work cgroup: %w", err)
	}
	return pid, exit, nil
}

// spawnUngated is spawnFork without the gate and the move.
func (a *Agent) spawnUngated(fork func() (int, error)) (int, <-chan exitInfo, error) {
	if a.spawner != nil {
		return a.reaper.spawn(func() (int, error) { return a.spawner.run(fork) })
	}
	return a.reaper.spawn(fork)
}

// spawner runs forks on one dedicated OS thread. Capability bounding sets
// are per thread and a child inherits the forking thread's, so only this
// thread needs its bounding set cut.
type spawner struct {
	reqs chan spawnReq
}

type spawnReq struct {
	fork func() (int, error)
	res  chan spawnRes
}

type spawnRes struct {
	pid int
	err error
}

// startSpawner starts the thread and runs prepare on it first.
func startSpawner(prepare func() error) (*spawner, error) {
	s := &spawner{reqs: make(chan spawnReq)}
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread must not run other goroutines, and it
		// is never handed back to the scheduler with its changed state.
		runtime.LockOSThread()
		if err := prepare(); err != nil {
			errc <- err
			return
		}
		errc <- nil
		for r := range s.reqs {
			pid, err := r.fork()
			r.res <- spawnRes{pid, err}
		}
	}()
	if err := <-errc; err != nil {
		return nil, err
	}
	return s, nil
}

// joinCgroups moves the calling thread alone into each cgroup (v1)
// directory of dirs ("0" in a tasks file is the writing thread).
func joinCgroups(dirs []string) error {
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "tasks"), []byte("0"), 0); err != nil {
			return fmt.Errorf("join cgroup %s: %w", d, err)
		}
	}
	return nil
}

func (s *spawner) run(fork func() (int, error)) (int, error) {
	res := make(chan spawnRes, 1)
	s.reqs <- spawnReq{fork: fork, res: res}
	r := <-res
	return r.pid, r.err
}

func envList(env map[string]string) []string {
	l := make([]string, 0, len(env))
	for k, v := range env {
		l = append(l, k+"="+v)
	}
	sort.Strings(l)
	return l
}

// pipe returns a close-on-exec pipe.
func pipe() (r, w int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return -1, -1, err
	}
	return p[0], p[1], nil
}

// pollFile wraps fd as a non-blocking, poller-backed file.
func pollFile(fd int, name string) *os.File {
	_ = unix.SetNonblock(fd, true)
	return os.NewFile(uintptr(fd), name)
}

func closeAll(fds ...int) {
	for _, fd := range fds {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// shellProc is a shell process (possibly pre-started) waiting for its script
// on fd 3; it reports its state on fd 4.
type shellProc struct {
	pid     int
	exit    <-chan exitInfo
	spawned map[string]string // its environment
	dir     string
	cred    *credential
	stdin   *os.File // write end; the child's fd 0
	script  int      // write end (blocking); the child's fd 3; -1 in -c mode
	stdout  *os.File
	stderr  *os.File
	state   *os.File
}

func (s *shellProc) release() {
	if s.script >= 0 {
		unix.Close(s.script)
		s.script = -1
	}
	for _, f := range []*os.File{s.stdin, s.stdout, s.stderr, s.state} {
		if f != nil {
			f.Close()
		}
	}
}

// spawnShell starts the session shell. With script == "" it reads its script
// from a pipe (". /proc/self/fd/3"), so it can be started ahead of time;
// otherwise the script is passed with -c.
func (a *Agent) spawnShell(shell string, env map[string]string, dir string, cred *credential, script string) (*shellProc, error) {
	var fds []int
	fail := func(err error) (*shellProc, error) {
		closeAll(fds...)
		return nil, err
	}
	mk := func() (int, int, error) {
		r, w, err := pipe()
		if err == nil {
			fds = append(fds, r, w)
		}
		return r, w, err
	}
	inR, inW, err := mk()
	if err != nil {
		return fail(err)
	}
	outR, outW, err := mk()
	if err != nil {
		return fail(err)
	}
	errR, errW, err := mk()
	if err != nil {
		return fail(err)
	}
	stR, stW, err := mk()
	if err != nil {
		return fail(err)
	}
	scR, scW := -1, -1
	argv := []string{shell, "-c", script}
	if script == "" {
		if scR, scW, err = mk(); err != nil {
			return fail(err)
		}
		argv = []string{shell, "-c", ". /proc/self/fd/3"}
		if cred != nil {
			// Re-opening a pipe through /proc checks the pipe inode's
			// owner: give it to the user the shell runs as.
			if err := unix.Fchown(scR, int(cred.uid), int(cred.gid)); err != nil {
				return fail(err)
			}
		}
	}
	child := []uintptr{uintptr(inR), uintptr(outW), uintptr(errW), closedFD, uintptr(stW)}
	if scR >= 0 {
		child[3] = uintptr(scR)
	}
	pid, exit, err := a.forkExec(shell, argv, env, dir, cred, child)
	if err != nil {
		return fail(err)
	}
	closeAll(inR, outW, errW, stW, scR)
	return &shellProc{
		pid: pid, exit: exit, spawned: env, dir: dir, cred: cred,
		stdin:  pollFile(inW, "stdin"),
		script: scW,
		stdout: pollFile(outR, "stdout"),
		stderr: pollFile(errR, "stderr"),
		state:  pollFile(stR, "state"),
	}, nil
}

// writeAll writes b to a blocking fd.
func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}
