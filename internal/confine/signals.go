package confine

import (
	"os"
	"syscall"
)

// FatalSignals are the signals that end a Go program that does not handle
// them: the terminal ones, and those the runtime takes for a fault or a
// request for a stack dump. The kernel protects a pid namespace's init
// only from signals it has no handler for, and the Go runtime installs
// handlers for all of these, so the agent (PID 1) must handle them
// (signal.Notify) to survive a process of the sandbox that sends them.
// With a handler, the runtime still turns a real fault (a kernel si_code)
// into a crash, while one sent by kill or tgkill (SI_USER, SI_TKILL) goes
// to the channel. Forged si_codes of the fault signals (sigqueue,
// pidfd_send_signal, F_SETSIG) are refused by the seccomp profile
// (syncSignals).
var FatalSignals = []os.Signal{
	syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT, syscall.SIGABRT,
	syscall.SIGILL, syscall.SIGTRAP, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGSEGV,
	syscall.SIGSTKFLT, syscall.SIGSYS,
}
