package confine

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
	"time"

	"github.com/warrenhq/warren/internal/confine/confinetest"
)

// runProbes checks the confinement from inside the sandbox (as its root).
func runProbes(in *childInput) []probeResult {
	var out []probeResult
	add := func(name string, err error) {
		r := probeResult{Name: name, OK: err == nil}
		if err != nil {
			r.Detail = err.Error()
		}
		out = append(out, r)
	}

	add("exec", func() error {
		b, err := exec.Command("/bin/sh", "-c", "echo hi").Output()
		if err != nil || string(b) != "hi\n" {
			return fmt.Errorf("sh: %q %v", b, err)
		}
		return nil
	}())
	add("mount-syscall", wantErrno(unix.Mount("tmpfs", "/mnt", "tmpfs", 0, ""), unix.EPERM))
	add("mount-command", func() error {
		b, err := exec.Command("/bin/mount", "-t", "tmpfs", "none", "/mnt").CombinedOutput()
		if err == nil {
			return fmt.Errorf("mount succeeded: %s", b)
		}
		return nil
	}())
	add("kcore", readsNothing("/proc/kcore"))
	add("kpagecgroup", readsNothing("/proc/kpagecgroup"))
	add("proc-sys-readonly", wantErrno(os.WriteFile("/proc/sys/kernel/hostname", []byte("x"), 0), unix.EROFS))
	add("dev-entries", func() error {
		ents, err := os.ReadDir("/dev")
		if err != nil {
			return err
		}
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		want := []string{"fd", "full", "null", "ptmx", "pts", "random", "shm", "stderr", "stdin", "stdout", "tty", "urandom", "zero"}
		if !slices.Equal(names, want) {
			return fmt.Errorf("/dev holds %v, want %v", names, want)
		}
		return nil
	}())
	add("dev-nodes-readonly", func() error {
		// The nodes are bind mounts of the host's: a change to one would be
		// a change to the host's (the test restores /dev/full if so).
		if err := os.Chmod("/dev/full", 0o600); err == nil {
			return errors.New("chmod /dev/full succeeded")
		}
		if err := os.Chown("/dev/full", 1, 1); err == nil {
			return errors.New("chown /dev/full succeeded")
		}
		old := time.Unix(1, 0)
		if err := os.Chtimes("/dev/full", old, old); err == nil {
			return errors.New("utimes /dev/full succeeded")
		}
		if err := os.WriteFile("/dev/null", []byte("x"), 0); err != nil {
			return fmt.Errorf("write /dev/null: %w", err)
		}
		return nil
	}())
	add("dev-null-works", func() error {
		if err := os.WriteFile("/dev/null", []byte("x"), 0); err != nil {
			return err
		}
		f, err := os.Open("/dev/zero")
		if err != nil {
			return err
		}
		defer f.Close()
		b := make([]byte, 4)
		if _, err := io.ReadFull(f, b); err != nil || string(b) != "\x00\x00\x00\x00" {
			return fmt.Errorf("/dev/zero: %q %v", b, err)
		}
		return nil
	}())
	add("shm", func() error {
		var st unix.Statfs_t
		if err := unix.Statfs("/dev/shm", &st); err != nil {
			return err
		}
		if st.Type != unix.TMPFS_MAGIC || st.Blocks*uint64(st.Bsize) != 16<<20 {
			return fmt.Errorf("/dev/shm type %#x size %d", st.Type, st.Blocks*uint64(st.Bsize))
		}
		return os.WriteFile("/dev/shm/x", []byte("x"), 0o600)
	}())

	// ioctls.
	a, aerr := os.Create("/tmp/a")
	b, berr := os.Create("/tmp/b")
	if aerr != nil || berr != nil {
		add("ioctl-setup", errors.Join(aerr, berr))
	} else {
		a.WriteString("data")
		rng := unix.FileCloneRange{Src_fd: int64(a.Fd()), Src_length: 4}
		add("ioctl-ficlone", wantErrno(ioctl(b.Fd(), unix.FICLONE, a.Fd()), unix.EPERM))
		add("ioctl-ficlonerange", wantErrno(ioctl(b.Fd(), unix.FICLONERANGE, uintptr(unsafe.Pointer(&rng))), unix.EPERM))
		add("ioctl-dedupe-sign-extended", wantErrno(ioctl(b.Fd(), 0xffffffff00000000|uintptr(uint32(unix.FIDEDUPERANGE)), 0), unix.EPERM))
		add("ioctl-high-bits", wantErrno(ioctl(b.Fd(), 1<<32|unix.FICLONE, a.Fd()), unix.EPERM))
		add("ioctl-swapext", wantErrno(ioctl(b.Fd(), uintptr(xfsIocSwapext), 0), unix.EPERM))
		add("ioctl-move-ext", wantErrno(ioctl(b.Fd(), uintptr(ext4IocMoveExt), 0), unix.EPERM))
		add("ioctl-benign", func() error {
			// FIONREAD (TIOCINQ) works; TCGETS on a file is ENOTTY from the kernel.
			n, err := unix.IoctlGetInt(int(a.Fd()), unix.TIOCINQ)
			if err != nil {
				return fmt.Errorf("TIOCINQ: %d %w", n, err)
			}
			return wantErrno(ioctl(a.Fd(), unix.TCGETS, 0), unix.ENOTTY)
		}())
		a.Close()
		b.Close()
	}
	add("ioctl-tiocsti", func() error {
		ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("open ptmx: %w", err)
		}
		defer ptmx.Close()
		c := byte('x')
		return wantErrno(ioctl(ptmx.Fd(), unix.TIOCSTI, uintptr(unsafe.Pointer(&c))), unix.EPERM)
	}())

	// Syscalls the profile refuses.
	add("bpf", wantErrno(sys(unix.SYS_BPF, 0, 0, 0), unix.EPERM))
	add("perf_event_open", wantErrno(sys(unix.SYS_PERF_EVENT_OPEN, 0, 0, 0), unix.EPERM))
	add("userfaultfd", wantErrno(sys(unix.SYS_USERFAULTFD, 0, 0, 0), unix.EPERM))
	add("keyctl", wantErrno(sys(unix.SYS_KEYCTL, 0, 0, 0), unix.EPERM))
	add("add_key", wantErrno(sys(unix.SYS_ADD_KEY, 0, 0, 0), unix.EPERM))
	add("unshare-newns", wantErrno(unix.Unshare(unix.CLONE_NEWNS), unix.EPERM))
	add("unshare-newuser", wantErrno(unix.Unshare(unix.CLONE_NEWUSER), unix.EPERM))
	add("unshare-nothing", unix.Unshare(0)) // unshare without namespace flags stays allowed
	add("setns", wantErrno(sys(unix.SYS_SETNS, 0, 0, 0), unix.EPERM))
	add("clone-newns", func() error {
		r, _, e := unix.RawSyscall6(unix.SYS_CLONE, unix.CLONE_NEWNS|uintptr(unix.SIGCHLD), 0, 0, 0, 0, 0)
		if e == 0 && r == 0 { // the filter failed and this is the child
			unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
		}
		if e == 0 {
			return fmt.Errorf("clone(CLONE_NEWNS) made pid %d", r)
		}
		return wantErrno(e, unix.EPERM)
	}())
	add("clone3", wantErrno(sys(unix.SYS_CLONE3, 0, 0, 0), unix.ENOSYS))
	add("ptrace", wantErrno(sys(unix.SYS_PTRACE, unix.PTRACE_ATTACH, 4000000, 0), unix.EPERM)) // ESRCH without the filter
	add("process_vm_readv", wantErrno(sys(unix.SYS_PROCESS_VM_READV, 1, 0, 0), unix.EPERM))
	add("open_by_handle_at", wantErrno(sys(unix.SYS_OPEN_BY_HANDLE_AT, 0, 0, 0), unix.EPERM))
	add("reboot", wantErrno(sys(unix.SYS_REBOOT, 0, 0, 0), unix.EPERM))
	add("swapon", wantErrno(sys(unix.SYS_SWAPON, 0, 0, 0), unix.EPERM))
	add("init_module", wantErrno(sys(unix.SYS_INIT_MODULE, 0, 0, 0), unix.EPERM))
	add("kexec_load", wantErrno(sys(unix.SYS_KEXEC_LOAD, 0, 0, 0), unix.EPERM))
	add("open_tree", wantErrno(sys(unix.SYS_OPEN_TREE, ^uintptr(99), 0, 0), unix.EPERM))
	add("fsopen", wantErrno(sys(unix.SYS_FSOPEN, 0, 0, 0), unix.EPERM))
	add("socket-vsock", wantErrno(sys(unix.SYS_SOCKET, unix.AF_VSOCK, unix.SOCK_STREAM, 0), unix.EPERM))
	add("socket-inet", func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
		if err == nil {
			unix.Close(fd)
		}
		return err
	}())

	// Privileges.
	mask := SandboxCapMask()
	add("caps-all-threads", func() error {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return err
		}
		if len(tasks) < 2 {
			return fmt.Errorf("only %d threads: the check proves nothing", len(tasks))
		}
		for _, task := range tasks {
			// The bounding set is dropped only on the thread that forks
			// (DropBoundingSet); every other set must hold on every thread.
			if err := checkStatus(filepath.Join("/proc/self/task", task.Name(), "status"), mask, "CapBnd"); err != nil {
				return fmt.Errorf("thread %s: %w", task.Name(), err)
			}
		}
		return nil
	}())
	add("caps-child", func() error {
		// Fork from a thread that dropped its bounding set, as the agent's
		// spawner thread does.
		runtime.LockOSThread()
		if err := DropBoundingSet(); err != nil {
			return err
		}
		b, err := exec.Command("/bin/cat", "/proc/self/status").Output()
		if err != nil {
			return err
		}
		f := filepath.Join("/tmp", "child-status")
		if err := os.WriteFile(f, b, 0o600); err != nil {
			return err
		}
		return checkStatus(f, mask)
	}())
	add("dumpable", func() error {
		v, err := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
		if err != nil || v != 0 {
			return fmt.Errorf("dumpable %d %v", v, err)
		}
		return nil
	}())

	// The host is out of reach.
	add("host-marker", func() error {
		if _, err := os.Stat(in.HostMarker); !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("host file %s reachable: %v", in.HostMarker, err)
		}
		return nil
	}())
	add("root-dotdot", func() error {
		var root, up unix.Stat_t
		if err := unix.Stat("/", &root); err != nil {
			return err
		}
		if err := unix.Stat("/../../..", &up); err != nil {
			return err
		}
		if root.Ino != up.Ino || root.Dev != up.Dev {
			return errors.New("/.. leaves the root")
		}
		return nil
	}())
	add("mountinfo", checkMountinfo())
	add("hostname", func() error {
		h, err := os.Hostname()
		if err != nil || h != in.Setup.Hostname {
			return fmt.Errorf("hostname %q %v", h, err)
		}
		return nil
	}())
	add("loopback", func() error {
		b, err := os.ReadFile("/sys/class/net/lo/flags")
		if err != nil {
			return err
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 0, 32)
		if err != nil || v&unix.IFF_UP == 0 {
			return fmt.Errorf("lo flags %q", b)
		}
		return nil
	}())
	add("mknod-nodev", func() error {
		// CAP_MKNOD may make a node, but no writable mount honours it.
		if err := unix.Mknod("/tmp/mem", unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
			return fmt.Errorf("mknod: %w", err)
		}
		_, err := os.Open("/tmp/mem")
		return wantErrno(err, unix.EACCES)
	}())
	add("upper-write", os.WriteFile("/tmp/written", []byte("inside"), 0o644))
	add("shm-past-size", shmPastSize(in.Setup.ShmMB))
	add("signals-to-pid1", signalsToPID1())
	add("forged-signals-to-pid1", forgedSignalsToPID1())
	// Another process's memory and streams (issue 13): a sandbox process
	// may open neither /proc/<pid>/mem (read-write) nor /proc/<pid>/fd/1 of
	// the agent (PID 1 here) or of a process started sealed (as trusted
	// commands are), though it runs as the same uid; it can those of an
	// ordinary sibling (the control: that is what the freeze is for).
	add("proc-mem-fd-pid1", wantUnreachable(1))
	add("proc-mem-fd-sealed", func() error {
		sealed, err := startSleeper(true)
		if err != nil {
			return err
		}
		defer sealed.stop()
		plain, err := startSleeper(false)
		if err != nil {
			return err
		}
		defer plain.stop()
		if got := reachable(plain.pid); got != "mem fd1 " {
			return fmt.Errorf("control: a dumpable sibling's mem and fd/1 not reachable (%q): the probe is broken", got)
		}
		return wantUnreachable(sealed.pid)
	}())
	return out
}

