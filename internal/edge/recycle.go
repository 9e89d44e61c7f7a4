package edge

// Lock order: Edge.mu, then sandbox.mu (the whole order is in edge.go).

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
)

// Recycled containers (docs/architecture.md, "Recycled containers"). When
// a sandbox is deleted, its container (namespaces, cgroups, agent) is
// wiped while the delete is answered: every process killed, IPC objects
// removed, sessions forgotten. It is then rerooted into a fresh root of the
// same layers, with a new writable layer, and the old root and writable
// layer are freed at once. It waits, up to RecycleIdle, for a create of the
// same shape (project, CPU, memory, pids, priority, hostname), which
// resumes it with its own environment and user; a create with other
// layers or another disk limit reroots it once more. A container that
// could pass anything on is not kept: one with sockets left in its network
// namespace (a networked one keeps its link and address for the next
// networked sandbox, with nothing else of its network: sandboxnet.Park), or whose agent's scheduling or limits were changed from
// inside, or that was paused, busy, stateless or failed. Wiped containers
// have no record: after a crash, reconcile destroys them like any
// leftover.

// DefaultRecycleIdle is how long a wiped container waits for a create.
const DefaultRecycleIdle = 30 * time.Second

// wipedBox is a wiped, rerooted container waiting for a create of its
// shape.
type wipedBox struct {
	key   string // recycleKey
	root  string // rootKey of its fresh root
	inst  *runtime.Instance
	store string // the container's name: cgroup, state dir
	layer string // the fresh root's writable layer (and layer-mount holder)
	upper string
	since time.Time
}

// recycleKey is the shape a container fixes for every sandbox it holds.
func recycleKey(s *api.CreateSandboxRequest) string {
	// A networked container keeps its link for the next networked
	// sandbox (its policy is that sandbox's: runtime Resume).
	return fmt.Sprintf("%s|%s|%g|%d|%d|%s|%s|%t", s.Project, s.Tier, s.CPU, s.MemoryMB, s.Pids, s.Priority, s.Hostname, s.Network != nil)
}

// rootKey names a root: its layers (diff ids, top-most first) and the
// limit of its writable layer.
func rootKey(layers []string, diskMB int64) string {
	return strings.Join(layers, ",") + "|" + strconv.FormatInt(diskMB, 10)
}

func (e *Edge) recycler() runtime.Recycler {
	if e.cfg.Recycle <= 0 {
		return nil
	}
	r, _ := e.cfg.Runtime.(runtime.Recycler)
	return r
}

// recyclableLocked says whether sb's container may be kept when it stops
// (called with sb.mu held, as stop begins; roomFor decides next).
func (e *Edge) recyclableLocked(sb *sandbox, state string) bool {
	return e.recycler() != nil && state == api.StateStopped && sb.inst != nil && sb.rec.Handle != nil &&
		!sb.stateless && sb.pool == "" && sb.inflight == 0 && !sb.pausing &&
		sb.rec.Sandbox.State == api.StateRunning && len(sb.rec.Binds) == 0
}

// roomFor says whether the shelf of shape key has room for one more.
func (e *Edge) roomFor(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return !e.closing && len(e.wiped[key]) < e.cfg.Recycle
}

