package edge

// Lock order: sandbox.pmu (held over the freeze, internal/edge/pause),
// then sandbox.wmu (one record write), then sandbox.mu; Edge.mu is not
// taken under sandbox.mu (the whole order is in edge.go).

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge/core"
	"github.com/warrenhq/warren/internal/runtime"
)

// Pause and resume are internal/edge/pause's (its package comment); the
// core answers the calls (pauseOne, resumeOne, pauseMatching), pauses for
// idleness (the reaper), resumes for any operation (acquire) and refreezes
// after a restart (adopt.go), each through e.pauser with the sandbox as a
// core.Pausable (pausable).

// pausable is sb as pause sees it: its record, written through e.
type pausable struct {
	*sandbox
	e *Edge
}

var _ core.Pausable = pausable{}

func (e *Edge) pausable(sb *sandbox) pausable { return pausable{sandbox: sb, e: e} }

func (p pausable) PauseLock() sync.Locker { return &p.pmu }
func (p pausable) Persist() error         { return p.e.persistSandbox(p.sandbox) }

func (p pausable) PauseState() (state string, live bool, h runtime.Handle, memoryMB int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	live = !p.stopping && p.inst != nil
	if live {
		h = p.inst.Handle
	}
	return p.rec.Sandbox.State, live, h, p.rec.Spec.MemoryMB
}

func (p pausable) MarkPaused() (runtime.Handle, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.rec.Sandbox.State == api.StatePaused {
		return runtime.Handle{}, true, nil
	}
	if p.rec.Sandbox.State != api.StateRunning || p.stopping || p.inst == nil {
		return runtime.Handle{}, false, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s is %s", p.rec.Sandbox.ID, stateWord(p.sandbox))}
	}
	p.rec.Sandbox.State = api.StatePaused
	return p.inst.Handle, false, nil
}

func (p pausable) SetRunning(active bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rec.Sandbox.State = api.StateRunning
	p.rec.Sandbox.PausedAt = nil
	if active {
		p.lastActive = time.Now()
	}
}

// HoldCPU raises sb to its full level (a thaw, for an idle level that
// freezes) for a pause or a resume; the release lowers it again, so the
// level holds after whatever the pause or resume did to the freezer.
func (p pausable) HoldCPU() func() {
	return p.e.elastic.Hold(cpuSandbox{p.sandbox})
}

func (p pausable) SetPausedAt(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rec.Sandbox.PausedAt = &t
}

// pauseOne and resumeOne answer the per-sandbox API calls.
func (e *Edge) pauseOne(ctx context.Context, id string) (any, error) {
	sb, err := e.lookup(id)
	if err != nil {
		return nil, err
	}
	<-sb.ready
	if err := e.pauser.Pause(ctx, e.pausable(sb), "requested"); err != nil {
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
	if err := e.pauser.Resume(ctx, e.pausable(sb), prefetch); err != nil {
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
	var victims []core.Pausable
	for _, v := range e.list(&ListRequest{Labels: req.Labels, State: want}).Sandboxes {
		if sb, err := e.lookup(v.ID); err == nil {
			victims = append(victims, e.pausable(sb))
		}
	}
	return e.pauser.Matching(ctx, victims, req.Resume), nil
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
