// Package pool is the edge's warm pools, written against the lifecycle
// core (internal/edge/core). The edge keeps Size sandboxes of a pool's
// shape created and ready; a matching create claims one (Take, from the
// core's create) instead of starting a new one, and a filler goroutine per
// pool refills it in the background.
//
// Ids: a pooled sandbox is created under an internal name (a fresh
// sb-<node>-<random> that no client ever sees) and gets its final id, the
// one the apiserver chose for the create, when it is claimed. Its cgroup,
// state dir and writable layer keep the internal name (the core's
// record.Storage). So ids are still chosen by the caller, which keeps
// creates idempotent, and never reused. Pool members have no record on
// disk until they are claimed: after a crash, reconcile frees them like
// any leftover and the fillers make new ones. The pool definitions are
// saved in one file (pools.json) and restored by Load.
//
// Lock order: the core's Edge.mu, then Pools.mu, then the core's
// sandbox.mu (Take runs under Edge.mu and calls its claim under Pools.mu;
// the fillers check their members' Ready under Pools.mu). Pools.mu is
// never held while calling the core, except Stop and Go (see core's
// package comment).
package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge/core"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// fillers is how many sandboxes one pool creates at once.
const fillers = 2

// Pools is the node's warm pools.
type Pools struct {
	core core.Core
	path string // where the definitions are saved

	mu    sync.Mutex
	pools map[string]*pool // by pool.id(): names are per project
}

type pool struct {
	name    string
	project string                   // the owner: members serve sandboxes of it and below
	spec    api.CreateSandboxRequest // normalized
	key     string
	kick    chan struct{}
	cancel  context.CancelFunc

	// under Pools.mu
	size     int
	ready    []core.Sandbox
	creating int
	claimed  int64
	lastErr  string
}

// New returns the warm pools of the node whose core is c; their
// definitions are saved at path.
func New(c core.Core, path string) *Pools {
	return &Pools{core: c, path: path, pools: map[string]*pool{}}
}

// id is the pool's key in Pools.pools: pool names are per project, like
// trajectories' (TrajKey).
func (p *pool) id() string { return edgeproto.TrajKey(p.project, p.name) }

func (p *pool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func truncateName(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// viewLocked is p as the API shows it.
func (p *pool) viewLocked() api.Pool {
	n := 0
	for _, sb := range p.ready {
		if sb.Ready() {
			n++
		}
	}
	return api.Pool{Name: p.name, Project: p.project, Tier: p.spec.Tier, Image: p.spec.Image, CPU: p.spec.CPU, MemoryMB: p.spec.MemoryMB,
		DiskMB: p.spec.DiskMB, Pids: p.spec.Pids, Priority: p.spec.Priority, Size: p.size, Ready: n,
		Creating: p.creating, Claimed: p.claimed, Error: p.lastErr}
}

// saveLocked writes the pool definitions.
func (ps *Pools) saveLocked() error {
	defs := make([]api.PoolRequest, 0, len(ps.pools))
	for _, p := range ps.pools {
		defs = append(defs, api.PoolRequest{Name: p.name, Project: p.project, Tier: p.spec.Tier, Image: p.spec.Image, CPU: p.spec.CPU,
			MemoryMB: p.spec.MemoryMB, DiskMB: p.spec.DiskMB, Pids: p.spec.Pids, Priority: p.spec.Priority, Size: p.size})
	}
	sort.Slice(defs, func(i, j int) bool { return defs[i].Name < defs[j].Name })
	b, err := json.Marshal(defs)
	if err != nil {
		return err
	}
	tmp := ps.path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("edge: save pools: %w", err)
	}
	return os.Rename(tmp, ps.path)
}

// Load starts the pools saved by an earlier run.
func (ps *Pools) Load() {
	log := ps.core.Logger()
	b, err := os.ReadFile(ps.path)
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	var defs []api.PoolRequest
	if err == nil {
		err = json.Unmarshal(b, &defs)
	}
	if err != nil {
		log.Warn("cannot read saved pools", "err", err)
		return
	}
	for i := range defs {
		if _, err := ps.Put(&defs[i]); err != nil {
			log.Warn("cannot restore pool", "pool", defs[i].Name, "err", err)
		}
	}
}

// Put creates a pool or changes its size.
func (ps *Pools) Put(r *api.PoolRequest) (*api.Pool, error) {
	spec, aerr := edgeproto.PoolSpec(r)
	if aerr != nil {
		return nil, aerr
	}
	if r.Name == "" {
		return nil, &api.Error{Code: api.CodeInvalid, Message: "pool name is required"}
	}
	if ps.core.Closing() {
		return nil, &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonShuttingDown, Message: "node is shutting down"}
	}
	key, _ := core.ShapeKey(&spec)
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.pools[edgeproto.TrajKey(r.Project, r.Name)]
	if p != nil && p.key != key {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("pool %s exists with another shape; delete it first", r.Name)}
	}
	for _, q := range ps.pools {
		if q.key == key && q.name != r.Name && q.project == r.Project {
			return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("pool %s already keeps this shape", q.name)}
		}
	}
	if p == nil {
		p = &pool{name: r.Name, project: r.Project, spec: spec, key: key, kick: make(chan struct{}, 1)}
		ps.pools[p.id()] = p
		fctx, cancel := context.WithCancel(ps.core.Context())
		p.cancel = cancel
		ps.core.Go(func() { ps.fill(fctx, p) })
	}
	p.size = r.Size
	if err := ps.saveLocked(); err != nil {
		ps.core.Logger().Warn("save pools", "err", err)
	}
	var extra []core.Sandbox
	for len(p.ready) > p.size {
		extra = append(extra, p.ready[len(p.ready)-1])
		p.ready = p.ready[:len(p.ready)-1]
	}
	ps.drop(extra)
	p.poke()
	v := p.viewLocked()
	return &v, nil
}

