package agent

import (
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPendingWhileReadHeld: output the reader took from the pipe but has
// not delivered yet is pending, however long the reader is held between
// its read and the delivery (a loaded machine deschedules it there). Before
// the fix, pending said no in that window, finish detached the stream and
// the output was lost: a run of "echo 133" answered with empty stdout.
func TestPendingWhileReadHeld(t *testing.T) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	w := os.NewFile(uintptr(fds[1]), "w")
	defer w.Close()
	inRead, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	readHook = func() {
		once.Do(func() {
			close(inRead)
			<-release
		})
	}
	defer func() { readHook = nil }()
	var mu sync.Mutex
	var got []byte
	o := newOutStream("stdout", pollFile(fds[0], "r"), 1<<20, func(_ string, b []byte) {
		mu.Lock()
		got = append(got, b...)
		mu.Unlock()
	}, true)
	if _, err := w.Write([]byte("133\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-inRead:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader never read")
	}
	if !o.pending() {
		t.Error("output read from the pipe but not delivered is not pending")
	}
	close(release)
	w.Close()
	<-o.done
	o.detach()
	mu.Lock()
	defer mu.Unlock()
	if string(got) != "133\n" {
		t.Errorf("delivered %q", got)
	}
}
