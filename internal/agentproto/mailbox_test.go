package agentproto

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// TestCallMailbox: a call's answers arrive whole and in order, also when
// the agent sends many more than a mailbox holds before the caller takes
// one (the read loop waits, then goes on); a caller that gives up while
// the read loop waits on it frees the connection for the next call; and
// a connection that ends delivers what was queued, then ErrClosed.
func TestCallMailbox(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	const n = 500 // far past a call without a window's mailbox (64)
	requests := make(chan Request, 4)
	go func() { // the agent: n chunks then done for each call, at once
		for {
			var req Request
			if err := ReadRequest(b, &req); err != nil {
				return
			}
			if req.ID == 0 { // OpCancel, OpCredit
				continue
			}
			requests <- req
			for i := range n {
				if WriteFrame(b, &Response{ID: req.ID, Kind: KindChunk, Stream: "stdout", Data: []byte{byte(i)}}) != nil {
					return
				}
			}
			if WriteFrame(b, &Response{ID: req.ID, Kind: KindDone}) != nil {
				return
			}
		}
	}()
	c := NewClient(a)

	// A slow caller: the read loop waits at the mailbox's limit.
	got := 0
	err := c.Call(context.Background(), OpExec, map[string]string{}, nil, func(r *Response) error {
		if len(r.Data) != 1 || r.Data[0] != byte(got) {
			t.Errorf("chunk %d: %v", got, r.Data)
		}
		got++
		if got%100 == 0 {
			time.Sleep(20 * time.Millisecond)
		}
		return nil
	})
	if err != nil || got != n {
		t.Fatalf("call: %v after %d of %d chunks", err, got, n)
	}
	<-requests

	// A caller that gives up after its first chunk, while the agent
	// still sends: the next call is answered all the same.
	ctx, cancel := context.WithCancel(context.Background())
	err = c.Call(ctx, OpExec, map[string]string{}, nil, func(*Response) error { cancel(); return nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned call: %v, want context.Canceled", err)
	}
	<-requests
	got = 0
	done := make(chan error, 1)
	go func() {
		done <- c.Call(context.Background(), OpExec, map[string]string{}, nil, func(*Response) error { got++; return nil })
	}()
	select {
	case err := <-done:
		if err != nil || got != n {
			t.Fatalf("call after an abandoned one: %v after %d of %d chunks", err, got, n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call after an abandoned one got no answer: the read loop waits on the abandoned call")
	}
	<-requests

	// The connection ends: a pending call gets ErrClosed.
	errc := make(chan error, 1)
	go func() {
		errc <- c.Call(context.Background(), OpPing, map[string]string{}, nil, func(*Response) error {
			time.Sleep(time.Millisecond)
			return nil
		})
	}()
	<-requests
	b.Close()
	if err := <-errc; err != nil && !errors.Is(err, ErrClosed) {
		t.Fatalf("call on a connection that ended: %v, want nil or ErrClosed", err)
	}
	if err := c.Call(context.Background(), OpPing, map[string]string{}, nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("call after the end: %v, want ErrClosed", err)
	}
}
