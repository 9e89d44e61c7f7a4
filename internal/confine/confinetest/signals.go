package confinetest

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The ways a process of a sandbox can send a signal to PID 1 (the agent):
// programs run inside sandboxes by the tests use SendSignal.

// SignalMethods names the ways SendSignal knows.
var SignalMethods = []string{"kill", "sigqueue", "tgsigqueue", "pidfd", "fsetsig"}

// siginfo is the head of the kernel's siginfo_t for SI_QUEUE (128 bytes).
type siginfo struct {
	signo, errno, code int32
	_                  int32
	pid, uid           uint32
	value              uint64
	_                  [128 - 32]byte
}

// siQueue is the si_code of sigqueue(3): not SI_USER, so a Go program
// would take a queued SIGSEGV for a fault of its own.
const siQueue = -1

// SendSignal sends sig to pid by method:
//   - kill: kill(2) (si_code SI_USER);
//   - sigqueue, tgsigqueue: rt_sigqueueinfo / rt_tgsigqueueinfo with
//     si_code SI_QUEUE;
//   - pidfd: pidfd_send_signal with an SI_QUEUE siginfo;
//   - fsetsig: a pipe whose owner is pid and whose F_SETSIG is sig, then
//     written to (si_code POLL_IN, a positive code like a fault's).
func SendSignal(method string, pid, sig int) error {
	info := siginfo{signo: int32(sig), code: siQueue, pid: uint32(unix.Getpid())}
	p := uintptr(unsafe.Pointer(&info))
	switch method {
	case "kill":
		return unix.Kill(pid, unix.Signal(sig))
	case "sigqueue":
		return errno(unix.Syscall(unix.SYS_RT_SIGQUEUEINFO, uintptr(pid), uintptr(sig), p))
	case "tgsigqueue":
		return errno(unix.Syscall6(unix.SYS_RT_TGSIGQUEUEINFO, uintptr(pid), uintptr(pid), uintptr(sig), p, 0, 0))
	case "pidfd":
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			return fmt.Errorf("pidfd_open: %w", err)
		}
		defer unix.Close(fd)
		return errno(unix.Syscall6(unix.SYS_PIDFD_SEND_SIGNAL, uintptr(fd), uintptr(sig), p, 0, 0, 0))
	case "fsetsig":
		return fsetsig(pid, sig)
	}
	return fmt.Errorf("unknown method %q", method)
}

func fsetsig(pid, sig int) error {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_NONBLOCK); err != nil {
		return err
	}
	defer unix.Close(fds[0])
	defer unix.Close(fds[1])
	if _, err := unix.FcntlInt(uintptr(fds[0]), unix.F_SETOWN, pid); err != nil {
		return fmt.Errorf("F_SETOWN: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fds[0]), unix.F_SETSIG, sig); err != nil {
		return fmt.Errorf("F_SETSIG: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fds[0]), unix.F_SETFL, unix.O_ASYNC|unix.O_NONBLOCK); err != nil {
		return fmt.Errorf("F_SETFL: %w", err)
	}
	_, err := unix.Write(fds[1], []byte("x"))
	return err
}

func errno(_, _ uintptr, e unix.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}
