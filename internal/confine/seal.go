package confine

import (
	"fmt"
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
// another uid, and the exec sets the fsuid back to the euid. Changing the
// fsuid away from 0 drops the thread's filesystem capabilities; they are
// raised again meanwhile (from the permitted set), so the exec's access
// checks are root's, as without the seal. A child that changes its uid
// before the exec (a Credential) ends up dumpable: the exec then changes
// no uid. fs.suid_dumpable must be 0, its default.
func SealedFork(fork func() (int, error)) func() (int, error) {
	return func() (int, error) {
		// setfsuid and capset are per thread: fork from the thread that
		// changed them.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var saved, caps [2]unix.CapUserData
		if err := unix.Capget(&hdr, &saved[0]); err != nil {
			return 0, fmt.Errorf("confine: capget: %w", err)
		}
		const nobody = 65534
		old, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, nobody, 0, 0)
		defer func() {
			unix.RawSyscall(unix.SYS_SETFSUID, old, 0, 0)
			_ = unix.Capset(&hdr, &saved[0])
		}()
		caps = saved
		for i := range caps {
			caps[i].Effective = saved[i].Effective | saved[i].Permitted&fsCapMask[i]
		}
		if err := unix.Capset(&hdr, &caps[0]); err != nil {
			return 0, fmt.Errorf("confine: raise filesystem capabilities: %w", err)
		}
		return fork()
	}
}

// fsCapMask is the kernel's CAP_FS_MASK (the capabilities a change of
// fsuid away from 0 drops) in capset's two 32-bit words.
var fsCapMask = [2]uint32{
	1<<unix.CAP_CHOWN | 1<<unix.CAP_DAC_OVERRIDE | 1<<unix.CAP_DAC_READ_SEARCH |
		1<<unix.CAP_FOWNER | 1<<unix.CAP_FSETID | 1<<unix.CAP_LINUX_IMMUTABLE | 1<<unix.CAP_MKNOD,
	1 << (unix.CAP_MAC_OVERRIDE - 32),
}
