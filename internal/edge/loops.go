package edge

// Lock order: Edge.mu, then sandbox.mu (reap, NodeStatus); Edge.usageMu
// is a leaf; reap's record writes (sandbox.wmu) come after Edge.mu is
// released (the whole order is in edge.go).

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/hoststat"
	"github.com/warrenhq/warren/internal/runtime"
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
		case <-e.beatNow:
		}
	}
}

// Heartbeat asks for a heartbeat now rather than at the next tick: a
// watcher that just subscribed (the apiserver of `warren serve`, waiting
// for its node) learns of this node at once, not a period later. It does
// not block; requests made while one is pending are one request.
func (e *Edge) Heartbeat() {
	select {
	case e.beatNow <- struct{}{}:
	default:
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
		if sb.live() && !sb.pooled() { // warm pool members are nobody's: not reported lost
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

// tiers are the tiers the node offers: its runtime's, or each of a
// runtime of several tiers (internal/runtime/tiers).
func (e *Edge) tiers() []string {
	if t, ok := e.cfg.Runtime.(interface{ Tiers() []string }); ok {
		return t.Tiers()
	}
	return []string{e.cfg.Runtime.Name()}
}

// vmInfo is the node's VM accelerator and guest kernel (empty without a
// VM tier).
func (e *Edge) vmInfo() (accel, kernel string) {
	if a, ok := e.cfg.Runtime.(interface{ Accel() string }); ok {
		accel = a.Accel()
	}
	if k, ok := e.cfg.Runtime.(interface{ KernelVersion() string }); ok {
		kernel = k.KernelVersion()
	}
	return accel, kernel
}

// NodeStatus is this node's heartbeat.
func (e *Edge) NodeStatus() api.Node {
	n := api.Node{
		Name: e.cfg.Node, State: "up", CPUCapacity: e.cfg.CPUCapacity, MemoryMB: e.cfg.MemoryMB,
		Tiers: e.tiers(), LastHeartbeat: time.Now().UTC(), Labels: e.cfg.Labels,
		States: map[string]int{}, Projects: map[string]api.Usage{}, Jobs: map[string]int{},
		NetworkGroups: map[string]int{},
		CPUOvercommit: e.cfg.CPUOvercommit, MemoryOvercommit: e.cfg.MemoryOvercommit,
		DiskMB: e.cfg.DiskMB, DiskOvercommit: e.cfg.DiskOvercommit,
		SandboxesByState: map[string]int{}, SandboxesByPriority: map[string]int{},
		Pools: []api.NodePool{}, Features: e.nodeFeatures(), DataAddr: e.dataAddr,
		NetworkDenied: e.denials.Totals(),
	}
	n.Accelerator, n.VMKernel = e.vmInfo()
	e.measure(&n)
	n.Recycling = e.shelf.Stats()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, sb := range e.sandboxes {
		sb.mu.Lock()
		st, prio, pooled := sb.rec.Sandbox.State, sb.rec.Spec.Priority, sb.pool != ""
		spec := &sb.rec.Spec
		live := (st == api.StateRunning || st == api.StateCreating || st == api.StatePaused) && !sb.reclaimed
		if live {
			// Pool members hold resources too, so they count as requested.
			n.CPURequested += spec.CPU
			n.MemRequested += spec.MemoryMB
			n.DiskRequestedMB += spec.DiskMB
		}
		if pooled {
			sb.mu.Unlock()
			if live {
				n.SandboxesByState["pooled"]++
			}
			continue
		}
		n.States[st]++
		n.SandboxesByState[st]++
		if live {
			n.Sandboxes++
			n.SandboxesByPriority[prio]++
			u := n.Projects[spec.Project]
			u.Sandboxes++
			u.CPU += spec.CPU
			u.MemoryMB += spec.MemoryMB
			n.Projects[spec.Project] = u
			if j, ok := spec.Labels["job"]; ok {
				n.Jobs[j]++
			}
			if spec.Network != nil && spec.Network.Group != "" {
				n.NetworkGroups[api.NetworkGroupKey(spec.Project, spec.Network.Group)]++
			}
			sb.cpu.AddLocked(&n.Elastic, &sb.rec.Spec)
		}
		sb.mu.Unlock()
	}
	n.Pools = append(n.Pools, e.pools.NodeView()...)
	n.Pools = append(n.Pools, e.fn.View()...)
	// Idle FnCall workers give way to any create (admission reclaims
	// them), so placement must not count them as taken.
	for _, s := range e.fn.Idle() {
		n.CPURequested -= s.CPU
		n.MemRequested -= s.MemoryMB
	}
	sort.Slice(n.Pools, func(i, j int) bool { return n.Pools[i].Name < n.Pools[j].Name })
	e.classNode(&n.Elastic)
	return n
}

// measure fills in what the node view measures: host memory, swap, PSI
// and the sandboxes' CPU and memory use.
func (e *Edge) measure(n *api.Node) {
	if m, err := hoststat.ReadMemory(); err == nil {
		n.MemoryAvailableMB = m.Available >> 20
		n.SwapTotalMB = m.SwapTotal >> 20
		n.SwapUsedMB = m.SwapUsed() >> 20
		n.Features.Swap = m.SwapTotal > 0
	}
	if p, err := hoststat.ReadPressure("memory"); err == nil {
		n.MemoryPressure = p.Avg10
	}
	if e.cfg.DiskSpace != nil {
		if _, avail, err := e.cfg.DiskSpace(); err == nil {
			n.DiskAvailableMB = avail
		}
	}
	if p, err := hoststat.ReadPressure("cpu"); err == nil {
		n.CPUPressure = p.Avg10
	}
	ur, ok := e.cfg.Runtime.(runtime.UsageReporter)
	if !ok {
		return
	}
	u, err := ur.Usage()
	if err != nil {
		return
	}
	n.MemoryUsedMB = u.MemoryBytes >> 20
	now := time.Now()
	e.usageMu.Lock()
	defer e.usageMu.Unlock()
	switch {
	case e.lastAt.IsZero() || u.CPUSeconds < e.lastUsage.CPUSeconds:
		e.lastUsage, e.lastAt = u, now
	case now.Sub(e.lastAt) > 500*time.Millisecond:
		e.cpuRate = (u.CPUSeconds - e.lastUsage.CPUSeconds) / now.Sub(e.lastAt).Seconds()
		e.lastUsage, e.lastAt = u, now
	}
	n.CPUUsed = e.cpuRate
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
	var pauses, flush []*sandbox
	e.mu.Lock()
	for id, sb := range e.sandboxes {
		sb.mu.Lock()
		st := sb.rec.Sandbox.State
		if activityToFlushLocked(sb, now) {
			flush = append(flush, sb)
		}
		switch {
		case st == api.StateStopped || st == api.StateFailed:
			delete(e.live, sb)
			if !sb.stoppedAt.IsZero() && now.Sub(sb.stoppedAt) > e.cfg.TombstoneFor {
				delete(e.sandboxes, id)
				e.denials.Forget(id)
			}
		case (st != api.StateRunning && st != api.StatePaused) || sb.stopping:
		case sb.rec.Sandbox.ExpiresAt != nil && now.After(*sb.rec.Sandbox.ExpiresAt):
			victims = append(victims, victim{sb, "ttl expired"})
		case st == api.StateRunning && sb.rec.Spec.IdleTimeout > 0 && sb.inflight == 0 &&
			now.Sub(sb.lastActive) > time.Duration(sb.rec.Spec.IdleTimeout)*time.Second:
			if sb.rec.Spec.IdleTimeoutAction == api.IdleActionPause {
				pauses = append(pauses, sb)
			} else {
				victims = append(victims, victim{sb, "idle timeout"})
			}
		}
		sb.mu.Unlock()
	}
	e.mu.Unlock()
	for _, sb := range flush {
		if err := e.persistSandbox(sb); err != nil {
			e.log.Debug("persist last activity", "id", sb.rec.Sandbox.ID, "err", err)
		}
	}
	e.shelf.Expire(e.cfg.RecycleIdle)
	e.mu.Lock()
	closing, pressed := e.closing, e.pressureErr != nil
	e.mu.Unlock()
	if !closing {
		e.fn.Shrink(now, pressed)
	}
	for _, v := range victims {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.stop(ctx, v.sb, api.StateStopped, v.reason)
		}()
	}
	for _, sb := range pauses {
		sb.mu.Lock()
		if sb.pausing {
			sb.mu.Unlock()
			continue
		}
		sb.pausing = true
		sb.mu.Unlock()
		e.wg.Add(1)
		go func(sb *sandbox) {
			defer e.wg.Done()
			if err := e.pauser.Pause(ctx, e.pausable(sb), "idle timeout"); err != nil {
				e.log.Warn("idle pause", "id", sb.rec.Sandbox.ID, "err", err)
			}
			sb.mu.Lock()
			sb.pausing = false
			sb.mu.Unlock()
		}(sb)
	}
}

// activityToFlushLocked records sb's last activity in its record (to be
// persisted by the caller) when it has moved on by a tenth of its idle
// timeout (at least a second) since last written, so a restart keeps the
// idle clock: it may then run short by at most that much. Only sandboxes
// with an idle timeout and a record of their own are concerned. A sandbox
// busy now is active now.
func activityToFlushLocked(sb *sandbox, now time.Time) bool {
	st := sb.rec.Sandbox.State
	if sb.rec.Spec.IdleTimeout <= 0 || sb.stopping || sb.pool != "" || sb.stateless || sb.rec.Handle == nil ||
		(st != api.StateRunning && st != api.StatePaused) {
		return false
	}
	la := sb.lastActive
	if sb.inflight > 0 {
		la = now
	}
	step := max(time.Second, time.Duration(sb.rec.Spec.IdleTimeout)*time.Second/10)
	if la.Sub(sb.rec.Sandbox.LastActive) < step {
		return false
	}
	sb.rec.Sandbox.LastActive = la.UTC()
	return true
}
