package edge

import (
	"context"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/hoststat"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// CPU only while work runs (docs/architecture.md, "Density and
// elasticity"). Every operation on a sandbox passes acquire, which counts
// it in flight: the first one raises the sandbox's CPU quota to its full
// cpu before the operation is forwarded to the agent (so a command never
// starts before its CPU is there), and the last one to end lowers it to
// the sandbox's idle_cpu budget. A background command started with
// keep_cpu holds the full CPU until it ends; always_on sandboxes and
// FnCall workers (reset after every task, so nothing of theirs runs
// between tasks) keep it always. The switch is one write to a cgroup
// file the runtime keeps open (runtime.CPUGate); the sandbox's CPU time is
// sampled at each switch, so what it used during operations and between
// them, and how long its processes were held back (harvested), are known.
//
// idle_cpu 0 freezes the sandbox between operations (its agent too; the
// thaw is part of the raise). The freezer is the one pause uses: a pause
// and a resume run under a hold of the full level (pausable.HoldCPU),
// whose release writes the idle level again after their thaw, and
// adoption thaws such a sandbox before it attaches its agent.
//
// Everything here is guarded by the sandbox's mu.

// cpuState is a sandbox's CPU gate and what it measured.
type cpuState struct {
	gate       runtime.CPUGate // nil: the runtime has none, or the sandbox is stopping
	full       bool            // the level set now
	hold       int             // background commands holding the full CPU (keep_cpu)
	lastUsage  int64           // usage and throttled time at the last switch
	lastThrott int64
	activeNs   int64 // CPU time used at the full level (during operations)
	idleNs     int64 // CPU time used at the idle budget
	harvested  int64 // throttled time at the idle budget
	throttled  int64 // throttled time at the full level
	// typedUntil: a terminal (or other live input) had input, so the
	// sandbox counts as running an operation until then (live.go);
	// typeTimer lowers the level once it passed.
	typedUntil time.Time
	typeTimer  *time.Timer
}

// idleCPU is the sandbox's budget between operations (records written
// before the field existed get the default).
func idleCPU(spec *api.CreateSandboxRequest) float64 {
	if spec.IdleCPU == nil {
		return min(sandboxspec.DefaultIdleCPU, spec.CPU)
	}
	return *spec.IdleCPU
}

// wantFullLocked says whether sb should have its full CPU now.
func wantFullLocked(sb *sandbox) bool {
	return sb.rec.Spec.AlwaysOn || sb.stateless || sb.inflight > 0 || sb.cpu.hold > 0 ||
		time.Now().Before(sb.cpu.typedUntil)
}

// typedLocked counts input to a terminal as activity: the idle timer
// restarts and the sandbox has its full CPU for terminalActive.
func (e *Edge) typedLocked(sb *sandbox) {
	now := time.Now()
	sb.lastActive = now
	sb.cpu.typedUntil = now.Add(terminalActive)
	if sb.cpu.typeTimer == nil {
		sb.cpu.typeTimer = time.AfterFunc(terminalActive, func() { e.typingPassed(sb) })
	}
	e.cpuSwitchLocked(sb)
}

// typingPassed lowers sb's level once its last input is terminalActive
// old (or waits on for a later one).
func (e *Edge) typingPassed(sb *sandbox) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if d := time.Until(sb.cpu.typedUntil); d > 0 {
		sb.cpu.typeTimer.Reset(d)
		return
	}
	sb.cpu.typeTimer = nil
	e.cpuSwitchLocked(sb)
}

// cpuOpenLocked (re)opens sb's CPU gate with its spec's levels and sets
// the level it should have now.
func (e *Edge) cpuOpenLocked(sb *sandbox) {
	g, ok := e.cfg.Runtime.(runtime.CPUGater)
	if !ok || sb.inst == nil {
		return
	}
	if sb.cpu.gate != nil {
		e.cpuSampleLocked(sb)
		e.cpuCloseLocked(sb) // thawed, should the old level have frozen it
	}
	gate, err := g.CPUGate(sb.inst.Handle, sb.rec.Spec.CPU, idleCPU(&sb.rec.Spec))
	if err != nil {
		e.log.Warn("cpu gate", "id", sb.rec.Sandbox.ID, "err", err)
		return
	}
	sb.cpu.gate = gate
	sb.cpu.full = wantFullLocked(sb)
	if err := gate.Set(sb.cpu.full); err != nil {
		e.log.Warn("cpu gate set", "id", sb.rec.Sandbox.ID, "err", err)
	}
	sb.cpu.lastUsage, sb.cpu.lastThrott, _ = gate.Sample()
}

// cpuSwitchLocked sets the level sb should have after a change of its
// operations in flight or of its holds.
func (e *Edge) cpuSwitchLocked(sb *sandbox) {
	want := wantFullLocked(sb)
	if sb.cpu.gate == nil || want == sb.cpu.full {
		return
	}
	if err := sb.cpu.gate.Set(want); err != nil {
		e.log.Warn("cpu gate set", "id", sb.rec.Sandbox.ID, "full", want, "err", err)
		return
	}
	e.cpuSampleLocked(sb)
	sb.cpu.full = want
}

