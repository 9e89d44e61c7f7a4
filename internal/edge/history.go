package edge

// A sandbox's command history is internal/edge/history's (sandbox.hist);
// the core notes each command (handlers.go, live.go) and answers from it.

import (
	"context"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
)

// commands answers OpCommands: the sandbox's recent command history.
func (e *Edge) commands(id string) (*api.CommandHistory, error) {
	sb, err := e.lookup(id)
	if err != nil {
		return nil, err
	}
	cmds, _ := sb.hist.List()
	return &api.CommandHistory{Commands: cmds}, nil
}

// stats answers OpStats: what the sandbox uses now, beside its limits. A
// sandbox that is not running (or a runtime that cannot measure one)
// reports zero use.
func (e *Edge) stats(ctx context.Context, id string) (*api.SandboxStats, error) {
	sb, err := e.lookup(id)
	if err != nil {
		return nil, err
	}
	sb.mu.Lock()
	v := sb.rec.Sandbox
	var h *runtime.Handle
	if sb.inst != nil && (v.State == api.StateRunning || v.State == api.StatePaused) {
		hh := sb.inst.Handle
		h = &hh
	}
	base := sb.rec.CPUBase
	var cs *api.SandboxCPU
	if sb.cpu.Gated() {
		cs = sb.cpu.StatsLocked()
	}
	sb.mu.Unlock()
	_, n := sb.hist.List()
	st := &api.SandboxStats{ID: v.ID, State: v.State, CPU: v.CPU, MemoryLimitMB: v.MemoryMB, Commands: n, CPUStats: cs}
	if ur, ok := e.cfg.Runtime.(runtime.SandboxUsageReporter); ok && h != nil {
		u, err := ur.SandboxUsage(*h)
		if err != nil {
			return nil, &api.Error{Code: api.CodeConflict, Message: "sandbox " + id + " cannot be measured now: " + err.Error()}
		}
		st.CPUSeconds, st.MemoryBytes = max(u.CPUSeconds-base, 0), u.MemoryBytes
	}
	return st, nil
}

// cpuBaseline is the CPU time the container of a sandbox has used before
// the sandbox got it: a recycled container's earlier sandboxes are not
// this one's (and not its business).
func (e *Edge) cpuBaseline(rec *record, h runtime.Handle) float64 {
	if rec.Layer == "" {
		return 0 // a container of its own
	}
	ur, ok := e.cfg.Runtime.(runtime.SandboxUsageReporter)
	if !ok {
		return 0
	}
	u, err := ur.SandboxUsage(h)
	if err != nil {
		return 0
	}
	return u.CPUSeconds
}
