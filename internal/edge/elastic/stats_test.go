package elastic

import (
	"errors"
	"slices"
	"testing"

	"github.com/warrenhq/warren/api"
)

// TestSamples: the CPU time between two switches is charged to the level
// set meanwhile; a counter that went back charges nothing, a failed
// sample nothing either.
func TestSamples(t *testing.T) {
	n, g := newNode()
	s, gate := opened(t, n, g)
	gate.usage, gate.throttled = 2e9, 1e9 // at the idle level
	s.inflight = 1
	n.SwitchLocked(s)
	gate.usage, gate.throttled = 5e9, 1.5e9 // at the full level
	s.inflight = 0
	n.SwitchLocked(s)
	c := &s.cpu
	if c.idleNs != 2e9 || c.harvested != 1e9 || c.activeNs != 3e9 || c.throttled != 0.5e9 {
		t.Fatalf("idle %d harvested %d active %d throttled %d; want 2e9 1e9 3e9 0.5e9", c.idleNs, c.harvested, c.activeNs, c.throttled)
	}
	gate.usage, gate.throttled = 1e9, 0 // a counter reset
	st := c.StatsLocked()
	if c.idleNs != 2e9 || c.harvested != 1e9 || c.lastUsage != 1e9 {
		t.Errorf("a counter that went back charged: idle %d harvested %d last %d", c.idleNs, c.harvested, c.lastUsage)
	}
	want := api.SandboxCPU{Active: 3, Idle: 2, Throttled: 1.5, Level: "idle"}
	if *st != want {
		t.Errorf("stats %+v, want %+v", *st, want)
	}
	gate.usage, gate.sampleErr = 9e9, errors.New("gone")
	if st := c.StatsLocked(); st.Idle != 2 {
		t.Errorf("a failed sample charged: idle %g s", st.Idle)
	}
	s.inflight = 1
	n.SwitchLocked(s)
	if st := c.StatsLocked(); st.Level != "full" {
		t.Errorf("level %q under an operation, want full", st.Level)
	}
}

// TestClose: a stopping sandbox gets its full CPU back and its gate
// closes; without a gate its level reads full.
func TestClose(t *testing.T) {
	n, g := newNode()
	s, gate := opened(t, n, g)
	gate.usage = 4e9
	s.cpu.CloseLocked()
	if gate.closed != 1 || !slices.Equal(gate.sets, []bool{false, true}) || s.cpu.Gated() {
		t.Fatalf("closed %d, sets %v, gated %v; want 1, [false true], false", gate.closed, gate.sets, s.cpu.Gated())
	}
	s.cpu.CloseLocked() // again: nothing
	if st := s.cpu.StatsLocked(); st.Level != "full" || st.Idle != 0 || gate.closed != 1 {
		t.Errorf("after close: %+v, closed %d", *st, gate.closed)
	}
	// A sandbox at its full level is not written before the close.
	s, gate = opened(t, n, g)
	s.inflight = 1
	n.SwitchLocked(s)
	s.cpu.CloseLocked()
	if !slices.Equal(gate.sets, []bool{false, true}) || gate.closed != 1 {
		t.Errorf("sets %v closed %d; want [false true], 1", gate.sets, gate.closed)
	}
}

// TestFreed: only a best-effort sandbox at its idle level frees its
// request beyond its budget.
func TestFreed(t *testing.T) {
	n, g := newNode()
	s, _ := opened(t, n, g)
	if f := s.cpu.FreedLocked(&s.spec); f != 1.5 {
		t.Errorf("idle best-effort 2 cores at 0.5 frees %g, want 1.5", f)
	}
	lat := s.spec
	lat.Priority = api.PriorityLatency
	if f := s.cpu.FreedLocked(&lat); f != 0 {
		t.Errorf("a latency-class sandbox frees %g", f)
	}
	above := s.spec
	above.IdleCPU = ptr(3.0)
	if f := s.cpu.FreedLocked(&above); f != 0 {
		t.Errorf("idle_cpu above cpu frees %g", f)
	}
	s.inflight = 1
	n.SwitchLocked(s)
	if f := s.cpu.FreedLocked(&s.spec); f != 0 {
		t.Errorf("a sandbox running an operation frees %g", f)
	}
	var none CPU
	if f := none.FreedLocked(&s.spec); f != 0 {
		t.Errorf("a sandbox without a gate frees %g", f)
	}
}

// TestNodeView: the node's elastic view sums the sandboxes' last samples
// and counts those at the idle level.
func TestNodeView(t *testing.T) {
	n, g := newNode()
	a, ga := opened(t, n, g)
	b, gb := opened(t, n, g)
	ga.usage, ga.throttled = 1e9, 2e9
	a.inflight = 1
	n.SwitchLocked(a) // a: full; 1 s idle, 2 s harvested charged
	gb.usage = 4e9
	b.cpu.StatsLocked() // b: idle; 4 s idle
	ga.usage = 100e9    // not sampled: the view reads no gate
	var v api.NodeElastic
	a.cpu.AddLocked(&v, &a.spec)
	b.cpu.AddLocked(&v, &b.spec)
	want := api.NodeElastic{IdleSeconds: 5, HarvestedSeconds: 2, IdleSandboxes: 1, FreedCPU: 1.5}
	if v != want {
		t.Errorf("view %+v, want %+v", v, want)
	}
}

// TestFits: a best-effort create fits on the idle sandboxes' freed CPU
// while the host's CPU is not under pressure; nothing else does.
func TestFits(t *testing.T) {
	n, _ := newNode() // 4 cores, no pressure check
	be := &api.CreateSandboxRequest{CPU: 2, Priority: api.PriorityBestEffort}
	lat := &api.CreateSandboxRequest{CPU: 2, Priority: api.PriorityLatency}
	if !n.Fits(4, 2, be) {
		t.Error("4 requested, 2 freed, 2 asked of 4 cores: refused")
	}
	if n.Fits(4, 1.5, be) {
		t.Error("4 requested, 1.5 freed, 2 asked of 4 cores: admitted")
	}
	if n.Fits(4, 4, lat) {
		t.Error("a latency-class create admitted on freed CPU")
	}
	n.maxPressure = 50
	reads := 0
	p, perr := 10.0, error(nil)
	n.pressure = func() (float64, error) { reads++; return p, perr }
	if !n.Fits(4, 2, be) {
		t.Error("refused under 10 % pressure (at most 50)")
	}
	p = 50.5
	if n.Fits(4, 2, be) {
		t.Error("admitted under 50.5 % pressure (at most 50)")
	}
	p, perr = 0, errors.New("no psi")
	if n.Fits(4, 2, be) {
		t.Error("admitted when the pressure cannot be read")
	}
	if reads != 3 {
		t.Errorf("pressure read %d times, want 3", reads)
	}
	n.Fits(4, 0, be)
	n.Fits(4, 4, lat)
	if reads != 3 {
		t.Error("pressure read for a create that does not fit anyway")
	}
}
