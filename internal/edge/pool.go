package edge

// Lock order: Edge.mu, then sandbox.mu (claimLocked); auditRing.mu is a
// leaf (the whole order is in edge.go).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// Warm pools. The edge keeps Size sandboxes of a pool's shape created and
// ready; a matching create claims one (claim) instead of starting a new
// one, and a filler goroutine per pool refills it in the background.
//
// Ids: a pooled sandbox is created under an internal name (a fresh
// sb-<node>-<random> that no client ever sees) and gets its final id, the
// one the apiserver chose for the create, when it is claimed. Its cgroup,
// state dir and writable layer keep the internal name (record.Storage).
// So ids are still chosen by the caller, which keeps creates idempotent,
// and never reused. Pool members have no record on disk until they are
// claimed: after a crash, reconcile frees them like any leftover and the
// fillers make new ones.

// poolFillers is how many sandboxes one pool creates at once.
const poolFillers = 2

type pool struct {
	name    string
	project string                   // the owner: members serve sandboxes of it and below
	spec    api.CreateSandboxRequest // normalized
	key     string

	// under Edge.mu
	size     int
	ready    []*sandbox
	creating int
	claimed  int64
	lastErr  string
	kick     chan struct{}
	cancel   context.CancelFunc
}

// id is the pool's key in Edge.pools: pool names are per project, like
// trajectories' (TrajKey).
func (p *pool) id() string { return TrajKey(p.project, p.name) }

// poolKey is what a create must match to be served from a pool.
func poolKey(s *api.CreateSandboxRequest) (string, bool) {
	if len(s.Env) > 0 || s.User != "" || s.Hostname != "sandbox" || s.Network != nil || s.Display {
		return "", false
	}
	return fmt.Sprintf("%s|%s|%g|%d|%d|%d|%s", s.Tier, s.Image, s.CPU, s.MemoryMB, s.DiskMB, s.Pids, s.Priority), true
}

func truncateName(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

func (e *Edge) poolsPath() string { return filepath.Join(e.cfg.DataDir, "edge", "pools.json") }

// poolsLocked lists the pool definitions (for persistence and views).
func (e *Edge) poolViewLocked(p *pool) api.Pool {
	n := 0
	for _, sb := range p.ready {
		if sb.poolReady() {
			n++
		}
	}
	return api.Pool{Name: p.name, Project: p.project, Tier: p.spec.Tier, Image: p.spec.Image, CPU: p.spec.CPU, MemoryMB: p.spec.MemoryMB,
		DiskMB: p.spec.DiskMB, Pids: p.spec.Pids, Priority: p.spec.Priority, Size: p.size, Ready: n,
		Creating: p.creating, Claimed: p.claimed, Error: p.lastErr}
}

func (sb *sandbox) poolReady() bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.rec.Sandbox.State == api.StateRunning && !sb.stopping
}

// savePoolsLocked writes the pool definitions (DataDir/edge/pools.json).
func (e *Edge) savePoolsLocked() error {
	defs := make([]api.PoolRequest, 0, len(e.pools))
	for _, p := range e.pools {
		defs = append(defs, api.PoolRequest{Name: p.name, Project: p.project, Tier: p.spec.Tier, Image: p.spec.Image, CPU: p.spec.CPU,
			MemoryMB: p.spec.MemoryMB, DiskMB: p.spec.DiskMB, Pids: p.spec.Pids, Priority: p.spec.Priority, Size: p.size})
	}
	sort.Slice(defs, func(i, j int) bool { return defs[i].Name < defs[j].Name })
	b, err := json.Marshal(defs)
	if err != nil {
		return err
	}
	tmp := e.poolsPath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("edge: save pools: %w", err)
	}
	return os.Rename(tmp, e.poolsPath())
}

// loadPools starts the pools saved by an earlier run.
func (e *Edge) loadPools(ctx context.Context) {
	b, err := os.ReadFile(e.poolsPath())
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	var defs []api.PoolRequest
	if err == nil {
		err = json.Unmarshal(b, &defs)
	}
	if err != nil {
		e.log.Warn("cannot read saved pools", "err", err)
		return
	}
	for i := range defs {
		if _, err := e.putPool(ctx, &defs[i]); err != nil {
			e.log.Warn("cannot restore pool", "pool", defs[i].Name, "err", err)
		}
	}
}

// putPool creates a pool or changes its size.
func (e *Edge) putPool(ctx context.Context, r *api.PoolRequest) (*api.Pool, error) {
	spec, aerr := PoolSpec(r)
	if aerr != nil {
		return nil, aerr
	}
	if r.Name == "" {
		return nil, &api.Error{Code: api.CodeInvalid, Message: "pool name is required"}
	}
	key, _ := poolKey(&spec)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return nil, &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonShuttingDown, Message: "node is shutting down"}
	}
	p := e.pools[TrajKey(r.Project, r.Name)]
	if p != nil && p.key != key {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("pool %s exists with another shape; delete it first", r.Name)}
	}
	for _, q := range e.pools {
		if q.key == key && q.name != r.Name && q.project == r.Project {
			return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("pool %s already keeps this shape", q.name)}
		}
	}
	if p == nil {
		p = &pool{name: r.Name, project: r.Project, spec: spec, key: key, kick: make(chan struct{}, 1)}
		e.pools[p.id()] = p
		fctx, cancel := context.WithCancel(e.runCtx)
		p.cancel = cancel
		e.wg.Add(1)
		go e.fill(fctx, p)
	}
	p.size = r.Size
	if err := e.savePoolsLocked(); err != nil {
		e.log.Warn("save pools", "err", err)
	}
	var extra []*sandbox
	for len(p.ready) > p.size {
		extra = append(extra, p.ready[len(p.ready)-1])
		p.ready = p.ready[:len(p.ready)-1]
	}
	e.dropPoolMembers(extra)
	p.poke()
	v := e.poolViewLocked(p)
	return &v, nil
}

