package elastic

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
)

// TestWaitCommand: the wait asks the agent until the command ended.
func TestWaitCommand(t *testing.T) {
	a := newAgent(2)
	WaitCommand(context.Background(), a, "c-1")
	if a.count() != 3 {
		t.Fatalf("%d calls, want 3 (running, running, ended)", a.count())
	}
	for _, r := range a.reqs {
		if r != (agentproto.ProcRequest{CommandID: "c-1", Wait: true}) {
			t.Errorf("request %+v, want a wait for c-1", r)
		}
	}
	a = newAgent(100)
	a.err = errors.New("agent gone")
	WaitCommand(context.Background(), a, "c-1")
	if a.count() != 1 {
		t.Errorf("%d calls after a failed one, want 1", a.count())
	}
}

// TestWaitCommandEnds: the wait ends with the agent or the context.
func TestWaitCommandEnds(t *testing.T) {
	for _, c := range []struct {
		name string
		end  func(a *fakeAgent, cancel context.CancelFunc)
	}{
		{"agent gone", func(a *fakeAgent, _ context.CancelFunc) { close(a.done) }},
		{"context", func(_ *fakeAgent, cancel context.CancelFunc) { cancel() }},
	} {
		a := newAgent(1 << 30)
		a.block = true
		ctx, cancel := context.WithCancel(context.Background())
		ended := make(chan struct{})
		go func() {
			WaitCommand(ctx, a, "c-1")
			close(ended)
		}()
		select {
		case <-ended:
			t.Fatalf("%s: the wait ended before", c.name)
		case <-time.After(20 * time.Millisecond):
		}
		c.end(a, cancel)
		select {
		case <-ended:
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the wait did not end", c.name)
		}
		cancel()
	}
}

// TestHoldBackground: a keep_cpu command holds the full level while the
// agent reports it running; once it ended the release lowers it.
func TestHoldBackground(t *testing.T) {
	n, g := newNode()
	s, gate := opened(t, n, g)
	a := newAgent(2)
	a.step = make(chan struct{})
	release := n.Hold(s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer release()
		WaitCommand(context.Background(), a, "c-1")
	}()
	for i := range 2 {
		a.step <- struct{}{} // running
		if !s.full() {
			t.Fatalf("not full after %d answers that the command runs", i+1)
		}
	}
	a.step <- struct{}{} // ended
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the wait did not end with the command")
	}
	if s.full() {
		t.Error("still full after the command ended")
	}
	s.Lock()
	defer s.Unlock()
	if want := []bool{false, true, false}; !slices.Equal(gate.sets, want) {
		t.Errorf("sets %v, want %v", gate.sets, want)
	}
}
