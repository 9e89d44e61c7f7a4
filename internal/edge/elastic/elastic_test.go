package elastic

import (
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

func TestIdleCPU(t *testing.T) {
	for _, c := range []struct {
		name string
		spec api.CreateSandboxRequest
		want float64
	}{
		{"default", api.CreateSandboxRequest{CPU: 2}, sandboxspec.DefaultIdleCPU},
		{"default above cpu", api.CreateSandboxRequest{CPU: 0.01}, 0.01},
		{"set", api.CreateSandboxRequest{CPU: 2, IdleCPU: ptr(0.25)}, 0.25},
		{"freeze", api.CreateSandboxRequest{CPU: 2, IdleCPU: ptr(0.0)}, 0},
	} {
		if got := IdleCPU(&c.spec); got != c.want {
			t.Errorf("%s: IdleCPU = %g, want %g", c.name, got, c.want)
		}
	}
}

// TestOpen: the gate opens with the spec's levels at the level the
// sandbox should have now.
func TestOpen(t *testing.T) {
	n, g := newNode()
	s, gate := opened(t, n, g)
	if g.full != 2 || g.idle != 0.5 {
		t.Errorf("gate levels %g/%g, want 2/0.5", g.full, g.idle)
	}
	if !slices.Equal(gate.sets, []bool{false}) || s.cpu.full {
		t.Errorf("an idle sandbox's gate: sets %v, full %v; want [false], false", gate.sets, s.cpu.full)
	}
	for _, c := range []struct {
		name string
		s    *fakeSandbox
	}{
		{"always_on", &fakeSandbox{spec: api.CreateSandboxRequest{CPU: 1, AlwaysOn: true}}},
		{"fncall worker", &fakeSandbox{spec: api.CreateSandboxRequest{CPU: 1}, stateless: true}},
		{"operation in flight", &fakeSandbox{spec: api.CreateSandboxRequest{CPU: 1}, inflight: 1}},
	} {
		n.OpenLocked(c.s, runtime.Handle{})
		gate := g.gates[len(g.gates)-1]
		if !slices.Equal(gate.sets, []bool{true}) || !c.s.cpu.full {
			t.Errorf("%s: sets %v, full %v; want [true], true", c.name, gate.sets, c.s.cpu.full)
		}
	}
}

// TestOpenAgain: a second open (a pool claim's new spec) charges and
// closes the old gate, thawed, and opens one with the new levels.
func TestOpenAgain(t *testing.T) {
	n, g := newNode()
	s, old := opened(t, n, g)
	old.usage = 3e9
	s.spec.CPU, s.spec.IdleCPU = 1, ptr(0.1)
	n.OpenLocked(s, runtime.Handle{})
	if old.closed != 1 || !slices.Equal(old.sets, []bool{false, true}) {
		t.Errorf("old gate: closed %d, sets %v; want closed once after [false true]", old.closed, old.sets)
	}
	if s.cpu.idleNs != 3e9 {
		t.Errorf("idle time %d, want the old gate's 3e9", s.cpu.idleNs)
	}
	if len(g.gates) != 2 || s.cpu.gate != g.gates[1] || g.full != 1 || g.idle != 0.1 {
		t.Errorf("new gate: %d gates, levels %g/%g; want the second, 1/0.1", len(g.gates), g.full, g.idle)
	}
}

// TestOpenWithout: no gates in the runtime, or one that fails to open:
// the sandbox has no gate, and switching does nothing.
func TestOpenWithout(t *testing.T) {
	n := New(slog.New(slog.DiscardHandler), nil, 4, -1)
	s := &fakeSandbox{spec: api.CreateSandboxRequest{CPU: 1}}
	n.OpenLocked(s, runtime.Handle{})
	s.inflight++
	n.SwitchLocked(s)
	if s.cpu.Gated() || s.cpu.full {
		t.Errorf("without gates: gated %v, full %v", s.cpu.Gated(), s.cpu.full)
	}
	n, g := newNode()
	g.err = errors.New("no cgroup")
	n.OpenLocked(s, runtime.Handle{})
	if s.cpu.Gated() {
		t.Error("a gate that failed to open is kept")
	}
}

// TestSwitch: full while operations run, idle when the last one ends;
// a level already set is not written again.
func TestSwitch(t *testing.T) {
	n, g := newNode()
	s, gate := opened(t, n, g)
	step := func(d int, want []bool) {
		t.Helper()
		s.inflight += d
		n.SwitchLocked(s)
		if !slices.Equal(gate.sets, want) {
			t.Fatalf("after %d in flight: sets %v, want %v", s.inflight, gate.sets, want)
		}
	}
	step(+1, []bool{false, true})
	step(+1, []bool{false, true}) // a second operation: no write
	step(-1, []bool{false, true})
	step(-1, []bool{false, true, false})
	if s.cpu.full {
		t.Error("full after the last operation ended")
	}
	// A failed write keeps the level it had.
	gate.setErr = errors.New("EBADF")
	step(+1, []bool{false, true, false})
	if s.cpu.full {
		t.Error("full after a failed raise")
	}
}

// TestTyping: input holds the full level for its while after the last
// keystroke; then the timer lowers it.
func TestTyping(t *testing.T) {
	n, g := newNode()
	s, gate := opened(t, n, g)
	const d = 200 * time.Millisecond
	s.Lock()
	start := time.Now()
	n.TypedLocked(s, start, d)
	s.Unlock()
	if !s.full() {
		t.Fatal("input did not raise the level")
	}
	time.Sleep(d / 2)
	s.Lock()
	later := time.Now()
	n.TypedLocked(s, later, d) // a later keystroke: the timer waits on
	s.Unlock()
	time.Sleep(time.Until(start.Add(d + d/4)))
	// Past the first input's while, within the later one's (unless this
	// machine slept much longer than asked).
	if full := s.full(); !full && time.Since(later) < d {
		t.Fatalf("lowered %v after the first input, before the later one's while passed", time.Since(start))
	}
	waitFor(t, func() bool { return !s.full() })
	s.Lock()
	defer s.Unlock()
	if !slices.Equal(gate.sets, []bool{false, true, false}) || s.cpu.typeTimer != nil {
		t.Errorf("sets %v, timer %v; want [false true false], none", gate.sets, s.cpu.typeTimer)
	}
}

// TestTypingUnderOperation: the typing timer does not lower a sandbox
// still running an operation.
func TestTypingUnderOperation(t *testing.T) {
	n, g := newNode()
	s, _ := opened(t, n, g)
	s.Lock()
	s.inflight = 1
	n.TypedLocked(s, time.Now(), 10*time.Millisecond)
	s.Unlock()
	waitFor(t, func() bool {
		s.Lock()
		defer s.Unlock()
		return s.cpu.typeTimer == nil
	})
	if !s.full() {
		t.Error("the typing timer lowered a sandbox running an operation")
	}
}

// TestHold: each hold keeps the full level until it is released; the
// last release lowers it.
func TestHold(t *testing.T) {
	n, g := newNode()
	s, gate := opened(t, n, g)
	r1 := n.Hold(s)
	r2 := n.Hold(s)
	if !s.full() {
		t.Fatal("a hold did not raise the level")
	}
	r1()
	if !s.full() {
		t.Fatal("lowered while a second hold remains")
	}
	r2()
	if s.full() {
		t.Fatal("still full after the last release")
	}
	if !slices.Equal(gate.sets, []bool{false, true, false}) {
		t.Errorf("sets %v, want [false true false]", gate.sets)
	}
	// A release under an operation leaves the full level.
	r := n.Hold(s)
	s.Lock()
	s.inflight = 1
	s.Unlock()
	r()
	if !s.full() {
		t.Error("a release lowered a sandbox running an operation")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
