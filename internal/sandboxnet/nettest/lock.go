package nettest

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// lockPath serialises fake internets across test processes: their
// addresses and the host's routes to them are the same in every one, so
// two at once collide ("file exists"). Packages run in parallel (go test
// -p) and several checkouts' tests share the machine.
const lockPath = "/tmp/warren-nettest-internet.lock"

// lockWait bounds the wait for another process's fake internet.
const lockWait = 10 * time.Minute

// lockInternet holds lockPath until the test ends.
func lockInternet(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("fake internet lock: %v", err)
	}
	deadline := time.Now().Add(lockWait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if err != syscall.EWOULDBLOCK || time.Now().After(deadline) {
			f.Close()
			t.Fatalf("fake internet lock %s (another test process's fake internet is up): %v", lockPath, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the lock, after the cleanups registered later
}