// drop stops pool members no longer wanted, in the background.
func (ps *Pools) drop(sbs []core.Sandbox) {
	for _, sb := range sbs {
		ps.core.Stop(sb, "pool shrunk")
	}
}

// Delete deletes a pool and stops its members.
func (ps *Pools) Delete(project, name string) (*api.Pool, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.pools[edgeproto.TrajKey(project, name)]
	if p == nil {
		return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("pool %s not found", truncateName(name))}
	}
	v := p.viewLocked()
	delete(ps.pools, p.id())
	p.cancel()
	ps.drop(p.ready)
	p.ready = nil
	if err := ps.saveLocked(); err != nil {
		ps.core.Logger().Warn("save pools", "err", err)
	}
	return &v, nil
}

// List lists the pools.
func (ps *Pools) List() *api.PoolList {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	out := &api.PoolList{Pools: []api.Pool{}}
	for _, p := range ps.pools {
		out.Pools = append(out.Pools, p.viewLocked())
	}
	sort.Slice(out.Pools, func(i, j int) bool { return out.Pools[i].Name < out.Pools[j].Name })
	return out
}

// NodeView reports the pools for the node view (under the core's Edge.mu).
func (ps *Pools) NodeView() []api.NodePool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []api.NodePool
	for _, p := range ps.pools {
		v := p.viewLocked()
		out = append(out, api.NodePool{Name: v.Name, Project: v.Project, Size: v.Size, Ready: v.Ready})
	}
	return out
}

// fill keeps p at its size until ctx ends: it starts up to fillers
// members at once, and looks again when one is done, when p is poked
// (a claim, a resize) and every second.
func (ps *Pools) fill(ctx context.Context, p *pool) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	sem := make(chan struct{}, fillers)
	for {
		for ps.wanted(ctx, p, sem) {
			ps.core.Go(func() {
				defer func() { <-sem; p.poke() }()
				ps.refill(ctx, p)
			})
		}
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-tick.C:
		}
	}
}

// wanted forgets p's members that stopped and reports whether one more
// is to be started now (a slot of sem taken and p.creating counted).
func (ps *Pools) wanted(ctx context.Context, p *pool, sem chan struct{}) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	kept := p.ready[:0]
	for _, sb := range p.ready {
		if sb.Ready() {
			kept = append(kept, sb)
		}
	}
	clear(p.ready[len(kept):])
	p.ready = kept
	if p.size-len(kept)-p.creating <= 0 || ctx.Err() != nil {
		return false
	}
	select {
	case sem <- struct{}{}:
	default:
		return false
	}
	p.creating++
	return true
}

// refill starts one member for p and notes how that went.
func (ps *Pools) refill(ctx context.Context, p *pool) {
	err := ps.add(ctx, p)
	ps.mu.Lock()
	p.creating--
	if err != nil {
		p.lastErr = err.Error()
	} else {
		p.lastErr = ""
	}
	ps.mu.Unlock()
	if err != nil {
		ps.core.Logger().Debug("pool refill failed", "pool", p.name, "err", err)
		// Back off a little: the ticker retries.
		select {
		case <-ctx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// add creates one sandbox for p and adds it to the ready list.
func (ps *Pools) add(ctx context.Context, p *pool) error {
	if ctx.Err() != nil || ps.core.Closing() {
		return errors.New("pool stopped")
	}
	sb, err := ps.core.StartWorker(ctx, p.spec, core.WorkerOptions{Pool: p.name})
	if err != nil {
		return err
	}
	closing := ps.core.Closing()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.pools[p.id()] != p || closing || len(p.ready) >= p.size {
		// The pool went away or shrank meanwhile.
		ps.drop([]core.Sandbox{sb})
		return nil
	}
	p.ready = append(p.ready, sb)
	return nil
}

// Take hands out a ready member of a pool that serves spec (its shape,
// and its project within the pool's), or nil when none has one. claim
// makes the member the create's sandbox (the core's records); it refuses
// a member that cannot serve (then the next is tried). Take runs under
// the core's Edge.mu (create), and claim under Pools.mu.
func (ps *Pools) Take(spec *api.CreateSandboxRequest, claim func(sb core.Sandbox, pool string) bool) core.Sandbox {
	key, ok := core.ShapeKey(spec)
	if !ok {
		return nil
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var p *pool
	for _, q := range ps.pools {
		if q.key == key && sandboxspec.Within(spec.Project, q.project) {
			p = q
			break
		}
	}
	if p == nil {
		return nil
	}
	defer p.poke()
	for len(p.ready) > 0 {
		sb := p.ready[len(p.ready)-1]
		p.ready = p.ready[:len(p.ready)-1]
		if claim(sb, p.name) {
			p.claimed++
			return sb
		}
	}
	return nil
}
