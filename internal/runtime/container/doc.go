// Package container implements the "container" tier: a sandbox is
// warren-agent running as PID 1 of new pid, mount, uts, ipc, net and cgroup
// namespaces, inside its own cgroups, confined by internal/confine on an
// overlay root.
//
// # Start sequence
//
//  1. mkdir StateDir; listen on StateDir/agent.sock (0600) and connect to it
//     right away: the connection waits in the backlog until the agent
//     accepts, so there is no readiness polling. (~0.2–0.5 ms)
//  2. create the cgroups CgroupParent/<id> with containerd/cgroups: on cgroup
//     v1 (legacy or hybrid hosts) in cpu, cpuacct, memory, pids and freezer,
//     with cfs quota (period 100 ms), memory limit (and memsw when the kernel
//     has it), pids.max; on pure v2 the same limits in one cgroup.
//     (~0.3–0.6 ms)
//  3. (user namespaces, the default; see below) allocate the sandbox's id
//     range, give its writable layer's root directory to the range's root,
//     and mount its root detached: the overlay over idmapped copies of the
//     layers, and idmapped copies of the bind sources. (~0.1 ms plus the
//     overlay's own mount, which the agent used to make)
//  4. fork/exec the agent with the listener as fd 3 (the mounts of step 3 as
//     the fds after the trust split's, WARREN_AGENT_KEEP_FDS), an empty environment and
//     stdout/stderr to StateDir/agent.log. It must be in its cgroups before
//     it runs, and its cgroup namespace must be rooted there:
//     - v1: a locked OS thread (never the main thread) writes its tid into
//     each controller's tasks file, forks (Go forks from the calling
//     thread, so the child inherits the thread's cgroups and
//     CLONE_NEWCGROUP roots the namespace there), and writes its tid back
//     into its own cgroups. A thread that cannot be moved back is left
//     locked, so the Go runtime destroys it.
//     - v2: clone3 with CLONE_INTO_CGROUP (SysProcAttr.UseCgroupFD).
//     Cost: fork+exec with new namespaces ~3.5–5 ms, plus, on v1, one RCU
//     grace period (~11 ms on the 2-vCPU test VM) for the first cgroup
//     migration after an idle period (cgroup_threadgroup_rwsem); migrations
//     that follow within a grace period cost ~10 µs each. Hosts that mount
//     cgroups with "favordynmods" avoid that wait; this package does not
//     change host mounts.
//  5. a goroutine reaps the agent (it waits on a pidfd, then wait4; cmd.Wait
//     where pidfds are missing); the edge's copy of the listener
//     is closed, so the agent's death resets the connection.
//  6. OpSetup: the agent runs confine.Enter (overlay, pivot_root, /proc,
//     /sys, /dev, masks, hostname, loopback, capabilities, no_new_privs,
//     seccomp on all threads) and answers. (~5–9 ms: Go start-up of the
//     agent ~1 ms, mounts and pivot 2–4 ms, capability drop on every thread
//     2–3.5 ms because each AllThreadsSyscall stops the world, seccomp
//     0.5 ms)
//
// Measured with BenchmarkStart on the 2-vCPU VM: 15–25 ms per Start, of which
// the v1 grace period and the agent's confinement are most. Any failure
// undoes everything (Destroy: kill, empty and delete the cgroups, remove the
// socket).
//
// # User namespaces
//
// A sandbox's root is not host root: the agent is cloned with CLONE_NEWUSER
// too, and its user namespace maps ids 0..65535 to a range of host ids of
// its own (RangeSize ids from Config.IDBase, DefaultIDBase = 2^20; ranges
// are handed out per sandbox and freed by Destroy; after a crash of the edge
// Leftovers and Attach read each surviving agent's /proc/<pid>/uid_map and
// reserve its range, so the kernel is the record). The other namespaces are
// owned by that user namespace, so the agent keeps what it needs inside
// (mounts in its mount namespace, proc and sysfs, hostname, loopback,
// capabilities within the namespace) and nothing outside. Consequences:
//
//   - Per-user kernel budgets are per sandbox. Pipe buffers
//     (pipe-user-pages-soft) and RLIMIT_NPROC count per host uid; message
//     queue bytes, pending signals and inotify instances count per user
//     namespace and, above it, per owner of the namespace, which is the
//     effective uid of the thread that clones it: the edge clones each
//     sandbox from a thread whose effective uid is the range's first id
//     (startAs; it keeps its capabilities, SECBIT_NO_SETUID_FIXUP, to write
//     the id maps). RLIMIT_NPROC now applies inside (the kernel exempts only
//     host root) and counts the sandbox's own tasks.
//   - Layers stay shared and unmodified: the edge mounts the root itself
//     (confine.MountRoot) and the agent inherits it. Each EROFS layer is
//     copied with open_tree(OPEN_TREE_CLONE) and idmapped (mount_setattr
//     MOUNT_ATTR_IDMAP) through a user namespace with the range's map, kept
//     per range (made once by a child stopped at exec, ~1 ms; freed ranges
//     that have one are reused first, and a few free ranges get one ahead,
//     in the background). On this kernel (6.18) an overlay
//     over idmapped EROFS layers mounts (Linux 5.19+); an overlay mount
//     cannot itself be idmapped (EINVAL), so the writable upper directory
//     is not idmapped: its root is chowned to the range's root and
//     overlayfs gives everything the sandbox creates there the caller's
//     (mapped) ids. The overlay is mounted in the host's user namespace, so
//     overlayfs keeps its trusted.* xattrs (whiteouts, opaque directories)
//     as before. The agent attaches the mount on "/" of its mount namespace,
//     mounts /proc and /sys while the host's are still visible (the kernel
//     mounts a new proc or sysfs in a user namespace only then), and pivots.
//   - Device nodes: mknod is refused in a user namespace; /dev holds
//     read-only bind mounts of the host's nodes, as before.
//   - The agent is exec'd from a sealed, execute-only (0711) memfd copy of
//     its binary through /proc/self/fd/N, N the copy's number in the child
//     (passed as the last extra file, so os/exec's shuffle of descriptors
//     cannot put another file there; the agent closes it first thing, as
//     every inherited descriptor it does not keep): the new user may not
//     search the directories on the way to the real binary, and a binary
//     its user cannot read makes exec tie the agent's memory to the host's
//     user namespace (would_dump), so the agent is not dumpable and its /proc
//     files belong to host root: the sandbox's root cannot list /proc/1/fd,
//     read /proc/1/environ, write /proc/1/oom_score_adj or trace it.
//     open_by_handle_at needs CAP_DAC_READ_SEARCH in the host's namespace
//     (EPERM, besides the seccomp filter).
//   - Recycled containers keep their user namespace and range: Reroot
//     idmaps the new root's layers through the same range's namespace and
//     mounts /dev and /dev/shm (from outside) with the range's root as owner.
//   - Files in a writable layer carry host ids of the range; layers and
//     snapshots packed from it record the ids the sandbox saw
//     (runtime.Handle.IDBase, image.tarChanges).
//   - The cgroups stay host root's: the edge places the agent in them before
//     it runs, and the agent writes no cgroup file.
//
// A kernel that cannot (no user namespaces or no idmapped mounts: New
// probes) makes New fail unless Config.AllowHostRoot (--allow-host-root);
// then sandboxes run as host root and the node's view says so
// (features.sandbox_root "host-root"). Config.HostRoot forces that, for
// measurements. BenchmarkCreateExecStop compares the two.
//
// Destroy kills the agent (only when the pid's start time still matches:
// killing PID 1 of a pid namespace kills the namespace), then freezes the
// cgroup, SIGKILLs whatever is left, thaws it, waits until it is empty and
// deletes it. The overlay mount lives only in the sandbox's mount namespace
// and disappears with it.
package container
