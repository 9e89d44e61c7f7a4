// Package fork is the edge's fork from memory (OpForkMemory), written
// against the lifecycle core: children started from a memory snapshot of
// a running VM sandbox, continuing its processes. Each child is a sandbox
// like any other, which the core admits, records and starts (Host); this
// package checks the request, asks the runtime (runtime.MemoryForker) for
// the children's instances and keeps the fork whole or nothing: when one
// child cannot start, every child is undone. The source is stopped for
// the snapshot and runs on (a paused source is resumed first: Host.Hold).
//
// Locks: none of its own; the core's (Host) are taken one call at a time.
package fork

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/runtime"
)

// Timeout bounds a whole fork from memory (snapshot, disk copies, every
// child's restore: seconds each under TCG).
const Timeout = 5 * time.Minute

// Source is a held source sandbox (Host.Hold).
type Source interface {
	// Handle is its running container.
	Handle() runtime.Handle
}

// Child is a child sandbox the core recorded (Host.NewChild).
type Child interface {
	ID() string
}

// Host is the core as a fork sees it.
type Host interface {
	Logger() *slog.Logger
	// Node is this node's name (a child id must be a new id of it).
	Node() string
	// Tier waits until sandbox id is created and returns its tier.
	Tier(id string) (string, error)
	// Hold holds sandbox id as busy (resuming it when paused) until
	// release is called.
	Hold(id string) (src Source, release func(), err error)
	// NewChild admits and records child id of src, with its writable
	// storage and layer references, and returns the runtime spec that
	// starts it. A Child returned with an error must be abandoned.
	NewChild(ctx context.Context, id string, src Source) (Child, *runtime.Spec, error)
	// Start makes c run in inst and records it; on an error inst is
	// destroyed and c must be abandoned.
	Start(ctx context.Context, c Child, inst *runtime.Instance, t0 time.Time) (api.Sandbox, error)
	// Abandon undoes a child that does not run (storage, record) and ends
	// its creation with err.
	Abandon(c Child, err error)
	// Done ends the creation of a child that runs.
	Done(c Child)
	// Stop ends the creation of a child that runs and stops it.
	Stop(ctx context.Context, c Child, reason string)
}

// Forker forks the node's sandboxes from memory.
type Forker struct {
	host Host
	rt   runtime.Runtime
	fk   runtime.MemoryForker // nil: the runtime cannot
}

// New returns the forker of the node whose core is h and runtime rt.
func New(h Host, rt runtime.Runtime) *Forker {
	f := &Forker{host: h, rt: rt}
	f.fk, _ = rt.(runtime.MemoryForker)
	return f
}

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

// checkChildren refuses a fork without children or with a child id that
// is not a new id of this node.
func (f *Forker) checkChildren(req *edgeproto.ForkMemoryRequest) error {
	if len(req.Children) == 0 {
		return &api.Error{Code: api.CodeBadRequest, Message: "a fork needs at least one child id"}
	}
	node := f.host.Node()
	seen := map[string]bool{}
	for _, id := range req.Children {
		if edgeproto.NodeOf(id) != node || seen[id] || id == req.ID {
			return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("child id %q: not a new sandbox id of node %s", id, node)}
		}
		seen[id] = true
	}
	return nil
}

// Fork starts req's children from a memory snapshot of sandbox req.ID,
// all of them or none.
func (f *Forker) Fork(ctx context.Context, req *edgeproto.ForkMemoryRequest) (*edgeproto.ForkMemoryResult, error) {
	if err := f.checkChildren(req); err != nil {
		return nil, err
	}
	tier, err := f.host.Tier(req.ID)
	if err != nil {
		return nil, err
	}
	if f.fk == nil || !slices.Contains(api.MemoryForkTiers, tier) {
		return nil, notMemoryForkable(req.ID, tier)
	}
	src, release, err := f.host.Hold(req.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	if src.Handle().Net != nil {
		// Every child would wake up with the source's address and
		// connections, on a network that is the source's.
		return nil, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf(
			"sandbox %s has a network: a fork from memory would give every child its address and connections; fork it without \"memory\" (from its disk) instead", req.ID)}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Timeout)
	defer cancel()
	t0 := time.Now()
	kids := make([]Child, 0, len(req.Children))
	specs := make([]*runtime.Spec, 0, len(req.Children))
	fail := func(err error) (*edgeproto.ForkMemoryResult, error) {
		for _, c := range kids {
			f.host.Abandon(c, err)
		}
		return nil, err
	}
	for _, id := range req.Children {
		c, spec, err := f.host.NewChild(ctx, id, src)
		if c != nil {
			kids = append(kids, c)
		}
		if err != nil {
			return fail(err)
		}
		specs = append(specs, spec)
	}
	insts, err := f.fk.Fork(ctx, src.Handle(), specs)
	if err != nil {
		if errors.Is(err, runtime.ErrNoMemoryFork) {
			return fail(notMemoryForkable(req.ID, tier))
		}
		return fail(&api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("fork of %s from memory: %v", req.ID, err)})
	}
	out, err := f.start(ctx, kids, insts, t0)
	if err != nil {
		return nil, err
	}
	f.host.Logger().Info("sandbox forked from memory", "id", req.ID, "children", len(kids), "took", time.Since(t0))
	return out, nil
}

// start starts each child in its instance; when one fails, the children
// started are stopped and the others abandoned (their instances
// destroyed): a fork is whole or nothing.
func (f *Forker) start(ctx context.Context, kids []Child, insts []*runtime.Instance, t0 time.Time) (*edgeproto.ForkMemoryResult, error) {
	out := &edgeproto.ForkMemoryResult{Sandboxes: make([]api.Sandbox, 0, len(kids))}
	var firstErr error
	for i, c := range kids {
		if firstErr == nil {
			var v api.Sandbox
			if v, firstErr = f.host.Start(ctx, c, insts[i], t0); firstErr == nil {
				out.Sandboxes = append(out.Sandboxes, v)
				continue
			}
		} else {
			_ = insts[i].Agent.Close()
			_ = f.rt.Destroy(context.WithoutCancel(ctx), insts[i].Handle)
		}
		f.host.Abandon(c, firstErr)
	}
	for i := range out.Sandboxes {
		if firstErr != nil {
			f.host.Stop(context.WithoutCancel(ctx), kids[i], "the fork failed")
		} else {
			f.host.Done(kids[i])
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}