// sleeper is a process started for the /proc probes, its stdout a pipe.
type sleeper struct {
	pid int
	out *os.File
}

func (s *sleeper) stop() {
	unix.Kill(s.pid, unix.SIGKILL)
	var ws unix.WaitStatus
	unix.Wait4(s.pid, &ws, 0, nil)
	s.out.Close()
}

// startSleeper starts a sleep, sealed (SealedFork) or not.
func startSleeper(sealed bool) (*sleeper, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer w.Close()
	attr := &syscall.ProcAttr{Env: []string{"PATH=/bin"}, Files: []uintptr{0, w.Fd(), 2}}
	fork := func() (int, error) { return syscall.ForkExec("/bin/sleep", []string{"sleep", "30"}, attr) }
	if sealed {
		fork = SealedFork(fork)
	}
	pid, err := fork()
	if err != nil {
		r.Close()
		return nil, err
	}
	return &sleeper{pid: pid, out: r}, nil
}

// reachable tries, from a sandbox shell, to open pid's /proc/<pid>/mem
// read-write and /proc/<pid>/fd/1 for writing; it reports what opened.
func reachable(pid int) string {
	p := strconv.Itoa(pid)
	script := "(exec 3<>/proc/" + p + "/mem) 2>/dev/null && printf 'mem '; " +
		"(exec 3>/proc/" + p + "/fd/1) 2>/dev/null && printf 'fd1 '; true"
	b, err := exec.Command("/bin/sh", "-c", script).Output()
	if err != nil {
		return "error: " + err.Error()
	}
	return string(b)
}

