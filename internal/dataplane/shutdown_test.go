package dataplane

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"
)

// TestShutdownDrains: Shutdown lets a call in flight answer, refuses new
// ones, and returns only when the handler has returned; at its deadline
// it cancels what still runs and still waits for it.
func TestShutdownDrains(t *testing.T) {
	var running atomic.Int32
	started := make(chan struct{}, 2)
	s, addr := serve(t, func(ctx context.Context, g *Grant, op string, body []byte, in io.Reader, chunk func(string, []byte) error) (any, error) {
		running.Add(1)
		defer running.Add(-1)
		started <- struct{}{}
		d := 500 * time.Millisecond
		if string(body) == `{"id":"slow"}` {
			d = time.Hour
		}
		select {
		case <-time.After(d):
			return map[string]bool{"ok": true}, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	c := NewClient(testKey)
	call := func(id string) error {
		var out struct{ OK bool }
		return c.Do(context.Background(), &Call{Addr: addr, Sandbox: id, Op: "read", Body: []byte(`{"id":"` + id + `"}`)}, &out, nil)
	}
	answered := make(chan error, 1)
	go func() { answered <- call("fast") }()
	<-started
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if n := running.Load(); n != 0 {
		t.Fatalf("Shutdown returned with %d handlers running", n)
	}
	if err := <-answered; err != nil {
		t.Fatalf("the call in flight: %v, want its answer", err)
	}
	if err := call("late"); err == nil {
		t.Fatal("a call after Shutdown was served")
	}

	s2, addr2 := serve(t, s.Handle)
	addr = addr2
	go func() { answered <- call("slow") }()
	<-started
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_ = s2.Shutdown(ctx)
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("Shutdown took %v past a 200 ms deadline", d)
	}
	if n := running.Load(); n != 0 {
		t.Fatalf("Shutdown returned with %d handlers running after its deadline", n)
	}
	if err := <-answered; err == nil {
		t.Fatal("the call reset at the deadline reported success")
	}
}
