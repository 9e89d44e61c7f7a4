package agent

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestSysvCount: the kernel's counts see an object of each kind appear and
// go (the test runs in the host's IPC namespace and removes what it made).
func TestSysvCount(t *testing.T) {
	before := map[string]int32{}
	for _, k := range []string{"shm", "msg", "sem"} {
		n, err := sysvCount(k)
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		before[k] = n
	}
	shm, err := unix.SysvShmGet(unix.IPC_PRIVATE, 4096, unix.IPC_CREAT|0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.SysvShmCtl(shm, unix.IPC_RMID, nil)
	msg, _, e := unix.Syscall(unix.SYS_MSGGET, unix.IPC_PRIVATE, unix.IPC_CREAT|0o600, 0)
	if e != 0 {
		t.Fatal(e)
	}
	defer unix.Syscall(unix.SYS_MSGCTL, msg, unix.IPC_RMID, 0)
	sem, _, e := unix.Syscall(unix.SYS_SEMGET, unix.IPC_PRIVATE, 1, unix.IPC_CREAT|0o600)
	if e != 0 {
		t.Fatal(e)
	}
	defer unix.Syscall6(unix.SYS_SEMCTL, sem, 0, unix.IPC_RMID, 0, 0, 0)
	for _, k := range []string{"shm", "msg", "sem"} {
		if n, err := sysvCount(k); err != nil || n != before[k]+1 {
			t.Fatalf("%s: %d (%v), want %d", k, n, err, before[k]+1)
		}
	}
}
