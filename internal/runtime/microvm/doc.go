// Package microvm implements the "microvm" tier: a sandbox is a QEMU
// microVM (-M microvm; KVM when a guest really runs with it, else TCG)
// whose PID 1 is warren-agent, serving the same agent protocol as a
// container's agent over a virtio-serial port that QEMU backs with a Unix
// socket (these hosts have no vhost-vsock).
//
// # Start sequence (Start)
//
//  1. Map each layer directory of the spec to its EROFS file in the store
//     (Config.LayerFile); make the writable disk: a sparse file of DiskMB
//     beside the overlay work directory, mkfs.ext4 without a journal
//     (~30 ms), linked from the state directory as "disk".
//  2. Create the VM's cgroup (<CgroupParent>/<id>; v1 memory, cpu, pids or
//     v2) with a memory limit of the guest's memory + 256 MiB.
//  3. Start QEMU (-name warren-vm:<CgroupParent>/<id>, its own seccomp
//     filter, the layers as read-only virtio-blk disks with serials
//     layer0…, the writable disk "rw", a virtio-serial port "warren.agent"
//     on StateDir/agent.sock, QMP on StateDir/qmp.sock, a free-page-
//     reporting balloon, the serial console to StateDir/console.log) and
//     move it into the cgroup. Runtime.spawn (spawn.go) starts every QEMU
//     confined: the disks passed as fd sets, chrooted into an empty
//     directory and dropped to a uid of its own without capabilities.
//  4. The guest kernel runs /init of the initramfs (BuildInitramfs: the
//     agent and the kernel's modules, cached by content): agent.VMMain
//     loads the modules, mounts the layers and the disk, stacks the
//     overlay, switches root, opens the port exclusively and unlinks its
//     node.
//  5. Dial the socket (as soon as QEMU made it) and send setup; Start
//     returns when the agent answers. Under TCG here: 1.7–5 s depending on
//     the host's load (docs/BENCHMARKS.md).
//
// Most VMs skip 3 and 4: they restore the memory template of their shape
// instead of booting (template.go), and their agent assembles the root at
// setup.
//
// Destroy kills QEMU (pid checked against its start time, or found by
// its -name), waits, and removes the disk, the memory snapshot, the
// sockets and the cgroup. Leftovers finds this runtime's QEMUs by name in
// /proc and its cgroups without one.
//
// Freeze and Thaw are QMP stop and cont. Reclaim and Restore make pause a
// memory snapshot (snapshot.go). Fork starts VMs from a memory snapshot of a
// running one, sharing its memory copy-on-write (fork.go).
package microvm