func (p *pool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// dropPoolMembers stops pool members no longer wanted, in the background.
func (e *Edge) dropPoolMembers(sbs []*sandbox) {
	for _, sb := range sbs {
		e.wg.Add(1)
		go func(sb *sandbox) {
			defer e.wg.Done()
			e.stop(context.Background(), sb, api.StateStopped, "pool shrunk")
		}(sb)
	}
}

func (e *Edge) deletePool(project, name string) (*api.Pool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.pools[TrajKey(project, name)]
	if p == nil {
		return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("pool %s not found", truncateName(name))}
	}
	v := e.poolViewLocked(p)
	delete(e.pools, p.id())
	p.cancel()
	e.dropPoolMembers(p.ready)
	p.ready = nil
	if err := e.savePoolsLocked(); err != nil {
		e.log.Warn("save pools", "err", err)
	}
	return &v, nil
}

func (e *Edge) listPools() *api.PoolList {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := &api.PoolList{Pools: []api.Pool{}}
	for _, p := range e.pools {
		out.Pools = append(out.Pools, e.poolViewLocked(p))
	}
	sort.Slice(out.Pools, func(i, j int) bool { return out.Pools[i].Name < out.Pools[j].Name })
	return out
}

// fill keeps p at its size until ctx ends.
func (e *Edge) fill(ctx context.Context, p *pool) {
	defer e.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	sem := make(chan struct{}, poolFillers)
	for {
		for {
			e.mu.Lock()
			live := 0
			kept := p.ready[:0]
			for _, sb := range p.ready {
				if sb.poolReady() {
					kept = append(kept, sb)
					live++
				}
			}
			p.ready = kept
			want := p.size - live - p.creating
			if want <= 0 || ctx.Err() != nil {
				e.mu.Unlock()
				break
			}
			select {
			case sem <- struct{}{}:
			default:
				e.mu.Unlock()
				goto wait
			}
			p.creating++
			e.mu.Unlock()
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				defer func() { <-sem; p.poke() }()
				err := e.addPoolMember(ctx, p)
				e.mu.Lock()
				p.creating--
				if err != nil {
					p.lastErr = err.Error()
				} else {
					p.lastErr = ""
				}
				e.mu.Unlock()
				if err != nil {
					e.log.Debug("pool refill failed", "pool", p.name, "err", err)
					// Back off a little: the ticker retries.
					select {
					case <-ctx.Done():
					case <-time.After(200 * time.Millisecond):
					}
				}
			}()
		}
	wait:
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-tick.C:
		}
	}
}

// addPoolMember creates one sandbox for p and adds it to the ready list.
func (e *Edge) addPoolMember(ctx context.Context, p *pool) error {
	id := e.newID()
	spec := p.spec
	e.mu.Lock()
	if e.closing || ctx.Err() != nil {
		e.mu.Unlock()
		return errors.New("pool stopped")
	}
	if aerr := e.admitLocked(&spec); aerr != nil {
		e.mu.Unlock()
		return aerr
	}
	now := time.Now().UTC()
	sb := &sandbox{
		rec: record{Spec: spec, Sandbox: api.Sandbox{
			ID: id, State: api.StateCreating, Node: e.cfg.Node, Tier: spec.Tier, Image: spec.Image,
			CPU: spec.CPU, MemoryMB: spec.MemoryMB, DiskMB: spec.DiskMB, Pids: spec.Pids,
			Priority: spec.Priority, CreatedAt: now,
		}},
		lastActive: now,
		ready:      make(chan struct{}),
		pool:       p.name,
	}
	e.putLocked(id, sb)
	e.mu.Unlock()
	err := e.start(ctx, sb)
	close(sb.ready)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		e.dropLocked(id)
		return err
	}
	if e.pools[p.id()] != p || e.closing || len(p.ready) >= p.size {
		// The pool went away or shrank meanwhile.
		e.dropPoolMembers([]*sandbox{sb})
		return nil
	}
	p.ready = append(p.ready, sb)
	return nil
}

// claimLocked hands out a ready pool member for a create of spec under the
// final id, or nil when no pool has one. Called with e.mu held.
func (e *Edge) claimLocked(id string, spec *api.CreateSandboxRequest) *sandbox {
	key, ok := poolKey(spec)
	if !ok || len(e.pools) == 0 {
		return nil
	}
	var p *pool
	for _, q := range e.pools {
		if q.key == key && sandboxspec.Within(spec.Project, q.project) {
			p = q
			break
		}
	}
	if p == nil {
		return nil
	}
	for len(p.ready) > 0 {
		sb := p.ready[len(p.ready)-1]
		p.ready = p.ready[:len(p.ready)-1]
		sb.mu.Lock()
		if sb.rec.Sandbox.State != api.StateRunning || sb.stopping || sb.inst == nil {
			sb.mu.Unlock()
			continue
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
		sb.rec.Sandbox.Pool = p.name
		sb.lastActive = now
		sb.rec.Sandbox.LastActive = now
		sb.pool = ""
		sb.mu.Unlock()
		sb.audit.reset() // what ran while it waited in the pool is nobody's
		setPolicy(sb, spec.Audit)
		e.dropLocked(internal)
		e.putLocked(id, sb)
		p.claimed++
		p.poke()
		return sb
	}
	p.poke()
	return nil
}

// stopPools ends the fillers (on Close); members are stopped with the rest.
func (e *Edge) stopPools() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range e.pools {
		p.cancel()
	}
}
