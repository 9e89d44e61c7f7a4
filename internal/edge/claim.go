package edge

import (
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge/core"
)

// Lock order: Edge.mu, then pool.Pools.mu, then sandbox.mu (claimLocked);
// the audit's ring lock (audit.State.Reset) is a leaf (the whole order is
// in edge.go).

// claimLocked hands out a ready warm-pool member (internal/edge/pool) for
// a create of spec under the final id, or nil when no pool has one. Called
// with e.mu held (create).
func (e *Edge) claimLocked(id string, spec *api.CreateSandboxRequest) *sandbox {
	got := e.pools.Take(spec, func(m core.Sandbox, pool string) bool {
		return e.claimMemberLocked(m.(*sandbox), id, spec, pool)
	})
	if got == nil {
		return nil
	}
	return got.(*sandbox)
}

// claimMemberLocked makes pool member sb the sandbox id of spec: its
// record takes the create's id, spec and clocks, and keeps the member's
// name as its storage. It refuses (false) a member that no longer runs.
// Called with e.mu held.
func (e *Edge) claimMemberLocked(sb *sandbox, id string, spec *api.CreateSandboxRequest, pool string) bool {
	sb.mu.Lock()
	if sb.rec.Sandbox.State != api.StateRunning || sb.stopping || sb.inst == nil {
		sb.mu.Unlock()
		return false
	}
	internal := sb.rec.Sandbox.ID
	now := time.Now().UTC()
	expires := now.Add(time.Duration(spec.TTL) * time.Second)
	if sb.rec.Storage == "" { // else a recycled container's name
		sb.rec.Storage = internal
	}
	sb.rec.Spec = *spec
	e.cpuOpenLocked(sb) // the claimant's idle_cpu and always_on
	sb.rec.Sandbox.ID = id
	sb.rec.Sandbox.Labels = copyMap(spec.Labels)
	sb.rec.Sandbox.TTL = spec.TTL
	sb.rec.Sandbox.IdleTimeout = spec.IdleTimeout
	sb.rec.Sandbox.IdleAction = spec.IdleTimeoutAction
	sb.rec.Sandbox.CreatedAt = now
	sb.rec.Sandbox.ExpiresAt = &expires
	sb.rec.Sandbox.Pool = pool
	sb.lastActive = now
	sb.rec.Sandbox.LastActive = now
	sb.pool = ""
	sb.mu.Unlock()
	sb.audit.Reset() // what ran while it waited in the pool is nobody's
	sb.audit.SetPolicy(spec.Audit)
	e.dropLocked(internal)
	e.putLocked(id, sb)
	return true
}
