package recycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/edge/core"
	"github.com/warrenhq/warren/internal/runtime"
)

// fakeCore is the core as the shelf uses it: a logger and Closing.
type fakeCore struct{ closing bool }

func (c *fakeCore) Logger() *slog.Logger                       { return slog.Default() }
func (c *fakeCore) Context() context.Context                   { return context.Background() }
func (c *fakeCore) Go(f func())                                { go f() }
func (c *fakeCore) Closing() bool                              { return c.closing }
func (c *fakeCore) Room(*api.CreateSandboxRequest) bool        { return true }
func (c *fakeCore) BeforeCommand(core.Sandbox)                 {}
func (c *fakeCore) AfterCommand(core.Sandbox, *api.ExecResult) {}
func (c *fakeCore) AgentError(_ core.Sandbox, err error) error { return err }
func (c *fakeCore) Reclaim(core.Sandbox, string)               {}
func (c *fakeCore) Stop(core.Sandbox, string)                  {}
func (c *fakeCore) StartWorker(context.Context, api.CreateSandboxRequest, core.WorkerOptions) (core.Sandbox, error) {
	return nil, errors.New("no workers here")
}

// fakeRoots records the writable layers and layer mounts it holds.
type fakeRoots struct {
	mu     sync.Mutex
	n      int
	held   map[string]bool // writable layers (and mount holders) alive
	stores map[string]bool // state dirs freed
}

func newRoots() *fakeRoots { return &fakeRoots{held: map[string]bool{}, stores: map[string]bool{}} }

func (r *fakeRoots) NewID() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	return fmt.Sprintf("l%d", r.n)
}
func (r *fakeRoots) AllocWritable(name string, _ int64) (string, string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.held[name] = true
	return "/up/" + name, "/work/" + name, nil
}
func (r *fakeRoots) MountLayers(holder string, layers []string) ([]string, error) {
	return layers, nil
}
func (r *fakeRoots) FreeLayer(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.held, name)
}
func (r *fakeRoots) FreeStorage(store, layer string) {
	r.FreeLayer(layer)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stores[store] = true
}
func (r *fakeRoots) holds(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.held[name]
}

// fakeRuntime recycles (or refuses to, wipeErr) and counts its calls.
type fakeRuntime struct {
	mu                                 sync.Mutex
	wipeErr                            error
	wipes, reroots, resumes, destroyed int
	lastRoot                           *runtime.Spec
}

func (f *fakeRuntime) Name() string { return "fake" }
func (f *fakeRuntime) Start(context.Context, *runtime.Spec) (*runtime.Instance, error) {
	return nil, errors.New("not here")
}
func (f *fakeRuntime) Attach(context.Context, runtime.Handle) (*runtime.Instance, error) {
	return nil, runtime.ErrGone
}
func (f *fakeRuntime) Destroy(context.Context, runtime.Handle) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.destroyed++
	return nil
}
func (f *fakeRuntime) Leftovers(context.Context) ([]runtime.Handle, error) { return nil, nil }
func (f *fakeRuntime) Freeze(context.Context, runtime.Handle) error        { return nil }
func (f *fakeRuntime) Thaw(context.Context, runtime.Handle) error          { return nil }
func (f *fakeRuntime) Wipe(context.Context, *runtime.Instance) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.wipes++
	return f.wipeErr
}
func (f *fakeRuntime) Reroot(_ context.Context, _ *runtime.Instance, s *runtime.Spec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reroots++
	f.lastRoot = s
	return nil
}
func (f *fakeRuntime) Resume(context.Context, *runtime.Instance, *runtime.Spec) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.resumes++
	return nil
}

// plain is a runtime that cannot recycle.
type plain struct{ runtime.Runtime }

func instance(t *testing.T, id string) *runtime.Instance {
	a, b := net.Pipe()
	t.Cleanup(func() { _ = b.Close() })
	return &runtime.Instance{Handle: runtime.Handle{ID: id}, Agent: agentproto.NewClient(a)}
}

func leaving(t *testing.T, id string, layers ...string) (Leaving, *bool) {
	unwatched := new(bool)
	spec := &api.CreateSandboxRequest{Project: "p", CPU: 1, MemoryMB: 256, DiskMB: 512, Hostname: "sandbox"}
	return Leaving{ID: id, Spec: spec, Store: id, Layer: id, Layers: layers, Inst: instance(t, id),
		Unwatch: func() { *unwatched = true }}, unwatched
}

// TestKeepAndTake: a kept container is wiped, gets a fresh root of the
// same layers (the sandbox's writable layer is freed at once) and is
// handed to the next create of its shape; resuming it counts as reused.
func TestKeepAndTake(t *testing.T) {
	rt, roots := &fakeRuntime{}, newRoots()
	s := New(&fakeCore{}, roots, rt, 2)
	roots.held["a"] = true // the leaving sandbox's writable layer
	l, unwatched := leaving(t, "a", "sha256:1", "sha256:2")
	if !s.Keep(context.Background(), l) {
		t.Fatal("a recyclable container was not kept")
	}
	if !*unwatched || rt.wipes != 1 || rt.reroots != 1 || roots.holds("a") {
		t.Fatalf("keep: unwatched %v, wipes %d, reroots %d, old layer held %v", *unwatched, rt.wipes, rt.reroots, roots.holds("a"))
	}
	if got := rt.lastRoot.Lowers; len(got) != 2 || got[0] != "sha256:1" {
		t.Fatalf("the fresh root's lowers are %v", got)
	}
	if st := s.Stats(); st.Kept != 1 || st.Waiting != 1 {
		t.Fatalf("stats after a keep: %+v", st)
	}
	other := *l.Spec
	other.MemoryMB = 512
	if s.Take(&other, "") != nil {
		t.Fatal("a create of another shape took a kept container")
	}
	box := s.Take(l.Spec, RootKey(l.Layers, l.Spec.DiskMB))
	if box == nil || box.Store != "a" || box.Root != RootKey(l.Layers, 512) || !roots.holds(box.Layer) {
		t.Fatalf("take: %+v", box)
	}
	if s.Resume(context.Background(), box, &runtime.Spec{}) == nil {
		t.Fatal("resume failed")
	}
	if st := s.Stats(); st.Reused != 1 || st.Waiting != 0 {
		t.Fatalf("stats after the reuse: %+v", st)
	}
}

