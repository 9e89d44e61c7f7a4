package edge

// Lock order: sandbox.snap (snapshot.State, held over the freeze and the
// copy), then sandbox.mu (the whole order is in edge.go).

import (
	"context"
	"log/slog"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge/snapshot"
)

// Snapshots are internal/edge/snapshot's (its package comment). The core
// answers the calls (snapshotOp, getSnapshot), restores a create from a
// snapshot (fromSnapshot) and checks a create's scope (checkSnapshotScope),
// each through e.snapshots with the sandbox as a snapshot.Sandbox
// (snapSandbox) and itself as its Host (snapHost).

// newSnapshotter is the node's snapshotter: records in e.snaps (opened by
// Start), layers in the image store, copies in the writable storage.
func (e *Edge) newSnapshotter() *snapshot.Snapshotter {
	return snapshot.New(snapshot.Config{
		Host: snapHost{e}, Store: snapRecords{e}, Layers: e.cfg.Images,
		Runtime: e.cfg.Runtime, Writable: e.cfg.Writable,
	})
}

// snapshotOp answers OpSnapshot.
func (e *Edge) snapshotOp(ctx context.Context, req *SnapshotRequest) (*api.Snapshot, error) {
	if len(req.Name) > 128 {
		return nil, invalidf("snapshot name is longer than 128 bytes")
	}
	sb, _, release, err := e.acquire(req.ID)
	if err != nil {
		return nil, err
	}
	snap, err := e.snapshot(ctx, sb, req.Name, 0)
	release()
	if err != nil {
		return nil, err
	}
	if req.Stop {
		e.stop(ctx, sb, api.StateStopped, "stopped after snapshot "+snap.ID)
	}
	return snap, nil
}

// snapshot snapshots sb (snapshot.Snapshotter.Take); the caller holds it
// (acquire).
func (e *Edge) snapshot(ctx context.Context, sb *sandbox, name string, step int64) (*api.Snapshot, error) {
	return e.snapshots.Take(ctx, snapSandbox{sb}, name, step)
}

// getSnapshot reads a snapshot record (404 when unknown).
func (e *Edge) getSnapshot(ctx context.Context, id string) (*api.Snapshot, error) {
	return e.snapshots.Get(ctx, id)
}

// fromSnapshot fills a create request's image and layers from its snapshot.
func (e *Edge) fromSnapshot(ctx context.Context, spec *api.CreateSandboxRequest) (*api.Snapshot, error) {
	return e.snapshots.Restore(ctx, spec)
}

// checkSnapshotScope refuses (404) a create on behalf of a project-scoped
// caller whose snapshot, or a snap/ layer, belongs to a project outside its
// scope, or that names a project's layer the scope does not see: the
// edge's own check behind the apiserver's (ownership).
func (e *Edge) checkSnapshotScope(ctx context.Context, spec *api.CreateSandboxRequest, scope string) error {
	if err := checkLayerScope(spec, scope); err != nil {
		return err
	}
	return e.snapshots.CheckScope(ctx, spec, scope)
}

// snapSandbox is sb as a snapshot takes it.
type snapSandbox struct{ *sandbox }

var _ snapshot.Sandbox = snapSandbox{}

func (s snapSandbox) SnapState() *snapshot.State { return &s.snap }

func (s snapSandbox) Source() snapshot.Source {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := &s.rec
	src := snapshot.Source{
		ID: r.Sandbox.ID, Layer: r.layer(), Upper: r.Upper,
		Lowers: append([]string(nil), r.Layers[:len(r.Layers)-len(r.Binds)]...),
		Spec:   r.Spec, Handle: r.Handle,
	}
	src.Spec.Layers = append([]api.LayerAttachment(nil), r.Spec.Layers...)
	if s.inst != nil {
		src.Agent = s.inst.Agent
	}
	return src
}

// snapHost is the core as snapshots see it.
type snapHost struct{ e *Edge }

func (h snapHost) Logger() *slog.Logger { return h.e.log }
func (h snapHost) CheckStorage(ctx context.Context, project string, n int64) error {
	return h.e.checkStorage(ctx, project, n)
}
func (h snapHost) Charge(ctx context.Context, project string, n int64) {
	h.e.charge(ctx, project, n)
}

// snapRecords is the snapshot records (e.snaps), once Start opened them.
type snapRecords struct{ e *Edge }

func (r snapRecords) Get(ctx context.Context, key string, v any) (bool, uint64, error) {
	return r.e.snaps.Get(ctx, key, v)
}
func (r snapRecords) Put(ctx context.Context, key string, v any) error {
	return r.e.snaps.Put(ctx, key, v)
}
func (r snapRecords) Delete(ctx context.Context, key string) error {
	return r.e.snaps.Delete(ctx, key)
}
