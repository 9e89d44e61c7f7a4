// Package pause is the edge's pause and resume of sandboxes, written
// against the lifecycle core (internal/edge/core). A pause freezes a
// running sandbox and pushes its memory out (to swap where the host has
// it, page cache dropped, runtime.Reclaimer); a resume gives its memory
// limit back, asks the kernel to read its memory back in (prefetch) and
// thaws it. The core keeps the sandbox's record (core.Pausable): the state
// turns "paused" and is written before the freeze, so that a crash
// between the two leaves a record the restart resolves (the core's
// adoption thaws, attaches and calls Refreeze), and an operation arriving
// meanwhile waits for the pause and then resumes the sandbox.
//
// Lock order: a sandbox's pause lock (core.Pausable.PauseLock, the core's
// sandbox.pmu) is held over a whole pause, refreeze or resume, including
// the runtime's freeze or thaw; under it the core takes its record locks
// (sandbox.wmu, then sandbox.mu) in Persist and the state methods. The
// core's Edge.mu is never held here. Matching's result lock is a leaf.
package pause

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/edge/core"
	"github.com/warrenhq/warren/internal/runtime"
)

// matchingAtOnce bounds the pauses (or resumes) Matching runs at once.
const matchingAtOnce = 8

// Pauser pauses and resumes the node's sandboxes.
type Pauser struct {
	core core.Core
	rt   runtime.Runtime
	rc   runtime.Reclaimer // nil: the runtime only freezes
}

// New returns the pauser of the node whose core is c and runtime rt.
func New(c core.Core, rt runtime.Runtime) *Pauser {
	p := &Pauser{core: c, rt: rt}
	p.rc, _ = rt.(runtime.Reclaimer)
	return p
}

// Pause freezes a running sandbox and pushes its memory out; a paused one
// is left as it is, one that does not run is a conflict.
func (p *Pauser) Pause(ctx context.Context, sb core.Pausable, why string) error {
	l := sb.PauseLock()
	l.Lock()
	defer l.Unlock()
	h, already, err := sb.MarkPaused()
	if already || err != nil {
		return err
	}
	// The intent first: a crash from here on leaves a record that says
	// paused, which the restart resolves (reconcile thaws, attaches and
	// pauses again). A record saying running over a frozen agent would
	// make the restart call an agent that cannot answer.
	if err := sb.Persist(); err != nil {
		sb.SetRunning(false)
		return fmt.Errorf("edge: record the pause of %s: %w", sb.ID(), err)
	}
	return p.freezeAndReclaim(ctx, sb, h, why, nil)
}

// Refreeze pauses again a sandbox recorded paused whose container the
// core's adoption thawed to attach its agent. It stays "paused"
// throughout; a resume that came first wins (nothing to do). frozen, when
// set, is called once the freeze is over (either way), before the reclaim.
func (p *Pauser) Refreeze(ctx context.Context, sb core.Pausable, why string, frozen func()) error {
	l := sb.PauseLock()
	l.Lock()
	defer l.Unlock()
	state, live, h, _ := sb.PauseState()
	if state != api.StatePaused || !live {
		if frozen != nil {
			frozen()
		}
		return nil
	}
	return p.freezeAndReclaim(ctx, sb, h, why, frozen)
}

// freezeAndReclaim freezes sb (recorded paused already) and pushes its
// memory out; a freeze that fails leaves it thawed and running again.
// frozen, when set, is called once the freeze is over (either way), before
// the reclaim. The caller holds sb's pause lock.
func (p *Pauser) freezeAndReclaim(ctx context.Context, sb core.Pausable, h runtime.Handle, why string, frozen func()) error {
	id, log := sb.ID(), p.core.Logger()
	defer sb.HoldCPU()()
	t0 := time.Now()
	err := p.rt.Freeze(ctx, h)
	if frozen != nil {
		frozen()
	}
	if err != nil {
		// A freeze that timed out leaves the cgroup FREEZING: thaw it.
		if terr := p.rt.Thaw(context.WithoutCancel(ctx), h); terr != nil {
			log.Warn("thaw after a failed freeze", "id", id, "err", terr)
		}
		sb.SetRunning(false)
		if perr := sb.Persist(); perr != nil {
			log.Warn("persist sandbox after a failed freeze", "id", id, "err", perr)
		}
		return fmt.Errorf("edge: freeze %s: %w", id, err)
	}
	var before, after int64
	if p.rc != nil {
		var err error
		if before, after, err = p.rc.Reclaim(ctx, h); err != nil {
			log.Warn("reclaim paused sandbox", "id", id, "err", err)
		}
	}
	sb.SetPausedAt(time.Now().UTC())
	if err := sb.Persist(); err != nil {
		log.Warn("persist paused sandbox", "id", id, "err", err)
	}
	log.Info("sandbox paused", "id", id, "why", why, "memory_before", before, "memory_after", after, "took", time.Since(t0))
	return nil
}

