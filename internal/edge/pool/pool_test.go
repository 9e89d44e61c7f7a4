package pool

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/edge/core"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/lifetime"
)

// fakeCore starts fake sandboxes and records what the pools stop.
type fakeCore struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     lifetime.Group

	mu      sync.Mutex
	started int
	stopped map[string]string
}

func newFakeCore(t *testing.T) *fakeCore {
	ctx, cancel := context.WithCancel(context.Background())
	c := &fakeCore{ctx: ctx, cancel: cancel, stopped: map[string]string{}}
	t.Cleanup(func() { c.cancel(); _ = c.wg.Wait(context.Background()) })
	return c
}

func (c *fakeCore) Logger() *slog.Logger                       { return slog.Default() }
func (c *fakeCore) Context() context.Context                   { return c.ctx }
func (c *fakeCore) Go(f func())                                { c.wg.Add(1); go func() { defer c.wg.Done(); f() }() }
func (c *fakeCore) Closing() bool                              { return false }
func (c *fakeCore) Room(*api.CreateSandboxRequest) bool        { return true }
func (c *fakeCore) BeforeCommand(core.Sandbox)                 {}
func (c *fakeCore) AfterCommand(core.Sandbox, *api.ExecResult) {}
func (c *fakeCore) AgentError(_ core.Sandbox, err error) error { return err }
func (c *fakeCore) Reclaim(s core.Sandbox, reason string)      { c.Stop(s, reason) }
func (c *fakeCore) StartWorker(_ context.Context, spec api.CreateSandboxRequest, o core.WorkerOptions) (core.Sandbox, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started++
	return &fakeSandbox{id: fmt.Sprintf("m%d", c.started), ready: true}, nil
}
func (c *fakeCore) Stop(s core.Sandbox, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped[s.ID()] = reason
	s.(*fakeSandbox).setReady(false)
}
func (c *fakeCore) counts() (started, stopped int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.started, len(c.stopped)
}

type fakeSandbox struct {
	id    string
	mu    sync.Mutex
	ready bool
}

func (s *fakeSandbox) ID() string                { return s.id }
func (s *fakeSandbox) Agent() *agentproto.Client { return nil }
func (s *fakeSandbox) Ready() bool               { s.mu.Lock(); defer s.mu.Unlock(); return s.ready }
func (s *fakeSandbox) setReady(r bool)           { s.mu.Lock(); s.ready = r; s.mu.Unlock() }

// withPool runs f on pool p1/warm under ps.mu.
func withPool(t *testing.T, ps *Pools, f func(p *pool)) {
	t.Helper()
	ps.mu.Lock()
	defer ps.mu.Unlock()
	p := ps.pools[edgeproto.TrajKey("p1", "warm")]
	if p == nil {
		t.Fatal("no pool p1/warm")
	}
	f(p)
}

func waitReady(t *testing.T, ps *Pools, name string, want int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, p := range ps.List().Pools {
			if p.Name == name && p.Ready == want && p.Creating == 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: %+v, want %d ready", name, ps.List().Pools, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPoolFillsShrinksAndRestores: a pool fills to its size, a smaller
// size stops the surplus, a member that stopped is replaced, the
// definitions survive a restart (Load), and a delete stops the members.
func TestPoolFillsShrinksAndRestores(t *testing.T) {
	c := newFakeCore(t)
	path := filepath.Join(t.TempDir(), "pools.json")
	ps := New(c, path)
	req := api.PoolRequest{Name: "warm", Project: "p1", Image: "busybox", CPU: 0.5, MemoryMB: 256, Size: 3}
	if _, err := ps.Put(&req); err != nil {
		t.Fatal(err)
	}
	waitReady(t, ps, "warm", 3)
	req.Size = 1
	if _, err := ps.Put(&req); err != nil {
		t.Fatal(err)
	}
	if started, stopped := c.counts(); started != 3 || stopped != 2 {
		t.Fatalf("after shrinking to 1: %d started, %d stopped; want 3 and 2", started, stopped)
	}
	withPool(t, ps, func(p *pool) {
		p.ready[0].(*fakeSandbox).setReady(false) // its agent exited
		p.poke()
	})
	waitReady(t, ps, "warm", 1)
	if started, _ := c.counts(); started != 4 {
		t.Fatalf("a stopped member was not replaced: %d started, want 4", started)
	}

	other := New(newFakeCore(t), path)
	other.Load()
	if l := other.List().Pools; len(l) != 1 || l[0].Name != "warm" || l[0].Size != 1 || l[0].Project != "p1" {
		t.Fatalf("restored pools: %+v", l)
	}
	if _, err := ps.Delete("p1", "warm"); err != nil {
		t.Fatal(err)
	}
	if _, stopped := c.counts(); stopped != 3 { // 2 shrunk, 1 deleted (the one that exited was not the pool's to stop)
		t.Fatalf("stopped %d, want 3", stopped)
	}
	if l := ps.List().Pools; len(l) != 0 {
		t.Fatalf("after delete: %+v", l)
	}
}

// TestPoolTakeMatchesShapeAndProject: Take serves a create of the pool's
// shape in the pool's project (or below), skips members the claim
// refuses, and counts claims.
func TestPoolTakeMatchesShapeAndProject(t *testing.T) {
	c := newFakeCore(t)
	ps := New(c, filepath.Join(t.TempDir(), "pools.json"))
	req := api.PoolRequest{Name: "warm", Project: "p1", Image: "busybox", CPU: 0.5, MemoryMB: 256, Size: 2}
	v, err := ps.Put(&req)
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, ps, "warm", 2)
	spec := api.CreateSandboxRequest{Project: "p1", Image: "busybox", CPU: 0.5, MemoryMB: 256, DiskMB: 0, Hostname: "sandbox"}
	// The pool's normalized shape: take its disk, pids and priority.
	withPool(t, ps, func(p *pool) {
		spec.Tier, spec.DiskMB, spec.Pids, spec.Priority = p.spec.Tier, p.spec.DiskMB, p.spec.Pids, p.spec.Priority
	})
	accept := func(core.Sandbox, string) bool { return true }

	other := spec
	other.Project = "p2"
	if sb := ps.Take(&other, accept); sb != nil {
		t.Fatalf("another project took %s", sb.ID())
	}
	other = spec
	other.CPU = 1
	if sb := ps.Take(&other, accept); sb != nil {
		t.Fatalf("another shape took %s", sb.ID())
	}
	refused := 0
	sb := ps.Take(&spec, func(_ core.Sandbox, pool string) bool {
		if pool != v.Name {
			t.Errorf("claim names pool %q", pool)
		}
		refused++
		return refused > 1 // the first member cannot serve
	})
	if sb == nil || refused != 2 {
		t.Fatalf("Take: %v after %d claims, want the second member", sb, refused)
	}
	var claimed int64
	withPool(t, ps, func(p *pool) { claimed = p.claimed })
	if claimed != 1 {
		t.Fatalf("claimed %d, want 1", claimed)
	}
	waitReady(t, ps, "warm", 2) // refilled
}
