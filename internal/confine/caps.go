package confine

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// SandboxCaps is the capability set the agent keeps (and so every command it
// starts as root): Docker's default set.
var SandboxCaps = []uint{
	unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FSETID, unix.CAP_FOWNER,
	unix.CAP_MKNOD, unix.CAP_NET_RAW, unix.CAP_SETGID, unix.CAP_SETUID,
	unix.CAP_SETFCAP, unix.CAP_SETPCAP, unix.CAP_NET_BIND_SERVICE,
	unix.CAP_SYS_CHROOT, unix.CAP_KILL, unix.CAP_AUDIT_WRITE,
}

// SandboxCapMask is SandboxCaps as a bit mask (the CapEff line of
// /proc/<pid>/status).
func SandboxCapMask() uint64 {
	var m uint64
	for _, c := range SandboxCaps {
		m |= 1 << c
	}
	return m
}

// The capset arguments live in package variables: AllThreadsSyscall takes
// uintptrs, and globals never move.
var (
	capHdr  unix.CapUserHeader
	capData [2]unix.CapUserData
)

// dropPrivileges shrinks the permitted, effective and inheritable sets to
// SandboxCaps on every thread (one stop-the-world AllThreadsSyscall round,
// the only one Enter makes), clears the calling thread's ambient set and
// sets its no_new_privs, and makes the process non-dumpable.
//
// Ambient capabilities matter only at execve, and the capset already
// removes from them everything outside SandboxCaps; the edge never sets any,
// and the thread that forks sandbox processes clears its own (see
// DropBoundingSet). no_new_privs reaches every other thread through the
// seccomp filter's TSYNC, which copies the caller's no_new_privs to each
// thread it synchronises (installSeccomp runs right after this).
func dropPrivileges() error {
	keep := SandboxCapMask()
	capHdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	for i := range capData {
		v := uint32(keep >> (32 * i))
		capData[i] = unix.CapUserData{Effective: v, Permitted: v, Inheritable: v}
	}
	_, _, e := syscall.AllThreadsSyscall(syscall.SYS_CAPSET,
		uintptr(unsafe.Pointer(&capHdr)), uintptr(unsafe.Pointer(&capData[0])), 0)
	if e == syscall.ENOTSUP {
		return errors.New("confine: AllThreadsSyscall unsupported: build the agent with CGO_ENABLED=0")
	}
	if e != 0 {
		return fmt.Errorf("confine: capset: %w", e)
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: clear ambient capabilities: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: set no_new_privs: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: clear dumpable: %w", err)
	}
	return nil
}

// DropBoundingSet removes every capability outside SandboxCaps from the
// bounding set of the CALLING THREAD only, and clears its ambient set. Both
// matter only at execve, and both are inherited from the thread that forks:
// the agent forks every sandbox process from one dedicated, locked thread
// that has called this, which costs ~30 cheap prctl calls instead of ~30
// stop-the-world AllThreadsSyscall rounds. (no_new_privs, set on all
// threads, already stops an exec from gaining capabilities; this is defence
// in depth.)
func DropBoundingSet() error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("confine: clear ambient capabilities: %w", err)
	}
	keep := SandboxCapMask()
	for c := 0; c < 64; c++ {
		if keep&(1<<uint(c)) != 0 {
			continue
		}
		err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0)
		if err == unix.EINVAL { // past the kernel's last capability
			break
		}
		if err != nil {
			return fmt.Errorf("confine: drop capability %d from bounding set: %w", c, err)
		}
	}
	return nil
}