// cpuSampleLocked charges the CPU time since the last sample to the level
// that was set meanwhile (sb.cpu.full).
func (e *Edge) cpuSampleLocked(sb *sandbox) {
	u, th, err := sb.cpu.gate.Sample()
	if err != nil {
		return
	}
	du, dth := max(u-sb.cpu.lastUsage, 0), max(th-sb.cpu.lastThrott, 0)
	if sb.cpu.full {
		sb.cpu.activeNs += du
		sb.cpu.throttled += dth
	} else {
		sb.cpu.idleNs += du
		sb.cpu.harvested += dth
	}
	sb.cpu.lastUsage, sb.cpu.lastThrott = u, th
}

// cpuCloseLocked gives a stopping sandbox its full CPU back (its teardown,
// or the wipe of a recycled container, runs at full speed; the next owner
// of a recycled container opens its own gate) and closes the gate.
func (e *Edge) cpuCloseLocked(sb *sandbox) {
	if sb.cpu.gate == nil {
		return
	}
	if !sb.cpu.full {
		_ = sb.cpu.gate.Set(true)
	}
	_ = sb.cpu.gate.Close()
	sb.cpu.gate = nil
}

// cpuStatsLocked is sb's CPU view, sampled now.
func (e *Edge) cpuStatsLocked(sb *sandbox) *api.SandboxCPU {
	if sb.cpu.gate != nil {
		e.cpuSampleLocked(sb)
	}
	lvl := "idle"
	if sb.cpu.full || sb.cpu.gate == nil {
		lvl = "full"
	}
	return &api.SandboxCPU{
		Active: float64(sb.cpu.activeNs) / 1e9, Idle: float64(sb.cpu.idleNs) / 1e9,
		Throttled: float64(sb.cpu.harvested+sb.cpu.throttled) / 1e9, Level: lvl,
	}
}

// cpuNodeLocked adds sb to the node's elastic view (from the samples of
// its last switch: the heartbeat reads no cgroup file).
func cpuNodeLocked(sb *sandbox, n *api.NodeElastic) {
	n.ActiveSeconds += float64(sb.cpu.activeNs) / 1e9
	n.IdleSeconds += float64(sb.cpu.idleNs) / 1e9
	n.HarvestedSeconds += float64(sb.cpu.harvested) / 1e9
	if sb.cpu.gate != nil && !sb.cpu.full {
		n.IdleSandboxes++
	}
	n.FreedCPU += freedCPULocked(sb)
}

// holdCPU keeps sb's full CPU while the background command id runs
// (keep_cpu): it waits for the command's end through the agent.
func (e *Edge) holdCPU(sb *sandbox, agent *agentproto.Client, id string) {
	sb.mu.Lock()
	sb.cpu.hold++
	e.cpuSwitchLocked(sb)
	sb.mu.Unlock()
	e.afterCommand(agent, id, func() {
		sb.mu.Lock()
		sb.cpu.hold--
		e.cpuSwitchLocked(sb)
		sb.mu.Unlock()
	})
}

// afterCommand runs done, in a goroutine of the edge, once background
// command id has ended, its agent is gone (the sandbox stopped) or the
// edge closes.
func (e *Edge) afterCommand(agent *agentproto.Client, id string, done func()) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer done()
		parent := e.runCtx
		if parent == nil {
			parent = context.Background()
		}
		// The wait ends with the command, the agent (the sandbox stops)
		// or the edge.
		ctx, cancel := context.WithCancel(parent)
		defer cancel()
		go func() {
			select {
			case <-agent.Done():
				cancel()
			case <-ctx.Done():
			}
		}()
		for ctx.Err() == nil {
			var st agentproto.ProcStatus
			err := agent.Call(ctx, agentproto.OpProcGet, &agentproto.ProcRequest{CommandID: id, Wait: true}, &st, nil)
			if err != nil || !st.Running {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
}

// freedCPULocked is the requested cpu a best-effort sandbox at its idle
// budget does not use now (0 for the others: latency-class sandboxes keep
// their guarantee, and always_on ones, FnCall workers and sandboxes
// running an operation have their full cpu).
func freedCPULocked(sb *sandbox) float64 {
	if sb.cpu.gate == nil || sb.cpu.full || sb.rec.Spec.Priority != api.PriorityBestEffort {
		return 0
	}
	return max(sb.rec.Spec.CPU-idleCPU(&sb.rec.Spec), 0)
}

// elasticFits says whether a best-effort spec fits when the node's
// best-effort sandboxes between operations count with their idle budget
// instead of their request, and the host's CPU is not under pressure (a
// node full of waiting sandboxes admits more; a busy one does not).
func (e *Edge) elasticFits(u usage, spec *api.CreateSandboxRequest) bool {
	if spec.Priority != api.PriorityBestEffort || u.cpu-u.freed+spec.CPU > e.cfg.CPUCapacity+1e-9 {
		return false
	}
	if e.cfg.MaxCPUPressure < 0 {
		return true
	}
	p, err := hoststat.ReadPressure("cpu")
	return err == nil && p.Avg10 <= e.cfg.MaxCPUPressure
}
