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
//  3. fork/exec the agent with the listener as fd 3, an empty environment and
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
//  4. a goroutine reaps the agent (cmd.Wait); the edge's copy of the listener
//     is closed, so the agent's death resets the connection.
//  5. OpSetup: the agent runs confine.Enter (overlay, pivot_root, /proc,
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
// Destroy kills the agent (only when the pid's start time still matches:
// killing PID 1 of a pid namespace kills the namespace), then freezes the
// cgroup, SIGKILLs whatever is left, thaws it, waits until it is empty and
// deletes it. The overlay mount lives only in the sandbox's mount namespace
// and disappears with it.
package container
