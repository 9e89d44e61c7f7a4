package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
)

// memStore is Store in memory (records as JSON, as the bus keeps them).
type memStore struct {
	mu   sync.Mutex
	recs map[string][]byte
}

func (m *memStore) Get(_ context.Context, key string, v any) (bool, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.recs[key]
	if !ok {
		return false, 0, nil
	}
	return true, 1, json.Unmarshal(b, v)
}

func (m *memStore) Put(_ context.Context, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.recs == nil {
		m.recs = map[string][]byte{}
	}
	m.recs[key] = b
	return nil
}

func (m *memStore) Delete(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.recs, key)
	return nil
}

// fakeLayers packs a directory as the list of its entries.
type fakeLayers struct {
	mounted map[string]bool
	packed  map[string][]string // layer name -> entries packed
	gone    map[string]bool     // layer names ResolveLayer says are deleted
	deleted []string
}

func newFakeLayers() *fakeLayers {
	return &fakeLayers{mounted: map[string]bool{}, packed: map[string][]string{}, gone: map[string]bool{}}
}

func (f *fakeLayers) MountLayers(holder string, ids []string) ([]string, error) {
	f.mounted[holder] = true
	return ids, nil
}
func (f *fakeLayers) ReleaseLayers(holder string) { delete(f.mounted, holder) }
func (f *fakeLayers) ResolveLayer(_ context.Context, ref string) (*api.Layer, error) {
	name, _, _ := strings.Cut(ref, "@")
	if f.gone[name] {
		return nil, fmt.Errorf("layer %s not found", ref)
	}
	return &api.Layer{Name: name, Version: 1}, nil
}
func (f *fakeLayers) DeleteLayer(_ context.Context, name string, _ int) ([]api.Layer, error) {
	f.deleted = append(f.deleted, name)
	return nil, nil
}
func (f *fakeLayers) CreateLayerFromChanges(ctx context.Context, name string, version int, upper string, lowers []string, idBase uint32, source string) (*api.Layer, error) {
	return f.CreateLayerFromPrivateChanges(ctx, name, version, upper, lowers, idBase, source)
}
func (f *fakeLayers) CreateLayerFromPrivateChanges(_ context.Context, name string, version int, dir string, _ []string, _ uint32, _ string) (*api.Layer, error) {
	var entries []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir || d.IsDir() {
			return err
		}
		entries = append(entries, p[len(dir)+1:])
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Strings(entries)
	f.packed[name] = entries
	return &api.Layer{Name: name, Version: version, Size: int64(100 * len(entries)), Entries: len(entries)}, nil
}

type fakeHost struct {
	quota   error
	charged int64
}

func (h *fakeHost) Logger() *slog.Logger { return slog.New(slog.DiscardHandler) }
func (h *fakeHost) CheckStorage(context.Context, string, int64) error {
	return h.quota
}
func (h *fakeHost) Charge(_ context.Context, _ string, n int64) { h.charged += n }

// fakeFreezer records the freezes and thaws; failFreezes fail first.
type fakeFreezer struct {
	failFreezes   int
	freezes, thaw int
	frozen        bool
}

func (f *fakeFreezer) Freeze(context.Context, runtime.Handle) error {
	f.freezes++
	if f.freezes <= f.failFreezes {
		f.frozen = true // a freeze that timed out half way
		return errors.New("freezing did not settle")
	}
	f.frozen = true
	return nil
}
func (f *fakeFreezer) Thaw(context.Context, runtime.Handle) error {
	f.thaw++
	f.frozen = false
	return nil
}

type fakeSandbox struct {
	src Source
	st  State
}

func (s *fakeSandbox) Source() Source    { return s.src }
func (s *fakeSandbox) SnapState() *State { return &s.st }

type rig struct {
	s      *Snapshotter
	store  *memStore
	layers *fakeLayers
	host   *fakeHost
	rt     *fakeFreezer
	sb     *fakeSandbox
	upper  string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{store: &memStore{}, layers: newFakeLayers(), host: &fakeHost{}, rt: &fakeFreezer{}}
	r.s = New(Config{Host: r.host, Store: r.store, Layers: r.layers, Runtime: r.rt, Writable: struct{}{}})
	r.upper = filepath.Join(t.TempDir(), "upper")
	if err := os.Mkdir(r.upper, 0o755); err != nil {
		t.Fatal(err)
	}
	r.sb = &fakeSandbox{src: Source{
		ID: "n1-sb1", Layer: "n1-sb1", Upper: r.upper, Lowers: []string{"sha256:base"},
		Spec:   api.CreateSandboxRequest{Project: "p1", Image: "img", Layers: []api.LayerAttachment{{Layer: "tools@1", Mount: "/opt"}}},
		Handle: &runtime.Handle{ID: "n1-sb1"},
	}}
	return r
}

