package edge

// Fork from memory (OpForkMemory): children started from a memory snapshot
// of a running VM sandbox, continuing its processes. Each child is a
// sandbox like any other: its own record, writable storage (the runtime
// copies the source's disk into it), references to the source's layers,
// admission and the source's owner, project and limits. The source is
// stopped for the snapshot and runs on (a paused source is resumed first).
//
// Locks: as create (Edge.mu, then nothing; sandbox.mu alone).

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// forkTimeout bounds a whole fork from memory (snapshot, disk copies,
// every child's restore: seconds each under TCG).
const forkTimeout = 5 * time.Minute

// notMemoryForkable is the 422 of a sandbox whose tier cannot fork from
// memory.
func notMemoryForkable(id, tier string) *api.Error {
	if tier == "" {
		tier = api.TierContainer
	}
	return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf(
		"sandbox %s is a %s sandbox: a fork from memory needs tier %s (a disk fork, without \"memory\", works on every tier)",
		id, tier, strings.Join(api.MemoryForkTiers, " or "))}
}

func (e *Edge) forkMemory(ctx context.Context, req *ForkMemoryRequest) (*ForkMemoryResult, error) {
	if len(req.Children) == 0 {
		return nil, badRequest("a fork needs at least one child id")
	}
	seen := map[string]bool{}
	for _, id := range req.Children {
		if NodeOf(id) != e.cfg.Node || seen[id] || id == req.ID {
			return nil, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("child id %q: not a new sandbox id of node %s", id, e.cfg.Node)}
		}
		seen[id] = true
	}
	src, err := e.lookup(req.ID)
	if err != nil {
		return nil, err
	}
	<-src.ready
	src.mu.Lock()
	tier := src.rec.Spec.Tier
	src.mu.Unlock()
	fk, ok := e.cfg.Runtime.(runtime.MemoryForker)
	if !ok || !slices.Contains(api.MemoryForkTiers, tier) {
		return nil, notMemoryForkable(req.ID, tier)
	}
	// acquire resumes a paused source and holds it as busy meanwhile.
	src, _, release, err := e.acquire(req.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	src.mu.Lock()
	rec := src.rec
	rec.Spec.Labels = copyMap(rec.Spec.Labels)
	h := src.inst.Handle
	src.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), forkTimeout)
	defer cancel()
	t0 := time.Now()
	kids := make([]*sandbox, 0, len(req.Children))
	specs := make([]*runtime.Spec, 0, len(req.Children))
	fail := func(err error) (*ForkMemoryResult, error) {
		for _, sb := range kids {
			id := sb.rec.Sandbox.ID
			e.freeStorage(id, id)
			sb.createErr = err
			e.mu.Lock()
			e.dropLocked(id)
			e.mu.Unlock()
			close(sb.ready)
		}
		return nil, err
	}
	for _, id := range req.Children {
		sb, rspec, err := e.forkChild(ctx, id, &rec)
		if sb != nil {
			kids = append(kids, sb)
		}
		if err != nil {
			return fail(err)
		}
		specs = append(specs, rspec)
	}
	insts, err := fk.Fork(ctx, h, specs)
	if err != nil {
		if errors.Is(err, runtime.ErrNoMemoryFork) {
			return fail(notMemoryForkable(req.ID, tier))
		}
		return fail(&api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("fork of %s from memory: %v", req.ID, err)})
	}
	out := &ForkMemoryResult{Sandboxes: make([]api.Sandbox, 0, len(kids))}
	var firstErr error
	for i, sb := range kids {
		if firstErr == nil {
			firstErr = e.started(ctx, sb, insts[i], t0)
			if firstErr == nil {
				out.Sandboxes = append(out.Sandboxes, sb.view())
				continue
			}
		} else {
			_ = insts[i].Agent.Close()
			_ = e.cfg.Runtime.Destroy(context.WithoutCancel(ctx), insts[i].Handle)
		}
		id := sb.rec.Sandbox.ID
		e.freeStorage(id, id)
		sb.createErr = firstErr
		e.mu.Lock()
		e.dropLocked(id)
		e.mu.Unlock()
		close(sb.ready)
	}
	if firstErr != nil {
		// The children started are deleted: a fork is whole or nothing.
		for _, v := range out.Sandboxes {
			if sb, err := e.lookup(v.ID); err == nil {
				close(sb.ready)
				e.stop(context.WithoutCancel(ctx), sb, api.StateStopped, "the fork failed")
			}
		}
		return nil, firstErr
	}
	for _, sb := range kids {
		close(sb.ready)
	}
	e.log.Info("sandbox forked from memory", "id", req.ID, "children", len(kids), "took", time.Since(t0))
	return out, nil
}

// forkChild admits and records child id of the source rec and makes its
// storage and layer references; the runtime spec it returns starts it.
// A sandbox returned with an error is recorded and must be undone.
func (e *Edge) forkChild(ctx context.Context, id string, src *record) (*sandbox, *runtime.Spec, error) {
	spec := src.Spec
	spec.Labels = copyMap(src.Spec.Labels)
	spec.Snapshot, spec.Trajectory, spec.Resume, spec.Branch = "", "", false, false
	// The create's hostname when it named one, else the child's id: a
	// sibling's name is never the child's unless asked for.
	if spec.Hostname == "" || spec.Hostname == sandboxspec.DefaultHostname {
		spec.Hostname = id
	}
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		return nil, nil, &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonShuttingDown, Message: "node is shutting down"}
	}
	if _, ok := e.sandboxes[id]; ok {
		e.mu.Unlock()
		return nil, nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s exists", id)}
	}
	if aerr := e.admitLocked(&spec); aerr != nil {
		e.mu.Unlock()
		return nil, nil, aerr
	}
	now := time.Now().UTC()
	expires := now.Add(time.Duration(spec.TTL) * time.Second)
	sb := &sandbox{
		rec: record{
			Spec:   spec,
			Layers: append([]string(nil), src.Layers...),
			Sandbox: api.Sandbox{
				ID: id, State: api.StateCreating, Node: e.cfg.Node, Project: spec.Project, Tier: spec.Tier, Image: spec.Image,
				CPU: spec.CPU, MemoryMB: spec.MemoryMB, DiskMB: spec.DiskMB, Pids: spec.Pids,
				Labels: copyMap(spec.Labels), User: spec.User, TTL: spec.TTL, IdleTimeout: spec.IdleTimeout,
				Priority: spec.Priority, IdleAction: spec.IdleTimeoutAction,
				Layers:    append([]string(nil), src.Sandbox.Layers...),
				CreatedAt: now, ExpiresAt: &expires,
			},
		},
		lastActive: now,
		ready:      make(chan struct{}),
	}
	e.putLocked(id, sb)
	e.mu.Unlock()

	upper, work, err := e.allocWritable(id, spec.DiskMB)
	if err != nil {
		return sb, nil, err
	}
	sb.mu.Lock()
	sb.rec.Upper = upper
	sb.mu.Unlock()
	// The child holds the layers as a start would: released with its
	// writable layer.
	dirs, err := e.cfg.Images.MountLayers(id, src.Layers)
	if err != nil {
		return sb, nil, fmt.Errorf("mount layers: %w", err)
	}
	return sb, &runtime.Spec{
		ID: id, Hostname: spec.Hostname, StateDir: e.stateDir(id), Lowers: dirs, Upper: upper, Work: work,
		CPU: spec.CPU, MemoryMB: spec.MemoryMB, Pids: spec.Pids, DiskMB: spec.DiskMB,
		Priority: spec.Priority, Tier: spec.Tier,
	}, nil
}
