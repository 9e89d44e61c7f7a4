package edge

// Lock order: sandbox.pmu, then sandbox.wmu, then sandbox.mu (the whole
// order is in edge.go). Edge.mu is taken only by put, under no other lock.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge/elastic"
	"github.com/warrenhq/warren/internal/edge/trajectory"
	"github.com/warrenhq/warren/internal/runtime"
)

// Adoption at start. Nothing here waits on a sandbox without a deadline, so
// the node serves within seconds of a restart whatever state a crash left:
//
//   - A record saying paused (the intent is written before the freeze, see
//     pause) is thawed and its memory limit and swappiness given back, its
//     agent attached, and it is frozen again in the background; it stays
//     "paused" throughout, and an operation arriving meanwhile resumes it.
//   - A record saying running with idle_cpu 0 (frozen between operations)
//     is thawed before its agent is attached; its gate freezes it again.
//   - A record saying running whose agent does not answer within
//     attachTimeout (a frozen cgroup under a record written before this
//     rule, or a stalled agent) is kept and retried in the background: thawed,
//     its memory given back, attached again, for up to adoptRetryFor; then
//     it is marked failed and destroyed. Requests for it wait (sb.ready).
//   - An agent that is gone fails the sandbox at once (reconcile frees it).
//
// Adopted sandboxes keep their clocks: the TTL is the record's ExpiresAt,
// and the idle clock runs from the record's last activity (flushed by the
// reaper, flushActivity), so downtime counts as idle time.
const (
	attachTimeout = time.Second
	adoptRetryFor = 30 * time.Second
	// refreezeWait bounds how long reconcile waits for the sandboxes it
	// found paused to be frozen again before the node serves (the freeze
	// only: pushing their memory out goes on in the background).
	refreezeWait = 2 * time.Second
)

// adopt takes over a sandbox recorded running or paused; false means it is
// gone (the caller frees what is left of it). Refreezes of paused sandboxes
// are added to refreezes.
func (e *Edge) adopt(ctx context.Context, rec record, refreezes *sync.WaitGroup) bool {
	id := rec.Sandbox.ID
	paused := rec.Sandbox.State == api.StatePaused
	if paused || elastic.IdleCPU(&rec.Spec) == 0 && !rec.Spec.AlwaysOn {
		// A frozen agent cannot answer the attach (an idle_cpu of 0
		// freezes the sandbox between operations).
		e.unfreeze(ctx, rec)
	}
	inst, err := e.attach(ctx, rec)
	if errors.Is(err, runtime.ErrGone) {
		e.log.Warn("sandbox did not survive the restart", "id", id, "err", err)
		return false
	}
	sb := &sandbox{rec: rec, lastActive: adoptedActivity(&rec), ready: make(chan struct{}), traj: trajectory.New(&rec.Spec)}
	if err != nil {
		e.log.Warn("adopted sandbox's agent does not answer; retrying in the background", "id", id, "err", err)
		e.put(id, sb)
		if !e.wg.Go(func() { e.retryAdopt(sb, paused) }) {
			close(sb.ready)
		}
		return true
	}
	close(sb.ready)
	e.adopted(sb, inst)
	e.log.Info("adopted sandbox", "id", id, "paused", paused)
	if paused {
		refreezes.Add(1)
		if !e.wg.Go(func() { e.refreeze(sb, refreezes.Done) }) {
			refreezes.Done()
		}
	}
	return true
}

// adoptedActivity is when an adopted sandbox was last active: the record's
// last activity, or now for a record written before it was kept.
func adoptedActivity(rec *record) time.Time {
	if rec.Sandbox.LastActive.IsZero() {
		return time.Now()
	}
	return rec.Sandbox.LastActive
}

// adopted makes sb live with its attached agent.
func (e *Edge) adopted(sb *sandbox, inst *runtime.Instance) {
	sb.mu.Lock()
	sb.inst = inst
	e.cpuOpenLocked(sb)
	sb.mu.Unlock()
	e.put(sb.rec.Sandbox.ID, sb)
	sb.audit.SetPolicy(sb.rec.Spec.Audit)
	e.auditStart(sb, inst.Handle)
	e.watch(sb)
}

// attach connects to the agent of rec, within attachTimeout.
func (e *Edge) attach(ctx context.Context, rec record) (*runtime.Instance, error) {
	actx, cancel := context.WithTimeout(ctx, attachTimeout)
	defer cancel()
	return e.cfg.Runtime.Attach(actx, *rec.Handle)
}

// unfreeze gives a sandbox its memory limit (and swappiness) back and thaws
// it; both are idempotent.
func (e *Edge) unfreeze(ctx context.Context, rec record) {
	h := *rec.Handle
	if rc, ok := e.cfg.Runtime.(runtime.Reclaimer); ok {
		if err := rc.Restore(ctx, h, rec.Spec.MemoryMB); err != nil {
			e.log.Debug("restore memory of adopted sandbox", "id", rec.Sandbox.ID, "err", err)
		}
	}
	if err := e.cfg.Runtime.Thaw(ctx, h); err != nil {
		e.log.Debug("thaw adopted sandbox", "id", rec.Sandbox.ID, "err", err)
	}
}

// retryAdopt attaches a sandbox whose agent did not answer at start, thawing
// it before each attempt, for up to adoptRetryFor; then it fails it.
func (e *Edge) retryAdopt(sb *sandbox, paused bool) {
	defer close(sb.ready)
	ctx := e.runCtx
	sb.mu.Lock()
	rec := sb.rec
	sb.mu.Unlock()
	id := rec.Sandbox.ID
	deadline := time.Now().Add(adoptRetryFor)
	var err error
	for {
		e.unfreeze(ctx, rec)
		var inst *runtime.Instance
		if inst, err = e.attach(ctx, rec); err == nil {
			sb.mu.Lock()
			stopping := sb.stopping
			sb.mu.Unlock()
			if stopping {
				_ = inst.Agent.Close()
				return
			}
			e.adopted(sb, inst)
			e.log.Info("adopted sandbox after retrying", "id", id, "paused", paused)
			if paused {
				e.refreeze(sb, nil)
			}
			return
		}
		if errors.Is(err, runtime.ErrGone) || time.Now().After(deadline) {
			break
		}
		select {
		case <-ctx.Done():
			return // the node is closing: Close stops or detaches it
		case <-time.After(time.Second):
		}
	}
	e.stop(ctx, sb, api.StateFailed, fmt.Sprintf("its agent did not answer after the node restarted: %v", err))
}

// refreeze pauses again a sandbox that was paused before a restart (adopt
// thawed it to attach its agent). It stays "paused" throughout; a resume
// that came first (an operation on it) wins. frozen, when set, is called
// once it is frozen (or will not be), before its memory is pushed out.
func (e *Edge) refreeze(sb *sandbox, frozen func()) {
	if frozen != nil {
		frozen = sync.OnceFunc(frozen)
		defer frozen() // also when there is nothing to freeze
	}
	if err := e.pauser.Refreeze(e.runCtx, e.pausable(sb), "paused before the restart", frozen); err != nil {
		e.log.Warn("pause adopted sandbox again", "id", sb.rec.Sandbox.ID, "err", err)
	}
}

// waitRefreezes waits for wg, at most refreezeWait.
func waitRefreezes(wg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(refreezeWait):
	}
}