func (r *rig) write(t *testing.T, rel, data string) {
	t.Helper()
	p := filepath.Join(r.upper, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func wantCode(t *testing.T, err error, code string, words ...string) {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != code {
		t.Fatalf("error %v, want an api error %s", err, code)
	}
	for _, w := range words {
		if !strings.Contains(ae.Message, w) {
			t.Fatalf("error %q does not name %q", ae.Message, w)
		}
	}
}

// TestTakeIncremental: a container's first snapshot packs its whole
// writable layer, the next only what changed, chained on the first; the
// sandbox is frozen only over the copy; the bytes are charged; no copy or
// mount is left behind.
func TestTakeIncremental(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.write(t, "a", "1")
	r.write(t, "d/b", "1")
	first, err := r.s.Take(ctx, r.sb, "one", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.layers.packed["snap/"+first.ID]; strings.Join(got, ",") != "a,d/b" {
		t.Fatalf("first snapshot packed %v, want a and d/b", got)
	}
	if first.Previous != "" || len(first.Layers) != 2 || first.Layers[0].Layer != "tools@1" || first.Diff != "snap/"+first.ID+"@1" {
		t.Fatalf("first snapshot record %+v", first)
	}
	r.write(t, "d/b", "22") // a different size: changed whatever the clock
	r.write(t, "c", "1")
	second, err := r.s.Take(ctx, r.sb, "two", 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.layers.packed["snap/"+second.ID]; strings.Join(got, ",") != "c,d/b" {
		t.Fatalf("second snapshot packed %v, want only c and d/b", got)
	}
	if second.Previous != first.ID || len(second.Layers) != 3 || second.Layers[1].Layer != first.Diff {
		t.Fatalf("second snapshot does not chain on the first: %+v", second)
	}
	var stored api.Snapshot
	if found, _, _ := r.store.Get(ctx, second.ID, &stored); !found || stored.Diff != second.Diff {
		t.Fatalf("second snapshot not recorded: %+v", stored)
	}
	if r.rt.freezes != 2 || r.rt.thaw != 2 || r.rt.frozen {
		t.Fatalf("freezes %d thaws %d frozen %v: want each snapshot frozen once and thawed", r.rt.freezes, r.rt.thaw, r.rt.frozen)
	}
	if r.host.charged != first.Size+second.Size {
		t.Fatalf("charged %d, want %d", r.host.charged, first.Size+second.Size)
	}
	if len(r.layers.mounted) != 0 {
		t.Fatalf("layers still mounted for %v", r.layers.mounted)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(r.upper), ".snapshot-*"))
	if len(left) != 0 {
		t.Fatalf("copies left behind: %v", left)
	}
}

// TestTakeChainBroken: a snapshot whose previous snapshot's diff was
// deleted while it was packed is refused (409), unrecorded and its layer
// deleted; the next one is full again.
func TestTakeChainBroken(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	r.write(t, "a", "1")
	first, err := r.s.Take(ctx, r.sb, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	r.layers.gone["snap/"+first.ID] = true
	r.write(t, "b", "1")
	_, err = r.s.Take(ctx, r.sb, "", 0)
	wantCode(t, err, api.CodeConflict, "was deleted", "take it again")
	if len(r.store.recs) != 1 || len(r.layers.deleted) != 1 {
		t.Fatalf("records %d (want the first only), layers deleted %v", len(r.store.recs), r.layers.deleted)
	}
	third, err := r.s.Take(ctx, r.sb, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	if third.Previous != "" || strings.Join(r.layers.packed["snap/"+third.ID], ",") != "a,b" {
		t.Fatalf("the snapshot after a broken chain is not full: %+v packed %v", third, r.layers.packed["snap/"+third.ID])
	}
}

// TestTakeRefusals: what cannot be snapshotted is refused before anything
// is frozen or mounted, and a freeze that never settles leaves the
// sandbox thawed.
func TestTakeRefusals(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	r.sb.src.Upper = ""
	_, err := r.s.Take(ctx, r.sb, "", 0)
	wantCode(t, err, api.CodeConflict, "n1-sb1", "no writable layer")

	r = newRig(t)
	r.host.quota = &api.Error{Code: api.CodeTooManyRequests, Message: "project p1 stores too much"}
	_, err = r.s.Take(ctx, r.sb, "", 0)
	wantCode(t, err, api.CodeTooManyRequests)
	if r.rt.freezes != 0 || len(r.layers.packed) != 0 {
		t.Fatal("a snapshot over the quota froze or packed the sandbox")
	}

	r = newRig(t)
	r.sb.src.Spec.Tier = api.TierMicroVM // no agent: the VM does not run
	_, err = r.s.Take(ctx, r.sb, "", 0)
	wantCode(t, err, api.CodeConflict, "not running")
	if len(r.layers.mounted) != 0 {
		t.Fatal("a refused VM snapshot left its layers mounted")
	}

	r = newRig(t)
	r.rt.failFreezes = 100
	_, err = r.s.Take(ctx, r.sb, "", 0)
	wantCode(t, err, api.CodeUnavailable, "could not be frozen")
	if r.rt.frozen || r.rt.freezes != 5 {
		t.Fatalf("after %d failed freezes the sandbox is frozen=%v", r.rt.freezes, r.rt.frozen)
	}
	if len(r.store.recs) != 0 {
		t.Fatal("a failed snapshot was recorded")
	}
}

// TestRestore: a create from a snapshot takes its image and layers; what
// a snapshot cannot give is refused with the reason.
func TestRestore(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	chain := []api.LayerAttachment{{Layer: "tools@1", Mount: "/opt"}, {Layer: "snap/snap-aaaa@1"}}
	if err := r.store.Put(ctx, "snap-aaaa", &api.Snapshot{ID: "snap-aaaa", Image: "img", Layers: chain}); err != nil {
		t.Fatal(err)
	}
	long := make([]api.LayerAttachment, 200)
	for i := range long {
		long[i].Layer = fmt.Sprintf("l%d@1", i)
	}
	if err := r.store.Put(ctx, "snap-long", &api.Snapshot{ID: "snap-long", Image: "img", Layers: long}); err != nil {
		t.Fatal(err)
	}
	spec := api.CreateSandboxRequest{Snapshot: "snap-aaaa"}
	snap, err := r.s.Restore(ctx, &spec)
	if err != nil || snap.ID != "snap-aaaa" || spec.Image != "img" || len(spec.Layers) != 2 {
		t.Fatalf("restore: %v %+v", err, spec)
	}
	if snap, err := r.s.Restore(ctx, &api.CreateSandboxRequest{Image: "x"}); snap != nil || err != nil {
		t.Fatalf("a create without a snapshot: %v %v", snap, err)
	}
	for _, c := range []struct {
		spec  api.CreateSandboxRequest
		code  string
		words []string
	}{
		{api.CreateSandboxRequest{Snapshot: "snap-aaaa", Image: "x"}, api.CodeInvalid, []string{"takes its image"}},
		{api.CreateSandboxRequest{Snapshot: "snap-none"}, api.CodeNotFound, []string{"snap-none"}},
		{api.CreateSandboxRequest{Snapshot: "../etc"}, api.CodeInvalid, []string{"malformed"}},
		{api.CreateSandboxRequest{Snapshot: "snap-long"}, api.CodeInvalid, []string{"chains 200 layers"}},
		{api.CreateSandboxRequest{Snapshot: "snap-aaaa", Tier: api.TierMicroVM}, api.CodeInvalid, []string{"tools@1", "/opt", "restore it as a container"}},
	} {
		_, err := r.s.Restore(ctx, &c.spec)
		wantCode(t, err, c.code, c.words...)
	}
}

// TestCheckScope: a scoped create reaches only snapshots (and snap/
// layers) of its scope; unknown and malformed ones are the create's to
// refuse.
func TestCheckScope(t *testing.T) {
	ctx := context.Background()
	r := newRig(t)
	if err := r.store.Put(ctx, "snap-p1", &api.Snapshot{ID: "snap-p1", Project: "p1"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		spec  api.CreateSandboxRequest
		scope string
		ok    bool
	}{
		{api.CreateSandboxRequest{Snapshot: "snap-p1"}, "p1", true},
		{api.CreateSandboxRequest{Snapshot: "snap-p1"}, "", true},
		{api.CreateSandboxRequest{Snapshot: "snap-p1"}, "p1.c", false},
		{api.CreateSandboxRequest{Snapshot: "snap-p1"}, "p2", false},
		{api.CreateSandboxRequest{Image: "x", Layers: []api.LayerAttachment{{Layer: "snap/snap-p1@1"}}}, "p2", false},
		{api.CreateSandboxRequest{Image: "x", Layers: []api.LayerAttachment{{Layer: "snap/snap-p1", Mount: "/m"}}}, "p1", true},
		{api.CreateSandboxRequest{Snapshot: "snap-none"}, "p2", true},
		{api.CreateSandboxRequest{Snapshot: "../x"}, "p2", true},
	} {
		err := r.s.CheckScope(ctx, &c.spec, c.scope)
		if c.ok != (err == nil) {
			t.Errorf("%+v in scope %q: %v", c.spec, c.scope, err)
		}
		if err != nil {
			wantCode(t, err, api.CodeNotFound, "not found")
		}
	}
}
