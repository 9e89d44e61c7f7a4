package edge_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/edge/edgetest"
)

// edgeGoroutines lists the goroutines running the edge's code, its bus
// handlers or its data listener (the test's own and the bus library's
// are not).
func edgeGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "warren/internal/edge.") || strings.Contains(g, "warren/internal/bus.(*Conn).handle") ||
			strings.Contains(g, "warren/internal/dataplane.(*Server)") || strings.Contains(g, "warren/internal/lifetime.") {
			out = append(out, g)
		}
	}
	return out
}

// noEdgeGoroutines fails if a goroutine of the edge is still there. A
// goroutine that was just released may still be returning (on a loaded
// host, with -race): it gets a second, far shorter than the calls and
// loops these tests leave running if Close does not wait for them.
func noEdgeGoroutines(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Second)
	for {
		left := edgeGoroutines()
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines of the edge outlived Close:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitExecs waits until the fake agent of sandbox id runs n execs.
func waitExecs(t *testing.T, n *edgetest.Node, id string, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if a := n.Runtime.Agent(id); a != nil && a.Execs() >= want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the exec did not reach the agent in 20 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestFakeCloseDrainsInFlight: Close lets a call in flight finish and
// answer before it returns (it is not cut off), and no goroutine of the
// edge outlives it.
func TestFakeCloseDrainsInFlight(t *testing.T) {
	n := edgetest.Start(t)
	sb, err := n.Create(api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		res *api.ExecResult
		err error
		at  time.Time
	}
	done := make(chan answer, 1)
	go func() {
		res, err := n.Exec(sb.ID, "sleep 1.5")
		done <- answer{res, err, time.Now()}
	}()
	waitExecs(t, n, sb.ID, 1)
	e := n.Edge
	n.Edge = nil // closed here, not by the cleanup
	t0 := time.Now()
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	closed := time.Now()
	a := <-done
	if a.err != nil || a.res.ExitCode != 0 {
		t.Fatalf("the call in flight during Close: %+v %v, want it finished", a.res, a.err)
	}
	// The edge sends the answer before Close returns; the client reads it
	// a moment later (it was seen 58 µs after, on a loaded machine). A
	// call cut off by Close would have failed above, or come back with the
	// 1.5 s command not done; so only a late answer well past Close fails.
	if late := a.at.Sub(closed); late > 250*time.Millisecond {
		t.Fatalf("the call in flight answered %v after Close returned", late)
	}
	t.Logf("Close took %v (the call in flight had ~1.5 s to go)", closed.Sub(t0))
	noEdgeGoroutines(t)
}

// TestFakeCloseDrainDeadline: a call that outlasts the drain deadline is
// cancelled (its caller gets an answer, not silence), and Close still
// waits for its goroutine.
func TestFakeCloseDrainDeadline(t *testing.T) {
	n := edgetest.Start(t, func(c *edge.Config) { c.DrainTimeout = 300 * time.Millisecond })
	sb, err := n.Create(api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var res *api.ExecResult
	go func() {
		var err error
		res, err = n.Exec(sb.ID, "sleep 600")
		done <- err
	}()
	waitExecs(t, n, sb.ID, 1)
	e := n.Edge
	n.Edge = nil
	t0 := time.Now()
	if err := e.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("Close took %v with a 300 ms drain deadline", d)
	}
	select {
	case err := <-done:
		if err == nil && res.ExitCode == 0 {
			t.Fatalf("sleep 600 finished normally: %+v", res)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cancelled call got no answer within 5 s of Close")
	}
	noEdgeGoroutines(t)
}
