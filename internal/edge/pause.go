package edge

// Lock order: sandbox.pmu (held over the freeze), then sandbox.wmu (one
// record write), then sandbox.mu; Edge.mu is not taken under sandbox.mu
// (the whole order is in edge.go).

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
)

// pause freezes a running sandbox and pushes its memory out (to swap where
// the host has it, page cache dropped). The state turns "paused" before the
// freeze, so an operation arriving meanwhile waits for the pause to finish
// and then resumes the sandbox (see acquire).
func (e *Edge) pause(ctx context.Context, sb *sandbox, why string) error {
	sb.pmu.Lock()
	defer sb.pmu.Unlock()
	sb.mu.Lock()
	id := sb.rec.Sandbox.ID
	if sb.rec.Sandbox.State == api.StatePaused {
		sb.mu.Unlock()
		return nil
	}
	if sb.rec.Sandbox.State != api.StateRunning || sb.stopping || sb.inst == nil {
		defer sb.mu.Unlock()
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s is %s", id, stateWord(sb))}
	}
	h := sb.inst.Handle
	sb.rec.Sandbox.State = api.StatePaused
	sb.mu.Unlock()

	// The intent first: a crash from here on leaves a record that says
	// paused, which the restart resolves (reconcile thaws, attaches and
	// pauses again). A record saying running over a frozen agent would
	// make the restart call an agent that cannot answer.
	if err := e.persistSandbox(sb); err != nil {
		sb.mu.Lock()
		sb.rec.Sandbox.State = api.StateRunning
		sb.mu.Unlock()
		return fmt.Errorf("edge: record the pause of %s: %w", id, err)
	}
	return e.freezeAndReclaim(ctx, sb, h, why, nil)
}

// freezeAndReclaim freezes sb (recorded paused already) and pushes its
// memory out; a freeze that fails leaves it thawed and running again.
// frozen, when set, is called once the freeze is over (either way), before
// the reclaim. The caller holds sb.pmu.
func (e *Edge) freezeAndReclaim(ctx context.Context, sb *sandbox, h runtime.Handle, why string, frozen func()) error {
	id := sb.rec.Sandbox.ID
	t0 := time.Now()
	err := e.cfg.Runtime.Freeze(ctx, h)
	if frozen != nil {
		frozen()
	}
	if err != nil {
		// A freeze that timed out leaves the cgroup FREEZING: thaw it.
		if terr := e.cfg.Runtime.Thaw(context.WithoutCancel(ctx), h); terr != nil {
			e.log.Warn("thaw after a failed freeze", "id", id, "err", terr)
		}
		sb.mu.Lock()
		sb.rec.Sandbox.State = api.StateRunning
		sb.rec.Sandbox.PausedAt = nil
		sb.mu.Unlock()
		if perr := e.persistSandbox(sb); perr != nil {
			e.log.Warn("persist sandbox after a failed freeze", "id", id, "err", perr)
		}
		return fmt.Errorf("edge: freeze %s: %w", id, err)
	}
	var before, after int64
	if rc, ok := e.cfg.Runtime.(runtime.Reclaimer); ok {
		var err error
		if before, after, err = rc.Reclaim(ctx, h); err != nil {
			e.log.Warn("reclaim paused sandbox", "id", id, "err", err)
		}
	}
	now := time.Now().UTC()
	sb.mu.Lock()
	sb.rec.Sandbox.PausedAt = &now
	sb.mu.Unlock()
	if err := e.persistSandbox(sb); err != nil {
		e.log.Warn("persist paused sandbox", "id", id, "err", err)
	}
	e.log.Info("sandbox paused", "id", id, "why", why, "memory_before", before, "memory_after", after, "took", time.Since(t0))
	return nil
}

// resume thaws a paused sandbox after giving its memory limit back and,
// with prefetch, after asking the kernel to read its swapped-out memory
// back (the reads run while the sandbox thaws and serves its first call).
func (e *Edge) resume(ctx context.Context, sb *sandbox, prefetch bool) error {
	sb.pmu.Lock()
	defer sb.pmu.Unlock()
	sb.mu.Lock()
	id := sb.rec.Sandbox.ID
	if sb.rec.Sandbox.State != api.StatePaused || sb.stopping || sb.inst == nil {
		sb.mu.Unlock()
		return nil
	}
	h := sb.inst.Handle
	mem := sb.rec.Spec.MemoryMB
	sb.mu.Unlock()
	t0 := time.Now()
	var prefetched int64
	if rc, ok := e.cfg.Runtime.(runtime.Reclaimer); ok {
		if err := rc.Restore(ctx, h, mem); err != nil {
			return fmt.Errorf("edge: restore memory of %s: %w", id, err)
		}
		if prefetch {
			// The agent first, before the thaw: it serves the first call.
			var err error
			if prefetched, err = rc.Prefetch(ctx, h, false); err != nil {
				e.log.Warn("prefetch resumed sandbox's agent", "id", id, "err", err)
			}
		}
	}
	if err := e.cfg.Runtime.Thaw(ctx, h); err != nil {
		return fmt.Errorf("edge: thaw %s: %w", id, err)
	}
	if rc, ok := e.cfg.Runtime.(runtime.Reclaimer); ok && prefetch {
		// The rest while the sandbox already runs: queuing the reads of a
		// big working set takes tens of milliseconds.
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			if n, err := rc.Prefetch(context.WithoutCancel(ctx), h, true); err != nil {
				e.log.Warn("prefetch resumed sandbox", "id", id, "err", err)
			} else {
				e.log.Debug("sandbox prefetched", "id", id, "bytes", n)
			}
		}()
	}
	sb.mu.Lock()
	sb.rec.Sandbox.State = api.StateRunning
	sb.rec.Sandbox.PausedAt = nil
	sb.lastActive = time.Now()
	sb.mu.Unlock()
	// A crash before this write leaves a record saying paused over a
	// thawed sandbox: the restart pauses it again (consistent).
	if err := e.persistSandbox(sb); err != nil {
		e.log.Warn("persist resumed sandbox", "id", id, "err", err)
	}
	e.log.Info("sandbox resumed", "id", id, "prefetched", prefetched, "took", time.Since(t0))
	return nil
}

