// Package confine locks warren-agent into its sandbox.
//
// Enter runs inside the agent, which the edge started as PID 1 in new user,
// pid, mount, uts, ipc, net and cgroup namespaces (as root of its user
// namespace, an unprivileged range of host ids: idmap.go; or as host root
// where the operator allowed it), already inside its cgroups, with every
// capability in its namespaces, still seeing the host's root filesystem.
// In order it:
//
//  1. makes every mount rprivate and mounts the overlay root (nodev) at
//     cfg.RootDir; the overlay exists only in the sandbox's mount namespace.
//     In a user namespace the edge has mounted the root (MountRoot) and the
//     agent inherited it (cfg.RootFD): it is attached on "/" instead, and
//     /proc and /sys are mounted in it before the pivot;
//  2. takes detached copies of the host's null, zero, full, random, urandom
//     and tty nodes (open_tree), then pivots into the new root
//     (pivot_root(".", ".") and a lazy unmount of the old root, so no
//     directory is left behind and nothing of the host stays reachable);
//  3. mounts a fresh /proc, a read-only /sys, a small nodev tmpfs /dev holding
//     only the six nodes (read-only bind mounts of the host nodes: a chmod or
//     chown of one would change the host's), devpts, /dev/shm and
//     the usual symlinks, then masks the dangerous parts of /proc and /sys;
//  4. sets the hostname and brings up loopback in the (empty) net namespace;
//  5. drops capabilities to Docker's default set on every thread, clears the
//     ambient set, sets no_new_privs and marks the process non-dumpable;
//  6. installs the seccomp filter (profile.go) on every thread (TSYNC, which
//     also gives every thread the caller's no_new_privs).
//
// Every mount that could hold a device node the sandbox creates itself (the
// root overlay, /dev, /dev/shm) is nodev, so CAP_MKNOD cannot open host disks.
//
// Capabilities and seccomp are per thread; Enter uses syscall.AllThreadsSyscall,
// which only works in a binary built with CGO_ENABLED=0.
package confine

import (
	"errors"
	"runtime"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
)

// DefaultShmMB sizes /dev/shm when the config says 0.
const DefaultShmMB = 64

// ShmMBFor sizes /dev/shm for a sandbox whose memory limit is memoryMB
// (0: none): half the limit, as the kernel sizes a tmpfs by default to
// half the RAM, so that shared memory alone never fills the sandbox's
// memory cgroup, where its pages are charged but belong to no process the
// OOM killer could end (it would pick the agent instead).
func ShmMBFor(memoryMB int64) int64 {
	if memoryMB <= 0 {
		return DefaultShmMB
	}
	return max(1, memoryMB/2)
}

// Enter confines the calling process as described in the package doc. On
// error the process is in an undefined, partly confined state and should
// exit.
func Enter(cfg *agentproto.SetupConfig) error {
	if cfg == nil {
		return errors.New("confine: nil config")
	}
	if cfg.RootDir == "" || len(cfg.Lowers) == 0 {
		return errors.New("confine: RootDir and at least one lower layer are required")
	}
	// Mount and namespace operations act on the calling thread's fs state
	// (cwd, root). Go threads share it (CLONE_FS), but keep the whole
	// sequence on one thread anyway.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	steps := []struct {
		name string
		fn   func() error
	}{
		{"root", func() error { return setupRoot(cfg) }},
		{"host", func() error { return setupHost(cfg.Hostname) }},
		{"privileges", dropPrivileges},
		{"seccomp", installSeccomp},
	}
	for _, s := range steps {
		t0 := time.Now()
		if err := s.fn(); err != nil {
			return err
		}
		if Trace != nil {
			Trace(s.name, time.Since(t0))
		}
	}
	return nil
}

// Trace, when set, is told how long each step of Enter took (for tests and
// benchmarks).
var Trace func(step string, took time.Duration)