// Resume thaws a paused sandbox after giving its memory limit back and,
// with prefetch, after asking the kernel to read its swapped-out memory
// back (the reads run while the sandbox thaws and serves its first call).
// A sandbox that is not paused is left as it is.
func (p *Pauser) Resume(ctx context.Context, sb core.Pausable, prefetch bool) error {
	l := sb.PauseLock()
	l.Lock()
	defer l.Unlock()
	state, live, h, mem := sb.PauseState()
	if state != api.StatePaused || !live {
		return nil
	}
	id, log := sb.ID(), p.core.Logger()
	defer sb.HoldCPU()()
	t0 := time.Now()
	var prefetched int64
	if p.rc != nil {
		if err := p.rc.Restore(ctx, h, mem); err != nil {
			return fmt.Errorf("edge: restore memory of %s: %w", id, err)
		}
		if prefetch {
			// The agent first, before the thaw: it serves the first call.
			var err error
			if prefetched, err = p.rc.Prefetch(ctx, h, false); err != nil {
				log.Warn("prefetch resumed sandbox's agent", "id", id, "err", err)
			}
		}
	}
	if err := p.rt.Thaw(ctx, h); err != nil {
		return fmt.Errorf("edge: thaw %s: %w", id, err)
	}
	if p.rc != nil {
		// A VM's clock stood still in its memory snapshot.
		setGuestClock(ctx, sb, log)
	}
	if p.rc != nil && prefetch {
		// The rest while the sandbox already runs: queuing the reads of a
		// big working set takes tens of milliseconds.
		p.core.Go(func() {
			if n, err := p.rc.Prefetch(context.WithoutCancel(ctx), h, true); err != nil {
				log.Warn("prefetch resumed sandbox", "id", id, "err", err)
			} else {
				log.Debug("sandbox prefetched", "id", id, "bytes", n)
			}
		})
	}
	sb.SetRunning(true)
	// A crash before this write leaves a record saying paused over a
	// thawed sandbox: the restart pauses it again (consistent).
	if err := sb.Persist(); err != nil {
		log.Warn("persist resumed sandbox", "id", id, "err", err)
	}
	log.Info("sandbox resumed", "id", id, "prefetched", prefetched, "took", time.Since(t0))
	return nil
}

// Matching pauses (or, with resume, resumes) every one of sbs,
// matchingAtOnce at a time, and says which it did and why not the others.
func (p *Pauser) Matching(ctx context.Context, sbs []core.Pausable, resume bool) *api.PauseResult {
	out := &api.PauseResult{Sandboxes: []string{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, matchingAtOnce)
	for _, sb := range sbs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var err error
			if resume {
				err = p.Resume(ctx, sb, true)
			} else {
				err = p.Pause(ctx, sb, "job-level pause")
			}
			id := sb.ID()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if out.Errors == nil {
					out.Errors = map[string]string{}
				}
				out.Errors[id] = err.Error()
				return
			}
			out.Sandboxes = append(out.Sandboxes, id)
		}()
	}
	wg.Wait()
	return out
}

// setGuestClock sets the clock of sb's guest to the host's and lets it
// report free pages again (agentproto.OpClock: a container's agent does
// nothing); a failure is logged, the sandbox runs on.
func setGuestClock(ctx context.Context, sb core.Pausable, log *slog.Logger) {
	client := sb.Agent()
	if client == nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// A VM restored from its pause snapshot runs on RAM of its own.
	req := &agentproto.ClockRequest{UnixNano: time.Now().UnixNano(), OwnRAM: true}
	if err := client.Call(cctx, agentproto.OpClock, req, nil, nil); err != nil {
		log.Warn("set the clock of a resumed sandbox", "id", sb.ID(), "err", err)
	}
}
