package edge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
)

// Recycled containers (docs/architecture.md, "Recycled containers"). A
// deleted sandbox's container (its namespaces, cgroups and agent) is wiped
// at once, while the delete is answered: every process killed, IPC objects
// removed, sessions forgotten. It then waits, up to RecycleIdle, for a
// create of the same shape (project, CPU, memory, pids, priority,
// hostname), which gets it with a fresh root of its own image and layers
// (runtime.Recycler's Reroot); only then is the old root, with the old
// writable layer, let go. A container that could pass anything on is not
// kept: one with sockets left in its network namespace, or whose agent's
// scheduling or limits were changed from inside, or that was paused,
// busy, stateless or failed. Wiped containers have no record: after a
// crash, reconcile destroys them like any leftover.

// DefaultRecycleIdle is how long a wiped container waits for a create.
const DefaultRecycleIdle = 30 * time.Second

// wipedBox is a wiped container waiting for a create of its shape.
type wipedBox struct {
	key      string
	inst     *runtime.Instance
	store    string // the container's name: cgroup, state dir
	oldLayer string // the writable layer (and layer mounts) of its last sandbox, freed on reroot
	since    time.Time
}

// recycleKey is the shape a container fixes for every sandbox it holds.
func recycleKey(s *api.CreateSandboxRequest) string {
	return fmt.Sprintf("%s|%s|%g|%d|%d|%s|%s", s.Project, s.Tier, s.CPU, s.MemoryMB, s.Pids, s.Priority, s.Hostname)
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

// keepContainer wipes the stopping sandbox's container and shelves it for
// reuse. False when it cannot be kept: the caller destroys it.
func (e *Edge) keepContainer(ctx context.Context, sb *sandbox, inst *runtime.Instance) bool {
	sb.mu.Lock()
	box := &wipedBox{key: recycleKey(&sb.rec.Spec), inst: inst, store: sb.rec.storage(), oldLayer: sb.rec.layer()}
	sb.mu.Unlock()
	if !e.roomFor(box.key) {
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
	box.since = time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		// Close may have destroyed the shelf already.
		e.mu.Unlock()
		e.discardBox(box)
		e.mu.Lock()
		return true
	}
	e.wiped[box.key] = append(e.wiped[box.key], box)
	e.recycling.Kept++
	return true
}

// takeWiped hands out the wiped container of shape key kept the longest,
// or nil.
func (e *Edge) takeWiped(key string) *wipedBox {
	e.mu.Lock()
	defer e.mu.Unlock()
	boxes := e.wiped[key]
	if len(boxes) == 0 {
		return nil
	}
	box := boxes[0]
	if len(boxes) == 1 {
		delete(e.wiped, key)
	} else {
		e.wiped[key] = boxes[1:]
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
	e.freeStorage(box.store, box.oldLayer)
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