// TestKeepRefused: a container the runtime refuses to wipe is not kept
// (the core destroys it), is counted as refused and is never handed out.
func TestKeepRefused(t *testing.T) {
	rt := &fakeRuntime{wipeErr: fmt.Errorf("socket left: %w", runtime.ErrNotReusable)}
	s := New(&fakeCore{}, newRoots(), rt, 2)
	l, unwatched := leaving(t, "a", "sha256:1")
	if s.Keep(context.Background(), l) {
		t.Fatal("a container the runtime refused to wipe was kept")
	}
	if *unwatched || rt.reroots != 0 {
		t.Fatalf("a refused container was unwatched (%v) or rerooted (%d)", *unwatched, rt.reroots)
	}
	if st := s.Stats(); st.Refused != 1 || st.Kept != 0 || st.Waiting != 0 {
		t.Fatalf("stats after a refusal: %+v", st)
	}
	if s.Take(l.Spec, "") != nil {
		t.Fatal("a refused container was handed out")
	}
}

// TestShelfLimits: no more than perShape containers of a shape wait (a
// full shelf does not even wipe); none while the node closes; none when
// recycling is off.
func TestShelfLimits(t *testing.T) {
	rt := &fakeRuntime{}
	s := New(&fakeCore{}, newRoots(), rt, 1)
	a, _ := leaving(t, "a", "sha256:1")
	b, _ := leaving(t, "b", "sha256:1")
	if !s.Keep(context.Background(), a) || s.Keep(context.Background(), b) {
		t.Fatal("want the first kept and the second refused")
	}
	if rt.wipes != 1 {
		t.Fatalf("a full shelf wiped a container (%d wipes)", rt.wipes)
	}
	closing := New(&fakeCore{closing: true}, newRoots(), rt, 1)
	if closing.Keep(context.Background(), b) {
		t.Fatal("a closing node kept a container")
	}
	for _, off := range []*Shelf{New(&fakeCore{}, newRoots(), rt, 0), New(&fakeCore{}, newRoots(), plain{rt}, 1)} {
		if off.Enabled() || off.Keep(context.Background(), b) {
			t.Fatal("recycling is off but a container was kept")
		}
	}
}

// TestExpireAndClose: containers that waited longer than the idle time are
// destroyed and their storage freed; Close destroys the rest and keeps no
// more.
func TestExpireAndClose(t *testing.T) {
	rt, roots := &fakeRuntime{}, newRoots()
	s := New(&fakeCore{}, roots, rt, 2)
	a, _ := leaving(t, "a", "sha256:1")
	if !s.Keep(context.Background(), a) {
		t.Fatal("not kept")
	}
	s.Expire(time.Hour)
	if st := s.Stats(); st.Waiting != 1 || rt.destroyed != 0 {
		t.Fatalf("a young container expired: %+v, %d destroyed", st, rt.destroyed)
	}
	time.Sleep(5 * time.Millisecond)
	s.Expire(time.Millisecond)
	if st := s.Stats(); st.Waiting != 0 || rt.destroyed != 1 || !roots.stores["a"] || len(roots.held) != 0 {
		t.Fatalf("expire: %+v, %d destroyed, stores freed %v, layers held %v", st, rt.destroyed, roots.stores, roots.held)
	}
	b, _ := leaving(t, "b", "sha256:1")
	if !s.Keep(context.Background(), b) {
		t.Fatal("not kept")
	}
	s.Close()
	c, _ := leaving(t, "c", "sha256:1")
	if st := s.Stats(); st.Waiting != 0 || rt.destroyed != 2 || s.Keep(context.Background(), c) {
		t.Fatalf("close: %+v, %d destroyed", st, rt.destroyed)
	}
}

// TestTakePrefersRoot: of two waiting containers of one shape, a create
// takes the one whose root it can use as it is.
func TestTakePrefersRoot(t *testing.T) {
	s := New(&fakeCore{}, newRoots(), &fakeRuntime{}, 2)
	a, _ := leaving(t, "a", "sha256:1")
	b, _ := leaving(t, "b", "sha256:2")
	if !s.Keep(context.Background(), a) || !s.Keep(context.Background(), b) {
		t.Fatal("not kept")
	}
	if box := s.Take(b.Spec, RootKey(b.Layers, b.Spec.DiskMB)); box == nil || box.Store != "b" {
		t.Fatalf("take by root: %+v", box)
	}
	if box := s.Take(a.Spec, "other"); box == nil || box.Store != "a" {
		t.Fatalf("take without a matching root: %+v", box)
	}
}
