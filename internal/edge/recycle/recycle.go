// Package recycle is the edge's recycled containers (docs/architecture.md,
// "Recycled containers"), written against the lifecycle core
// (internal/edge/core). When a sandbox is deleted, its container
// (namespaces, cgroups, agent) is wiped while the delete is answered: every
// process killed, IPC objects removed, sessions forgotten. It is then
// rerooted into a fresh root of the same layers, with a new writable layer,
// and the old root and writable layer are freed at once. It waits on the
// Shelf, up to the edge's RecycleIdle, for a create of the same shape
// (project, CPU, memory, pids, priority, hostname), which resumes it with
// its own environment and user; a create with other layers or another disk
// limit reroots it once more. A container that could pass anything on is
// not kept: one with sockets left in its network namespace, or whose
// agent's scheduling or limits were changed from inside (the runtime's
// Wipe refuses those), or that was paused, busy, stateless or failed (the
// core decides those before it offers one, see Keep). Wiped containers have
// no record: after a crash, reconcile destroys them like any leftover.
//
// Lock order: Shelf.mu is a leaf. It is taken under no lock of the core
// and nothing (no core method, no runtime call) is called while it is
// held.
package recycle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge/core"
	"github.com/warrenhq/warren/internal/runtime"
)

// DefaultIdle is how long a wiped container waits for a create.
const DefaultIdle = 30 * time.Second

// Box is a wiped, rerooted container waiting for a create of its shape.
type Box struct {
	// Root names its fresh root (RootKey): a create of the same root
	// takes it as it is (Resume), another reroots it (Reroot).
	Root string
	// Store is the container's name (cgroup, state dir); Layer its fresh
	// root's writable layer (and layer-mount holder), "" once a Reroot
	// gave it the caller's; Upper that layer's overlay upper directory.
	Store, Layer, Upper string

	key   string // Key of its shape
	inst  *runtime.Instance
	since time.Time
}

// Key is the shape a container fixes for every sandbox it holds.
func Key(s *api.CreateSandboxRequest) string {
	// A networked container keeps its link and address for the next
	// networked sandbox (its policy is that sandbox's: runtime Resume).
	return fmt.Sprintf("%s|%s|%g|%d|%d|%s|%s|%t", s.Project, s.Tier, s.CPU, s.MemoryMB, s.Pids, s.Priority, s.Hostname, s.Network != nil)
}

// RootKey names a root: its layers (diff ids, top-most first) and the
// limit of its writable layer.
func RootKey(layers []string, diskMB int64) string {
	return strings.Join(layers, ",") + "|" + strconv.FormatInt(diskMB, 10)
}

// Shelf is the node's wiped containers, by shape.
type Shelf struct {
	core     core.Core
	roots    core.Roots
	rt       runtime.Runtime
	r        runtime.Recycler // nil: recycling is off
	perShape int

	mu     sync.Mutex
	boxes  map[string][]*Box // by Key
	counts api.NodeRecycling // kept, reused, refused (Waiting is counted by Stats)
	closed bool
}

// New returns the shelf of the node whose core is c, keeping up to
// perShape containers of one shape; recycling is off (Enabled false) when
// perShape is 0 or rt cannot recycle (runtime.Recycler).
func New(c core.Core, roots core.Roots, rt runtime.Runtime, perShape int) *Shelf {
	s := &Shelf{core: c, roots: roots, rt: rt, perShape: perShape, boxes: map[string][]*Box{}}
	if perShape > 0 {
		s.r, _ = rt.(runtime.Recycler)
	}
	return s
}

// Enabled reports whether containers are recycled at all.
func (s *Shelf) Enabled() bool { return s.r != nil }

// Leaving is a stopping sandbox whose container the core offers to Keep.
type Leaving struct {
	ID     string // the sandbox's id (logs)
	Spec   *api.CreateSandboxRequest
	Store  string // the container's name
	Layer  string // the sandbox's writable layer, freed once rerooted
	Layers []string
	Inst   *runtime.Instance
	// Unwatch is called once the container is wiped: its agent's channel
	// lives on into the next sandbox, so the core stops watching it.
	Unwatch func()
}

// room says whether the shelf of shape key has room for one more.
func (s *Shelf) room(key string) bool {
	if s.core.Closing() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.closed && len(s.boxes[key]) < s.perShape
}

