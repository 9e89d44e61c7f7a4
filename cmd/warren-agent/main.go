// Command warren-agent is PID 1 inside a warren sandbox. The edge starts it
// with fd 3 a listening unix socket; see internal/agent. In a microVM the
// kernel starts it as /init and it serves on a virtio-serial port; in a VM
// booted from a disk image, systemd starts it with --vm-service PORT.
package main

import (
	"os"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agent"
)

// init names the process (package init runs on the main thread, whose
// name is the process's): started from a descriptor (/proc/self/fd/N, user
// namespaces), the kernel named it "N", and its /proc files belong to host
// root, so /proc/self/comm cannot be written.
func init() {
	name := []byte("warren-agent\x00")
	_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&name[0])), 0, 0, 0)
}

func main() {
	if agent.IsVMInit() {
		agent.VMMain() // PID 1 of a microVM (internal/runtime/microvm)
	}
	if len(os.Args) == 3 && os.Args[1] == agent.VMServiceFlag {
		agent.VMServiceMain(os.Args[2]) // a service of a disk image's own init (internal/runtime/vm)
	}
	agent.Main()
}
