package edge

import (
	"log/slog"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge/elastic"
	"github.com/warrenhq/warren/internal/runtime"
)

// levelGate is a runtime.CPUGate that keeps the level written last.
type levelGate struct {
	full   bool
	writes int
}

func (g *levelGate) Set(full bool) error           { g.full = full; g.writes++; return nil }
func (g *levelGate) Sample() (int64, int64, error) { return 0, 0, nil }
func (g *levelGate) Close() error                  { return nil }

type levelGater struct{ gate *levelGate }

func (g *levelGater) CPUGate(runtime.Handle, float64, float64) (runtime.CPUGate, error) {
	g.gate = &levelGate{}
	return g.gate, nil
}

// TestCPUAdapters: the core's operations in flight, terminal input and
// pause holds reach the sandbox's CPU gate through its adapters.
func TestCPUAdapters(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	g := &levelGater{}
	e := &Edge{log: log, elastic: elastic.New(log, g, 4, -1)}
	sb := &sandbox{inst: &runtime.Instance{}}
	sb.rec.Spec = api.CreateSandboxRequest{CPU: 2, Priority: api.PriorityBestEffort}
	level := func() bool {
		sb.mu.Lock()
		defer sb.mu.Unlock()
		return g.gate.full
	}
	sb.mu.Lock()
	e.cpuOpenLocked(sb)
	sb.mu.Unlock()
	if g.gate == nil || level() {
		t.Fatal("the gate did not open at the idle level")
	}
	sb.mu.Lock()
	sb.inflight++
	e.cpuSwitchLocked(sb)
	full := g.gate.full
	sb.inflight--
	e.cpuSwitchLocked(sb)
	sb.mu.Unlock()
	if !full || level() {
		t.Errorf("an operation: full %v during, %v after; want true, false", full, level())
	}
	release := e.pausable(sb).HoldCPU()
	if !level() {
		t.Error("a pause's hold did not raise the level")
	}
	release()
	if level() {
		t.Error("a pause's release did not lower the level")
	}
	sb.mu.Lock()
	e.typedLocked(sb)
	typed, active := g.gate.full, sb.lastActive
	sb.mu.Unlock()
	if !typed || active.IsZero() {
		t.Errorf("terminal input: full %v, last active %v", typed, active)
	}
	worker := &sandbox{inst: &runtime.Instance{}, stateless: true}
	worker.rec.Spec = sb.rec.Spec
	worker.mu.Lock()
	e.cpuOpenLocked(worker)
	worker.mu.Unlock()
	if !g.gate.full {
		t.Error("an FnCall worker's gate opened at the idle level")
	}
}
