// Command ipc makes IPC objects that outlive their process inside a
// sandbox (make), or reports which exist (count). Built static by the
// container tests and run inside sandboxes.
package main

import (
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

const mqName = "warren-test"

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: ipc make|count")
		os.Exit(2)
	}
	name, _ := unix.BytePtrFromString(mqName)
	switch os.Args[1] {
	case "make":
		if _, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600); err != nil {
			fail("shmget", err)
		}
		if _, _, e := unix.Syscall(unix.SYS_MSGGET, unix.IPC_PRIVATE, unix.IPC_CREAT|0o600, 0); e != 0 {
			fail("msgget", e)
		}
		if _, _, e := unix.Syscall(unix.SYS_SEMGET, unix.IPC_PRIVATE, 1, unix.IPC_CREAT|0o600); e != 0 {
			fail("semget", e)
		}
		if _, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)), unix.O_CREAT|unix.O_RDWR, 0o600, 0, 0, 0); e != 0 {
			fail("mq_open", e)
		}
		fmt.Println("made")
	case "count":
		for _, k := range []string{"shm", "msg", "sem"} {
			b, err := os.ReadFile("/proc/sysvipc/" + k)
			if err != nil {
				fail(k, err)
			}
			fmt.Printf("%s=%d ", k, len(strings.Split(strings.TrimSpace(string(b)), "\n"))-1)
		}
		fd, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)), unix.O_RDONLY, 0, 0, 0, 0)
		switch e {
		case 0:
			unix.Close(int(fd))
			fmt.Println("mq=1")
		case unix.ENOENT:
			fmt.Println("mq=0")
		default:
			fail("mq_open", e)
		}
	}
}

func fail(what string, err error) {
	fmt.Fprintln(os.Stderr, what+":", err)
	os.Exit(1)
}