func wantUnreachable(pid int) error {
	if got := reachable(pid); got != "" {
		return fmt.Errorf("a sandbox process opened pid %d's %q", pid, got)
	}
	return nil
}

// shmPastSize fills /dev/shm past its size: the write stops there.
func shmPastSize(mb int64) error {
	f, err := os.Create("/dev/shm/fill")
	if err != nil {
		return err
	}
	defer os.Remove("/dev/shm/fill")
	defer f.Close()
	buf := make([]byte, 1<<20)
	for i := int64(0); i <= mb; i++ {
		if _, err := f.Write(buf); err != nil {
			if i < mb-1 {
				return fmt.Errorf("stopped after %d of %d MiB: %w", i, mb, err)
			}
			return wantErrno(err, unix.ENOSPC)
		}
	}
	return fmt.Errorf("wrote %d MiB into a /dev/shm of %d", mb+1, mb)
}

// signalsToPID1 sends every signal number to PID 1 (this process, which
// handles FatalSignals as the agent does) from a process of the sandbox:
// it must survive them all.
func signalsToPID1() error {
	if os.Getpid() != 1 {
		return fmt.Errorf("the probe is pid %d, not PID 1", os.Getpid())
	}
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, FatalSignals...)
	for sig := 1; sig <= 64; sig++ {
		if out, err := exec.Command("/bin/sh", "-c", "kill -"+strconv.Itoa(sig)+" 1").CombinedOutput(); err != nil && sig != 9 && sig != 19 {
			return fmt.Errorf("kill -%d 1: %v %s", sig, err, out)
		}
	}
	return nil
}

