package edge

// Lock order: sandbox.mu is released before the shelf is called; the
// shelf's own lock (recycle.Shelf.mu) is a leaf (the whole order is in
// edge.go).

import (
	"context"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge/core"
	"github.com/warrenhq/warren/internal/edge/recycle"
	"github.com/warrenhq/warren/internal/runtime"
)

// Recycled containers are internal/edge/recycle's (its package comment);
// the core decides which sandbox may offer its container (recyclableLocked)
// and hands it on (stop, keepContainer), and create takes one from the
// shelf (create.go).

// DefaultRecycleIdle is how long a wiped container waits for a create.
const DefaultRecycleIdle = recycle.DefaultIdle

var _ core.Roots = jobCore{}

// recyclableLocked says whether sb's container may be kept when it stops
// (called with sb.mu held, as stop begins; the shelf decides next).
func (e *Edge) recyclableLocked(sb *sandbox, state string) bool {
	return e.shelf.Enabled() && state == api.StateStopped && sb.inst != nil && sb.rec.Handle != nil &&
		!sb.stateless && sb.pool == "" && sb.inflight == 0 && !sb.pausing &&
		sb.rec.Sandbox.State == api.StateRunning && len(sb.rec.Binds) == 0
}

// keepContainer offers the stopping sandbox's container to the shelf;
// false when it is not kept (the caller destroys it and frees its storage).
func (e *Edge) keepContainer(ctx context.Context, sb *sandbox, inst *runtime.Instance) bool {
	sb.mu.Lock()
	spec := sb.rec.Spec
	l := recycle.Leaving{
		ID: sb.rec.Sandbox.ID, Spec: &spec, Store: sb.rec.storage(), Layer: sb.rec.layer(),
		Layers: append([]string(nil), sb.rec.Layers...), Inst: inst, Unwatch: sb.unwatch,
	}
	sb.mu.Unlock()
	return e.shelf.Keep(ctx, l)
}

// NewID, AllocWritable, MountLayers, FreeLayer and FreeStorage make
// jobCore the core's core.Roots (sandbox.go).
func (c jobCore) NewID() string { return c.e.newID() }
func (c jobCore) AllocWritable(name string, diskMB int64) (upper, work string, err error) {
	return c.e.allocWritable(name, diskMB)
}
func (c jobCore) MountLayers(holder string, layers []string) ([]string, error) {
	return c.e.cfg.Images.MountLayers(holder, layers)
}
func (c jobCore) FreeLayer(name string)           { c.e.freeLayer(name) }
func (c jobCore) FreeStorage(store, layer string) { c.e.freeStorage(store, layer) }