// pauseOne and resumeOne answer the per-sandbox API calls.
func (e *Edge) pauseOne(ctx context.Context, id string) (any, error) {
	sb, err := e.lookup(id)
	if err != nil {
		return nil, err
	}
	<-sb.ready
	if err := e.pause(ctx, sb, "requested"); err != nil {
		return nil, err
	}
	v := sb.view()
	return &v, nil
}

func (e *Edge) resumeOne(ctx context.Context, id string, prefetch bool) (any, error) {
	sb, err := e.lookup(id)
	if err != nil {
		return nil, err
	}
	<-sb.ready
	sb.mu.Lock()
	st := sb.rec.Sandbox.State
	stopping := sb.stopping
	sb.mu.Unlock()
	if (st != api.StatePaused && st != api.StateRunning) || stopping {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s is %s", id, st)}
	}
	if err := e.resume(ctx, sb, prefetch); err != nil {
		return nil, err
	}
	v := sb.view()
	return &v, nil
}

// pauseMatching pauses (or resumes) every sandbox of this node whose labels
// all match, concurrently.
func (e *Edge) pauseMatching(ctx context.Context, req *PauseMatchingRequest) (*api.PauseResult, error) {
	if len(req.Labels) == 0 {
		return nil, &api.Error{Code: api.CodeInvalid, Message: "at least one label is required"}
	}
	want := api.StateRunning
	if req.Resume {
		want = api.StatePaused
	}
	var victims []*sandbox
	for _, v := range e.list(&ListRequest{Labels: req.Labels, State: want}).Sandboxes {
		if sb, err := e.lookup(v.ID); err == nil {
			victims = append(victims, sb)
		}
	}
	out := &api.PauseResult{Sandboxes: []string{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, sb := range victims {
		wg.Add(1)
		sem <- struct{}{}
		go func(sb *sandbox) {
			defer wg.Done()
			defer func() { <-sem }()
			var err error
			if req.Resume {
				err = e.resume(ctx, sb, true)
			} else {
				err = e.pause(ctx, sb, "job-level pause")
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if out.Errors == nil {
					out.Errors = map[string]string{}
				}
				out.Errors[sb.rec.Sandbox.ID] = err.Error()
				return
			}
			out.Sandboxes = append(out.Sandboxes, sb.rec.Sandbox.ID)
		}(sb)
	}
	wg.Wait()
	return out, nil
}

// setTimeout makes a live sandbox expire TTL seconds from now (E2B's
// setTimeout): its TTL becomes its lifetime so far plus that; and/or
// replaces its idle timeout, counted from now.
func (e *Edge) setTimeout(req *TimeoutRequest) (any, error) {
	if req.TTL < 0 || (req.TTL == 0 && req.IdleTimeout == nil) || (req.IdleTimeout != nil && *req.IdleTimeout < 0) {
		return nil, badRequest("want a positive ttl or an idle_timeout of 0 or more")
	}
	sb, err := e.lookup(req.ID)
	if err != nil {
		return nil, err
	}
	<-sb.ready
	now := time.Now().UTC()
	sb.mu.Lock()
	st := sb.rec.Sandbox.State
	if (st != api.StateRunning && st != api.StatePaused) || sb.stopping {
		sb.mu.Unlock()
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s is %s", req.ID, stateWord(sb))}
	}
	if req.TTL > 0 {
		expires := now.Add(time.Duration(req.TTL) * time.Second)
		sb.rec.Sandbox.ExpiresAt = &expires
		sb.rec.Sandbox.TTL = int64(expires.Sub(sb.rec.Sandbox.CreatedAt).Round(time.Second) / time.Second)
		sb.rec.Spec.TTL = sb.rec.Sandbox.TTL
	}
	if req.IdleTimeout != nil {
		// Counted from now: this call is the sandbox's latest operation.
		sb.rec.Spec.IdleTimeout, sb.rec.Sandbox.IdleTimeout = *req.IdleTimeout, *req.IdleTimeout
		sb.lastActive = now
	}
	sb.mu.Unlock()
	if err := e.persistSandbox(sb); err != nil {
		return nil, fmt.Errorf("edge: persist timeout of %s: %w", req.ID, err)
	}
	v := sb.view()
	return &v, nil
}
