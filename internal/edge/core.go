package edge

import (
	"context"
	"log/slog"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/edge/core"
	"github.com/warrenhq/warren/internal/edge/fncall"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// The lifecycle core as the edge's job packages see it (core.Core): the
// Edge itself keeps records, admission, start and stop, reconcile and the
// reaper; jobCore hands the rest of the edge (internal/edge/fncall,
// internal/edge/pool, internal/edge/recycle, ...) what they may use of it
// (core.Core, and core.Roots in recycle.go), and *sandbox is their
// core.Sandbox.
//
// Lock order: as in edge.go. Edge.mu, then a job's own lock (fncall's
// Workers.mu, pool's Pools.mu), then sandbox.mu: reclaimLocked (admission)
// calls the fncall Reclaimer, and claimLocked (create) the pools' Take,
// under Edge.mu.

// FnCallDirs are a stateless sandbox's writable directories.
var FnCallDirs = edgeproto.FnCallDirs

var _ core.Reclaimer = (*fncall.Workers)(nil)

// jobCore is the edge's core.Core.
type jobCore struct{ e *Edge }

var _ core.Core = jobCore{}

func (c jobCore) Logger() *slog.Logger     { return c.e.log }
func (c jobCore) Context() context.Context { return c.e.runCtx }

// Go counts f even once Close began (lifetime.Group.Add): the jobs call it
// from calls in flight and from goroutines it counts, which Close drains
// and waits for.
func (c jobCore) Go(f func()) {
	c.e.wg.Add(1)
	go func() {
		defer c.e.wg.Done()
		f()
	}()
}

func (c jobCore) Closing() bool {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	return c.e.closing
}

func (c jobCore) Room(spec *api.CreateSandboxRequest) bool {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	return c.e.workerRoomLocked(spec)
}

func (c jobCore) StartWorker(ctx context.Context, spec api.CreateSandboxRequest, o core.WorkerOptions) (core.Sandbox, error) {
	sb, err := c.e.startWorker(ctx, spec, o)
	if err != nil {
		return nil, err
	}
	return sb, nil
}

func (c jobCore) Stop(s core.Sandbox, reason string) {
	sb := s.(*sandbox)
	c.Go(func() { c.e.stop(context.Background(), sb, api.StateStopped, reason) })
}

func (c jobCore) Reclaim(s core.Sandbox, reason string) {
	sb := s.(*sandbox)
	sb.mu.Lock()
	sb.reclaimed = true
	sb.mu.Unlock()
	c.Stop(sb, reason)
}

func (c jobCore) BeforeCommand(s core.Sandbox) { c.e.killsBefore(s.(*sandbox)) }
func (c jobCore) AfterCommand(s core.Sandbox, res *api.ExecResult) {
	c.e.explainEnd(s.(*sandbox), res)
}
func (c jobCore) AgentError(s core.Sandbox, err error) error {
	return c.e.agentError(s.(*sandbox), err)
}

// ID, Agent and Ready make *sandbox a core.Sandbox.
func (sb *sandbox) ID() string {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.rec.Sandbox.ID
}

func (sb *sandbox) Agent() *agentproto.Client {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.inst == nil {
		return nil
	}
	return sb.inst.Agent
}

func (sb *sandbox) Ready() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.rec.Sandbox.State == api.StateRunning && !sb.stopping
}

// startWorker admits a sandbox of spec for a job and starts it (see
// core.Core.StartWorker).
func (e *Edge) startWorker(ctx context.Context, spec api.CreateSandboxRequest, o core.WorkerOptions) (*sandbox, error) {
	id := e.newID()
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		return nil, &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonShuttingDown, Message: "node is shutting down"}
	}
	if aerr := e.admitWorkerLocked(&spec, o); aerr != nil {
		e.mu.Unlock()
		return nil, aerr
	}
	now := time.Now().UTC()
	tier := spec.Tier
	if o.Stateless {
		tier = api.TierFnCall
	}
	sb := &sandbox{
		rec: record{Spec: spec, Sandbox: api.Sandbox{
			ID: id, State: api.StateCreating, Node: e.cfg.Node, Tier: tier, Image: spec.Image,
			CPU: spec.CPU, MemoryMB: spec.MemoryMB, DiskMB: spec.DiskMB, Pids: spec.Pids,
			Priority: spec.Priority, CreatedAt: now,
		}},
		lastActive: now,
		ready:      make(chan struct{}),
		pool:       o.Pool,
		stateless:  o.Stateless,
	}
	e.putLocked(id, sb)
	e.mu.Unlock()
	err := e.start(context.WithoutCancel(ctx), sb)
	close(sb.ready)
	if err != nil {
		e.mu.Lock()
		e.dropLocked(id)
		e.mu.Unlock()
		return nil, err
	}
	return sb, nil
}

// admitWorkerLocked is admission for a job's worker: a spare one takes
// only free room (within the workers' share when stateless).
func (e *Edge) admitWorkerLocked(spec *api.CreateSandboxRequest, o core.WorkerOptions) *api.Error {
	if o.Spare && o.Stateless && !e.workerRoomLocked(spec) {
		return &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonCPU, Message: "fncall workers hold their share of the node"}
	}
	if o.Spare {
		if aerr := e.shortLocked(e.usageLocked(), spec); aerr != nil {
			return aerr
		}
	}
	return e.admitLocked(spec)
}
