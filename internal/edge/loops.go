package edge

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
)

func (e *Edge) heartbeatLoop(ctx context.Context) {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.HeartbeatEvery)
	defer t.Stop()
	var lastImages time.Time
	var images []string
	for {
		if time.Since(lastImages) > 10*time.Second {
			lastImages = time.Now()
			if imgs, err := e.cfg.Images.ListImages(ctx); err == nil {
				images = images[:0]
				for _, img := range imgs {
					images = append(images, img.Name)
				}
			}
		}
		n := e.NodeStatus()
		n.Images = images
		_ = e.cfg.Bus.Publish(bus.SubjectHeartbeat, n)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (e *Edge) rosterLoop(ctx context.Context) {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.RosterEvery)
	defer t.Stop()
	for {
		e.writeRoster(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// writeRoster stores the ids (and projects) of this node's live sandboxes in
// the roster bucket, when they changed: one write per node and interval, so
// a watcher can name the sandboxes a dead node took with it.
func (e *Edge) writeRoster(ctx context.Context) {
	var b strings.Builder
	e.mu.Lock()
	ids := make([]string, 0, len(e.sandboxes))
	for id, sb := range e.sandboxes {
		if sb.live() {
			ids = append(ids, id+" "+sb.rec.Spec.Project)
		}
	}
	e.mu.Unlock()
	sort.Strings(ids)
	for _, l := range ids {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	s := b.String()
	if s == e.lastRoster {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := e.roster.Put(cctx, e.cfg.Node, []byte(s)); err != nil {
		e.log.Debug("roster write failed", "err", err)
		return
	}
	e.lastRoster = s
}

// NodeStatus is this node's heartbeat.
func (e *Edge) NodeStatus() api.Node {
	n := api.Node{
		Name: e.cfg.Node, State: "up", CPUCapacity: e.cfg.CPUCapacity, MemoryMB: e.cfg.MemoryMB,
		Tiers: []string{e.cfg.Runtime.Name()}, LastHeartbeat: time.Now().UTC(), Labels: e.cfg.Labels,
		States: map[string]int{}, Projects: map[string]api.Usage{}, Jobs: map[string]int{},
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, sb := range e.sandboxes {
		sb.mu.Lock()
		st := sb.rec.Sandbox.State
		spec := &sb.rec.Spec
		n.States[st]++
		if st == api.StateRunning || st == api.StateCreating {
			n.Sandboxes++
			n.CPURequested += spec.CPU
			n.MemRequested += spec.MemoryMB
			u := n.Projects[spec.Project]
			u.Sandboxes++
			u.CPU += spec.CPU
			u.MemoryMB += spec.MemoryMB
			n.Projects[spec.Project] = u
			if j, ok := spec.Labels["job"]; ok {
				n.Jobs[j]++
			}
		}
		sb.mu.Unlock()
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