// keepContainer wipes the stopping sandbox's container, gives it a fresh
// root of the same layers, frees the old one and shelves the container for
// reuse. False when it cannot be kept: the caller destroys it and frees its
// storage.
func (e *Edge) keepContainer(ctx context.Context, sb *sandbox, inst *runtime.Instance) bool {
	sb.mu.Lock()
	key, store, oldLayer := recycleKey(&sb.rec.Spec), sb.rec.storage(), sb.rec.layer()
	layers, diskMB := append([]string(nil), sb.rec.Layers...), sb.rec.Spec.DiskMB
	sb.mu.Unlock()
	if !e.roomFor(key) {
		return false
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := e.recycler().Wipe(wctx, inst); err != nil {
		e.mu.Lock()
		e.recycling.Refused++
		e.mu.Unlock()
		if errors.Is(err, runtime.ErrNotReusable) {
			e.log.Debug("container not recycled", "id", sb.rec.Sandbox.ID, "err", err)
		} else {
			e.log.Warn("wipe for recycling", "id", sb.rec.Sandbox.ID, "err", err)
		}
		return false
	}
	sb.unwatch()
	box := &wipedBox{key: key, root: rootKey(layers, diskMB), inst: inst, store: store, layer: e.newID()}
	if err := e.rerootBox(wctx, box, layers, diskMB); err != nil {
		e.log.Warn("reroot for recycling", "id", sb.rec.Sandbox.ID, "err", err)
		return false
	}
	e.freeLayer(oldLayer)
	box.since = time.Now()
	e.mu.Lock()
	if e.closing || len(e.wiped[key]) >= e.cfg.Recycle {
		// Close may have emptied the shelf already, or other deletes
		// filled it meanwhile.
		e.mu.Unlock()
		e.discardBox(box)
		return true
	}
	e.wiped[key] = append(e.wiped[key], box)
	e.recycling.Kept++
	e.mu.Unlock()
	return true
}

// rerootBox gives box's container a fresh root of layers, with a new
// writable layer named box.layer (freed again on an error).
func (e *Edge) rerootBox(ctx context.Context, box *wipedBox, layers []string, diskMB int64) (err error) {
	defer func() {
		if err != nil {
			e.freeLayer(box.layer)
		}
	}()
	upper, work, err := e.allocWritable(box.layer, diskMB)
	if err != nil {
		return err
	}
	box.upper = upper
	lowers, err := e.cfg.Images.MountLayers(box.layer, layers)
	if err != nil {
		return fmt.Errorf("mount layers: %w", err)
	}
	return e.recycler().Reroot(ctx, box.inst, &runtime.Spec{Lowers: lowers, Upper: box.upper, Work: work})
}

// rerootInto gives a shelved container the root of spec (whose writable
// layer is then the new sandbox's), lets its own go and resumes it; nil
// (and the container destroyed) when that fails.
func (e *Edge) rerootInto(ctx context.Context, box *wipedBox, spec *runtime.Spec) *runtime.Instance {
	if err := e.recycler().Reroot(ctx, box.inst, spec); err != nil {
		e.log.Warn("recycled container failed; starting a new one", "container", box.store, "err", err)
		e.discardBox(box)
		return nil
	}
	e.freeLayer(box.layer) // the root it had was let go
	box.layer = ""         // its root is the caller's now
	return e.resumeBox(ctx, box, spec)
}

// resumeBox makes a shelved container serve a new sandbox with spec's
// environment and user, or destroys it (nil).
func (e *Edge) resumeBox(ctx context.Context, box *wipedBox, spec *runtime.Spec) *runtime.Instance {
	if err := e.recycler().Resume(ctx, box.inst, spec); err != nil {
		e.log.Warn("recycled container failed; starting a new one", "container", box.store, "err", err)
		e.discardBox(box)
		return nil
	}
	e.mu.Lock()
	e.recycling.Reused++
	e.mu.Unlock()
	return box.inst
}

// takeWiped hands out a wiped container of shape key, one whose root is
// root when there is one, else the one kept the longest; nil when none
// waits.
func (e *Edge) takeWiped(key, root string) *wipedBox {
	e.mu.Lock()
	defer e.mu.Unlock()
	boxes := e.wiped[key]
	if len(boxes) == 0 {
		return nil
	}
	i := 0
	for j, b := range boxes {
		if b.root == root {
			i = j
			break
		}
	}
	box := boxes[i]
	boxes = append(boxes[:i], boxes[i+1:]...)
	if len(boxes) == 0 {
		delete(e.wiped, key)
	} else {
		e.wiped[key] = boxes
	}
	return box
}

// discardBox destroys a wiped container and frees what it still holds.
func (e *Edge) discardBox(box *wipedBox) {
	_ = box.inst.Agent.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.cfg.Runtime.Destroy(ctx, box.inst.Handle); err != nil {
		// Reconcile at the next start removes what is left.
		e.log.Error("destroy recycled container", "store", box.store, "err", err)
		return
	}
	e.freeStorage(box.store, box.layer)
}

// expireWiped destroys the wiped containers that waited longer than
// RecycleIdle (all of them when idle is 0).
func (e *Edge) expireWiped(idle time.Duration) {
	now := time.Now()
	var old []*wipedBox
	e.mu.Lock()
	for key, boxes := range e.wiped {
		keep := boxes[:0]
		for _, b := range boxes {
			if idle > 0 && now.Sub(b.since) < idle {
				keep = append(keep, b)
			} else {
				old = append(old, b)
			}
		}
		if len(keep) == 0 {
			delete(e.wiped, key)
		} else {
			e.wiped[key] = keep
		}
	}
	e.mu.Unlock()
	for _, b := range old {
		e.discardBox(b)
	}
}

// recyclingLocked is the node view's recycling figures (e.mu held).
func (e *Edge) recyclingLocked() api.NodeRecycling {
	r := e.recycling
	for _, boxes := range e.wiped {
		r.Waiting += len(boxes)
	}
	return r
}
