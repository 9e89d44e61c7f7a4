package edge

// Elastic CPU, full CPU only while work runs, is internal/edge/elastic's
// (its package comment). Each sandbox keeps its elastic.CPU (sb.cpu,
// under sb.mu) and hands itself over as an elastic.Sandbox (cpuSandbox);
// the core opens its gate once it has a container (cpuOpenLocked),
// switches it as operations begin and end (acquire), counts terminal
// input (typedLocked), holds it for a keep_cpu command (holdCPU), a pause
// or a resume (pausable.HoldCPU) and closes it when the sandbox stops.

import (
	"context"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/edge/elastic"
)

// cpuSandbox is sb as its CPU gate sees it; its lock is sb.mu.
type cpuSandbox struct{ *sandbox }

var _ elastic.Sandbox = cpuSandbox{}

func (s cpuSandbox) Lock()                           { s.mu.Lock() }
func (s cpuSandbox) Unlock()                         { s.mu.Unlock() }
func (s cpuSandbox) CPU() *elastic.CPU               { return &s.cpu }
func (s cpuSandbox) ID() string                      { return s.rec.Sandbox.ID }
func (s cpuSandbox) Spec() *api.CreateSandboxRequest { return &s.rec.Spec }
func (s cpuSandbox) Stateless() bool                 { return s.stateless }
func (s cpuSandbox) InFlight() int                   { return s.inflight }

// typedLocked counts input to a terminal as activity: the idle timer
// restarts and the sandbox has its full CPU for terminalActive.
func (e *Edge) typedLocked(sb *sandbox) {
	now := time.Now()
	sb.lastActive = now
	e.elastic.TypedLocked(cpuSandbox{sb}, now, terminalActive)
}

// cpuOpenLocked (re)opens sb's CPU gate with its spec's levels and sets
// the level it should have now.
func (e *Edge) cpuOpenLocked(sb *sandbox) {
	if sb.inst == nil {
		return
	}
	e.elastic.OpenLocked(cpuSandbox{sb}, sb.inst.Handle)
}

// cpuSwitchLocked sets the level sb should have after a change of its
// operations in flight or of its holds.
func (e *Edge) cpuSwitchLocked(sb *sandbox) { e.elastic.SwitchLocked(cpuSandbox{sb}) }

// holdCPU keeps sb's full CPU while the background command id runs
// (keep_cpu): it waits for the command's end through the agent.
func (e *Edge) holdCPU(sb *sandbox, agent *agentproto.Client, id string) {
	e.afterCommand(agent, id, e.elastic.Hold(cpuSandbox{sb}))
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
		elastic.WaitCommand(parent, agent, id)
	}()
}
