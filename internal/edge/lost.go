package edge

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
)

// Lost sandboxes. When this node misses its heartbeats, the watchers record
// the sandboxes it held in the lost bucket and report them lost; from then
// on the control plane treats them as gone (a trajectory's sandbox is
// rebuilt on another node). So the node never brings them back: at start
// it destroys the ones recorded lost instead of adopting them, and while it
// runs (a partition: it was alive but unheard) it destroys any that a new
// record names. Each is answered as state "lost" for as long as its record
// is kept, and a sandbox.destroyed event says it was destroyed.

// watchLost loads the lost records of this node (before reconcile) and
// follows new ones.
func (e *Edge) watchLost(ctx context.Context) error {
	return e.lostKV.Watch(ctx, e.cfg.Node, func(lost map[string]string, initial bool) {
		if initial {
			e.mu.Lock()
			for id, project := range lost {
				e.lost[id] = project
			}
			e.mu.Unlock()
			return
		}
		select {
		case <-e.reconciled:
		case <-ctx.Done():
			return
		}
		e.destroyLost(ctx, lost)
	})
}

// destroyLost stops the live sandboxes among lost (recorded lost while this
// node was running).
func (e *Edge) destroyLost(ctx context.Context, lost map[string]string) {
	var victims []*sandbox
	e.mu.Lock()
	for id, project := range lost {
		if NodeOf(id) != e.cfg.Node {
			continue
		}
		e.lost[id] = project
		if sb := e.sandboxes[id]; sb != nil && sb.live() && !sb.pooled() {
			victims = append(victims, sb)
		}
	}
	e.mu.Unlock()
	for _, sb := range victims {
		e.log.Warn("destroying a sandbox the control plane reported lost", "id", sb.rec.Sandbox.ID)
		e.stop(ctx, sb, api.StateLost, LostReason(e.cfg.Node))
		e.lostDestroyed(sb.rec.Sandbox.ID, sb.rec.Spec.Project)
	}
}

// reconcileLost destroys a sandbox found at start that was recorded lost
// (reconcile, before serving) and keeps its tombstone.
func (e *Edge) reconcileLost(ctx context.Context, rec record) *sandbox {
	id, store := rec.Sandbox.ID, rec.storage()
	h := runtime.Handle{ID: store, Socket: filepath.Join(e.stateDir(store), "agent.sock")}
	if rec.Handle != nil {
		h = *rec.Handle
	}
	e.log.Warn("destroying a sandbox the control plane reported lost", "id", id)
	if err := e.cfg.Runtime.Destroy(ctx, h); err != nil {
		e.log.Error("destroy lost sandbox", "id", id, "err", err)
	}
	e.freeStorage(store, rec.layer())
	e.dropRecord(id)
	rec.Sandbox.State, rec.Sandbox.Reason = api.StateLost, LostReason(e.cfg.Node)
	sb := &sandbox{rec: rec, stoppedAt: time.Now(), stopping: true, ready: make(chan struct{})}
	close(sb.ready)
	e.pendingLost = append(e.pendingLost, [2]string{id, rec.Spec.Project})
	return sb
}

// lostDestroyed publishes sandbox.destroyed for a lost sandbox.
func (e *Edge) lostDestroyed(id, project string) {
	if e.events == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ev := api.Event{Time: time.Now().UTC(), Type: api.EventSandboxDestroyed, Node: e.cfg.Node, Sandbox: id, Project: project,
		Message: fmt.Sprintf("reported lost while node %s was unheard; destroyed by its node", e.cfg.Node)}
	if err := e.events.Publish(ctx, ev, "destroyed-"+id); err != nil {
		e.log.Warn("publish event", "type", ev.Type, "err", err)
	}
}

// lostTombstone answers for a sandbox recorded lost that this node no
// longer holds (destroyed before a restart, or its tombstone expired).
func (e *Edge) lostTombstone(id string) *sandbox {
	project, ok := e.lost[id]
	if !ok {
		return nil
	}
	sb := &sandbox{rec: record{Sandbox: api.Sandbox{ID: id, Node: e.cfg.Node, Project: project, State: api.StateLost,
		Reason: LostReason(e.cfg.Node)}, Spec: api.CreateSandboxRequest{Project: project}}, stopping: true, ready: make(chan struct{})}
	close(sb.ready)
	return sb
}
