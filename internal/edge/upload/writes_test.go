package upload

import (
	"errors"
	"testing"
	"time"
)

// blocked reports whether f is still running after a while.
func blocked(f func()) (done chan struct{}, stuck bool) {
	done = make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
		return done, false
	case <-time.After(50 * time.Millisecond):
		return done, true
	}
}

// TestWritesBounded: at most depth writes run at once and depth+1
// buffers exist; a write's buffer is free again once it ended, and wait
// returns only then.
func TestWritesBounded(t *testing.T) {
	u := newWrites(8, 2)
	bufs := [][]byte{u.buffer(), u.buffer(), u.buffer()}
	for _, b := range bufs {
		if len(b) != 8 {
			t.Fatalf("a buffer of %d bytes, want 8", len(b))
		}
	}
	var fourth []byte
	gotBuf, stuck := blocked(func() { fourth = u.buffer() })
	if !stuck {
		t.Fatal("a fourth buffer with depth 2: want depth+1 at most")
	}
	gate, gate3 := make(chan struct{}), make(chan struct{})
	write := func() error { <-gate; return nil }
	u.start(write, bufs[0])
	u.start(write, bufs[1])
	started, stuck := blocked(func() { u.start(func() error { <-gate3; return nil }, bufs[2]) })
	if !stuck {
		t.Fatal("a third write started with two in flight at depth 2")
	}
	close(gate)
	<-started
	waited, stuck := blocked(u.wait)
	if !stuck {
		t.Fatal("wait returned with a write in flight")
	}
	close(gate3)
	<-waited
	<-gotBuf
	if len(fourth) != 8 {
		t.Fatal("no buffer freed by the writes that ended")
	}
	if u.err() != nil {
		t.Fatalf("err %v after writes that succeeded", u.err())
	}
}

// TestWritesFirstError: err is the first write's error that failed.
func TestWritesFirstError(t *testing.T) {
	u := newWrites(8, 2)
	e1, e2 := errors.New("first"), errors.New("second")
	u.start(func() error { return nil }, u.buffer())
	u.wait()
	u.start(func() error { return e1 }, u.buffer())
	u.wait()
	u.start(func() error { return e2 }, u.buffer())
	u.wait()
	if err := u.err(); err != e1 {
		t.Fatalf("err %v, want the first failure %v", err, e1)
	}
}
