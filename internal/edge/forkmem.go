package edge

// Fork from memory (OpForkMemory) is internal/edge/fork's (its package
// comment): it checks the request, asks the runtime for the children and
// keeps the fork whole or nothing. The core admits, records and starts
// each child (forkChild, started) as forkHost: a child is a sandbox like
// any other, with its own record, writable storage (the runtime copies
// the source's disk into it), references to the source's layers,
// admission and the source's owner, project and limits.
//
// Locks: as create (Edge.mu, then nothing; sandbox.mu alone).

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge/fork"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

func (e *Edge) forkMemory(ctx context.Context, req *ForkMemoryRequest) (*ForkMemoryResult, error) {
	return e.forker.Fork(ctx, req)
}

// forkHost is the core as a fork from memory sees it.
type forkHost struct{ e *Edge }

var _ fork.Host = forkHost{}

// forkSource is a held source: a copy of its record and its container.
type forkSource struct {
	rec record
	h   runtime.Handle
}

func (s *forkSource) Handle() runtime.Handle { return s.h }

// forkChild is a child sandbox the core recorded.
type forkChild struct{ *sandbox }

func (c forkChild) ID() string { return c.rec.Sandbox.ID }

func (h forkHost) Logger() *slog.Logger { return h.e.log }
func (h forkHost) Node() string         { return h.e.cfg.Node }

func (h forkHost) Tier(id string) (string, error) {
	sb, err := h.e.lookup(id)
	if err != nil {
		return "", err
	}
	<-sb.ready
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.rec.Spec.Tier, nil
}

// Hold is acquire: it resumes a paused source and holds it as busy.
func (h forkHost) Hold(id string) (fork.Source, func(), error) {
	sb, _, release, err := h.e.acquire(id)
	if err != nil {
		return nil, nil, err
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	src := &forkSource{rec: sb.rec, h: sb.inst.Handle}
	src.rec.Spec.Labels = copyMap(src.rec.Spec.Labels)
	return src, release, nil
}

func (h forkHost) NewChild(ctx context.Context, id string, src fork.Source) (fork.Child, *runtime.Spec, error) {
	sb, spec, err := h.e.forkChild(ctx, id, &src.(*forkSource).rec)
	if sb == nil {
		return nil, nil, err
	}
	return forkChild{sb}, spec, err
}

func (h forkHost) Start(ctx context.Context, c fork.Child, inst *runtime.Instance, t0 time.Time) (api.Sandbox, error) {
	sb := c.(forkChild).sandbox
	if err := h.e.started(ctx, sb, inst, t0); err != nil {
		return api.Sandbox{}, err
	}
	return sb.view(), nil
}

func (h forkHost) Abandon(c fork.Child, err error) {
	sb := c.(forkChild).sandbox
	id := sb.rec.Sandbox.ID
	h.e.freeStorage(id, id)
	sb.createErr = err
	h.e.mu.Lock()
	h.e.dropLocked(id)
	h.e.mu.Unlock()
	close(sb.ready)
}

func (h forkHost) Done(c fork.Child) { close(c.(forkChild).ready) }

func (h forkHost) Stop(ctx context.Context, c fork.Child, reason string) {
	sb := c.(forkChild).sandbox
	close(sb.ready)
	h.e.stop(ctx, sb, api.StateStopped, reason)
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
