package confinetest

import (
	"fmt"
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The IPC objects that outlive their process: helpers for programs the
// tests run inside sandboxes (internal/runtime/container/testdata/ipc and
// test/e2e/probe).

// TestQueue is the POSIX message queue MakeIPC makes.
const TestQueue = "warren-test"

// MakeIPC makes one SysV shared memory segment, message queue and
// semaphore set, and the POSIX message queue TestQueue, in the caller's
// IPC namespace.
func MakeIPC() error {
	if _, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600); err != nil {
		return fmt.Errorf("shmget: %w", err)
	}
	if _, _, e := unix.Syscall(unix.SYS_MSGGET, unix.IPC_PRIVATE, unix.IPC_CREAT|0o600, 0); e != 0 {
		return fmt.Errorf("msgget: %w", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_SEMGET, unix.IPC_PRIVATE, 1, unix.IPC_CREAT|0o600); e != 0 {
		return fmt.Errorf("semget: %w", e)
	}
	name, _ := unix.BytePtrFromString(TestQueue)
	fd, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)), unix.O_CREAT|unix.O_RDWR, 0o600, 0, 0, 0)
	if e != 0 {
		return fmt.Errorf("mq_open: %w", e)
	}
	unix.Close(int(fd))
	return nil
}

// CountIPC reports the SysV objects of each kind the caller's IPC
// namespace holds and whether TestQueue exists: "shm=N msg=N sem=N mq=0|1".
func CountIPC() (string, error) {
	var b strings.Builder
	for _, k := range []string{"shm", "msg", "sem"} {
		data, err := os.ReadFile("/proc/sysvipc/" + k)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%s=%d ", k, len(strings.Split(strings.TrimSpace(string(data)), "\n"))-1)
	}
	name, _ := unix.BytePtrFromString(TestQueue)
	fd, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(name)), unix.O_RDONLY, 0, 0, 0, 0)
	switch e {
	case 0:
		unix.Close(int(fd))
		b.WriteString("mq=1")
	case unix.ENOENT:
		b.WriteString("mq=0")
	default:
		return "", fmt.Errorf("mq_open: %w", e)
	}
	return b.String(), nil
}
