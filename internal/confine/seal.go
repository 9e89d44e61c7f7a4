package confine

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// SealedFork wraps fork (a fork and exec, without a credential change, on
// the calling goroutine's thread) so that the program it starts is not
// dumpable: its /proc/<pid>/mem, fd/, environ and the like then need
// CAP_SYS_PTRACE, which no sandbox process has, even as the same uid. A
// program cannot clear its own dumpable flag, and an exec sets it again;
// but the kernel clears it when an exec changes the filesystem uid
// (commit_creds). So the fork is made while the forking thread's fsuid is
// another uid (which only drops that thread's filesystem capabilities
// meanwhile), and the exec sets the fsuid back to the euid. A child that
// changes its uid before the exec (a Credential) ends up dumpable: the exec
// then changes no uid. fs.suid_dumpable must be 0, its default.
func SealedFork(fork func() (int, error)) func() (int, error) {
	return func() (int, error) {
		// setfsuid is per thread: fork from the thread that changed it.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		const nobody = 65534
		old, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, nobody, 0, 0)
		pid, err := fork()
		unix.RawSyscall(unix.SYS_SETFSUID, old, 0, 0)
		return pid, err
	}
}