// forgedSignalsToPID1: the signals a Go PID 1 takes for its own faults
// cannot be sent with a siginfo of the sender's choice.
func forgedSignalsToPID1() error {
	for _, m := range confinetest.SignalMethods {
		if m == "kill" {
			continue
		}
		for _, sig := range syncSignals {
			if err := wantErrno(confinetest.SendSignal(m, 1, int(sig)), unix.EPERM); err != nil {
				return fmt.Errorf("%s of signal %d: %w", m, sig, err)
			}
		}
	}
	return nil
}

func ioctl(fd, req, arg uintptr) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, fd, req, arg)
	if e != 0 {
		return e
	}
	return nil
}

func sys(nr, a1, a2, a3 uintptr) error {
	r, _, e := unix.Syscall(nr, a1, a2, a3)
	if e != 0 {
		return e
	}
	if nr == unix.SYS_SOCKET || nr == unix.SYS_USERFAULTFD || nr == unix.SYS_FSOPEN || nr == unix.SYS_OPEN_TREE {
		unix.Close(int(r))
	}
	return nil
}

func wantErrno(err error, want syscall.Errno) error {
	if !errors.Is(err, want) {
		return fmt.Errorf("got %v, want %v", err, want)
	}
	return nil
}

func readsNothing(p string) error {
	if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
		return nil // the kernel lacks it: nothing to hide
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if len(b) != 0 {
		return fmt.Errorf("%s gave %d bytes", p, len(b))
	}
	return nil
}

func checkStatus(path string, mask uint64, skip ...string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	want := map[string]string{
		"CapInh":     fmt.Sprintf("%016x", mask),
		"CapPrm":     fmt.Sprintf("%016x", mask),
		"CapEff":     fmt.Sprintf("%016x", mask),
		"CapBnd":     fmt.Sprintf("%016x", mask),
		"CapAmb":     fmt.Sprintf("%016x", 0),
		"NoNewPrivs": "1",
		"Seccomp":    "2",
	}
	for _, k := range skip {
		delete(want, k)
	}
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if w, found := want[k]; ok && found {
			if strings.TrimSpace(v) != w {
				return fmt.Errorf("%s = %s, want %s", k, strings.TrimSpace(v), w)
			}
			delete(want, k)
		}
	}
	if len(want) > 0 {
		return fmt.Errorf("missing status lines %v", want)
	}
	return s.Err()
}

// checkMountinfo accepts only the mounts Enter makes.
func checkMountinfo() error {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	allowed := []string{"/", "/proc", "/sys", "/dev", "/dev/pts", "/dev/shm"}
	for _, n := range devNodes {
		allowed = append(allowed, "/dev/"+n)
	}
	for _, p := range slices.Concat(maskedFiles, maskedDirs, readonlyDirs) {
		allowed = append(allowed, p)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			return fmt.Errorf("bad mountinfo line %q", line)
		}
		if !slices.Contains(allowed, f[4]) {
			return fmt.Errorf("unexpected mount %q", line)
		}
		if f[4] == "/" && !strings.Contains(line, " - overlay ") {
			return fmt.Errorf("root is not the overlay: %q", line)
		}
	}
	return nil
}