// Keep wipes the leaving sandbox's container, gives it a fresh root of the
// same layers, frees the old one and shelves the container for reuse.
// False when it cannot be kept: the caller destroys it and frees its
// storage. True also when a kept container found the shelf full or closed
// at the end: it is then destroyed here.
func (s *Shelf) Keep(ctx context.Context, l Leaving) bool {
	key := Key(l.Spec)
	if !s.Enabled() || !s.room(key) {
		return false
	}
	log := s.core.Logger()
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.r.Wipe(wctx, l.Inst); err != nil {
		s.mu.Lock()
		s.counts.Refused++
		s.mu.Unlock()
		if errors.Is(err, runtime.ErrNotReusable) {
			log.Debug("container not recycled", "id", l.ID, "err", err)
		} else {
			log.Warn("wipe for recycling", "id", l.ID, "err", err)
		}
		return false
	}
	if l.Unwatch != nil {
		l.Unwatch()
	}
	box := &Box{key: key, Root: RootKey(l.Layers, l.Spec.DiskMB), inst: l.Inst, Store: l.Store, Layer: s.roots.NewID()}
	if err := s.rerootBox(wctx, box, l.Layers, l.Spec.DiskMB); err != nil {
		log.Warn("reroot for recycling", "id", l.ID, "err", err)
		return false
	}
	s.roots.FreeLayer(l.Layer)
	box.since = time.Now()
	s.mu.Lock()
	if s.closed || len(s.boxes[key]) >= s.perShape {
		// Close may have emptied the shelf already, or other deletes
		// filled it meanwhile.
		s.mu.Unlock()
		s.Discard(box)
		return true
	}
	s.boxes[key] = append(s.boxes[key], box)
	s.counts.Kept++
	s.mu.Unlock()
	return true
}

// rerootBox gives box's container a fresh root of layers, with a new
// writable layer named box.Layer (freed again on an error).
func (s *Shelf) rerootBox(ctx context.Context, box *Box, layers []string, diskMB int64) (err error) {
	defer func() {
		if err != nil {
			s.roots.FreeLayer(box.Layer)
		}
	}()
	upper, work, err := s.roots.AllocWritable(box.Layer, diskMB)
	if err != nil {
		return err
	}
	box.Upper = upper
	lowers, err := s.roots.MountLayers(box.Layer, layers)
	if err != nil {
		return fmt.Errorf("mount layers: %w", err)
	}
	return s.r.Reroot(ctx, box.inst, &runtime.Spec{Lowers: lowers, Upper: box.Upper, Work: work})
}

// Reroot gives a shelved container the root of spec (whose writable layer
// is then the new sandbox's), lets its own go and resumes it; nil (and the
// container destroyed) when that fails.
func (s *Shelf) Reroot(ctx context.Context, box *Box, spec *runtime.Spec) *runtime.Instance {
	if err := s.r.Reroot(ctx, box.inst, spec); err != nil {
		s.core.Logger().Warn("recycled container failed; starting a new one", "container", box.Store, "err", err)
		s.Discard(box)
		return nil
	}
	s.roots.FreeLayer(box.Layer) // the root it had was let go
	box.Layer = ""               // its root is the caller's now
	return s.Resume(ctx, box, spec)
}

// Resume makes a shelved container serve a new sandbox with spec's
// environment and user, or destroys it (nil).
func (s *Shelf) Resume(ctx context.Context, box *Box, spec *runtime.Spec) *runtime.Instance {
	if err := s.r.Resume(ctx, box.inst, spec); err != nil {
		s.core.Logger().Warn("recycled container failed; starting a new one", "container", box.Store, "err", err)
		s.Discard(box)
		return nil
	}
	s.mu.Lock()
	s.counts.Reused++
	s.mu.Unlock()
	return box.inst
}

// Take hands out a wiped container of spec's shape, one whose root is root
// when there is one, else the one kept the longest; nil when none waits.
func (s *Shelf) Take(spec *api.CreateSandboxRequest, root string) *Box {
	key := Key(spec)
	s.mu.Lock()
	defer s.mu.Unlock()
	boxes := s.boxes[key]
	if len(boxes) == 0 {
		return nil
	}
	i := 0
	for j, b := range boxes {
		if b.Root == root {
			i = j
			break
		}
	}
	box := boxes[i]
	boxes = append(boxes[:i], boxes[i+1:]...)
	if len(boxes) == 0 {
		delete(s.boxes, key)
	} else {
		s.boxes[key] = boxes
	}
	return box
}

// Discard destroys a wiped container and frees what it still holds.
func (s *Shelf) Discard(box *Box) {
	_ = box.inst.Agent.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.rt.Destroy(ctx, box.inst.Handle); err != nil {
		// Reconcile at the next start removes what is left.
		s.core.Logger().Error("destroy recycled container", "store", box.Store, "err", err)
		return
	}
	s.roots.FreeStorage(box.Store, box.Layer)
}

// Expire destroys the wiped containers that waited longer than idle (all
// of them when idle is 0).
func (s *Shelf) Expire(idle time.Duration) {
	now := time.Now()
	var old []*Box
	s.mu.Lock()
	for key, boxes := range s.boxes {
		keep := boxes[:0]
		for _, b := range boxes {
			if idle > 0 && now.Sub(b.since) < idle {
				keep = append(keep, b)
			} else {
				old = append(old, b)
			}
		}
		if len(keep) == 0 {
			delete(s.boxes, key)
		} else {
			s.boxes[key] = keep
		}
	}
	s.mu.Unlock()
	for _, b := range old {
		s.Discard(b)
	}
}

// Close keeps no more containers and destroys those waiting.
func (s *Shelf) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.Expire(0)
}

// Stats is the node view's recycling figures.
func (s *Shelf) Stats() api.NodeRecycling {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.counts
	for _, boxes := range s.boxes {
		r.Waiting += len(boxes)
	}
	return r
}
