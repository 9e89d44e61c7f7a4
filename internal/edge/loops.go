package edge

import (
	"context"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
)

func (e *Edge) heartbeatLoop(ctx context.Context) {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.HeartbeatEvery)
	defer t.Stop()
	for {
		_ = e.cfg.Bus.Publish(bus.SubjectHeartbeat, e.NodeStatus())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// NodeStatus is this node's heartbeat.
func (e *Edge) NodeStatus() api.Node {
	n := api.Node{
		Name: e.cfg.Node, State: "up", CPUCapacity: e.cfg.CPUCapacity, MemoryMB: e.cfg.MemoryMB,
		Tiers: []string{e.cfg.Runtime.Name()}, LastHeartbeat: time.Now().UTC(),
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, sb := range e.sandboxes {
		if sb.live() {
			n.Sandboxes++
			n.CPURequested += sb.rec.Spec.CPU
			n.MemRequested += sb.rec.Spec.MemoryMB
		}
	}
	return n
}

func (e *Edge) reaperLoop(ctx context.Context) {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.ReaperEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			e.reap(ctx)
		}
	}
}

// reap stops sandboxes past their TTL or idle timeout and forgets old tombstones.
func (e *Edge) reap(ctx context.Context) {
	now := time.Now()
	type victim struct {
		sb     *sandbox
		reason string
	}
	var victims []victim
	e.mu.Lock()
	for id, sb := range e.sandboxes {
		sb.mu.Lock()
		st := sb.rec.Sandbox.State
		switch {
		case st == api.StateStopped || st == api.StateFailed:
			if !sb.stoppedAt.IsZero() && now.Sub(sb.stoppedAt) > e.cfg.TombstoneFor {
				delete(e.sandboxes, id)
			}
		case st != api.StateRunning || sb.stopping:
		case sb.rec.Sandbox.ExpiresAt != nil && now.After(*sb.rec.Sandbox.ExpiresAt):
			victims = append(victims, victim{sb, "ttl expired"})
		case sb.rec.Spec.IdleTimeout > 0 && sb.inflight == 0 &&
			now.Sub(sb.lastActive) > time.Duration(sb.rec.Spec.IdleTimeout)*time.Second:
			victims = append(victims, victim{sb, "idle timeout"})
		}
		sb.mu.Unlock()
	}
	e.mu.Unlock()
	for _, v := range victims {
		go e.stop(ctx, v.sb, api.StateStopped, v.reason)
	}
}
