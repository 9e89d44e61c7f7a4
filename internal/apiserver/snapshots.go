package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/placement"
)

// MaxFork bounds how many sandboxes one fork creates.
const MaxFork = 64

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var req api.CreateSnapshotRequest
	if r.ContentLength != 0 {
		if err := decodeJSON(w, r, &req); err != nil {
			return err
		}
	}
	var snap api.Snapshot
	if err := s.callEdge(r.Context(), id, edgeproto.OpSnapshot, &edgeproto.SnapshotRequest{ID: id, Name: req.Name, Stop: req.Stop}, &snap, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, &snap)
	return nil
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	snap, err := s.snapshotOf(r.Context(), principal(r), r.PathValue("sid"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, snap)
	return nil
}

// listSnapshots lists the snapshots the caller sees (its project's and
// those below it; ?sandbox= keeps one sandbox's), newest first.
func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	p := principal(r)
	sandbox := r.URL.Query().Get("sandbox")
	out := api.SnapshotList{Snapshots: []api.Snapshot{}}
	err := s.snaps.Each(r.Context(), func(_ string, raw []byte) error {
		var snap api.Snapshot
		if json.Unmarshal(raw, &snap) != nil || !p.Sees(iam.KindSnapshot, snap.Project) {
			return nil
		}
		if sandbox == "" || snap.Sandbox == sandbox {
			out.Snapshots = append(out.Snapshots, snap)
		}
		return nil
	})
	if err != nil {
		return storeUnavailable("the snapshot store", err)
	}
	sort.Slice(out.Snapshots, func(i, j int) bool { return out.Snapshots[i].CreatedAt.After(out.Snapshots[j].CreatedAt) })
	writeJSON(w, http.StatusOK, &out)
	return nil
}

// deleteSnapshot removes a snapshot and its layer, unless something still
// needs it (409 saying what).
func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.removeSnapshot(r.Context(), principal(r), r.PathValue("sid")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// errInUse stops a scan at the first user of a snapshot.
type errInUse struct{ why string }

func (e *errInUse) Error() string { return e.why }

// snapLayerID is the snapshot whose diff layer ref ("snap/<id>@1") is, or
// "" for another layer.
func snapLayerID(ref string) string {
	name, _, _ := strings.Cut(ref, "@")
	id, ok := strings.CutPrefix(name, "snap/")
	if !ok {
		return ""
	}
	return id
}

// removeSnapshot deletes snapshot sid's record, and its layer once nothing
// needs it. A snapshot is in use (409) while a sandbox that is not stopped
// was restored from it or a trajectory needs it (its original state or its
// latest checkpoint, which a rebuild starts from). Later snapshots chain
// on its layer (incremental snapshots of a sandbox, snapshots of a
// restored one): deleting it keeps them whole, since a diff layer goes
// only when no snapshot's chain and no live sandbox uses it any more (the
// last one out takes it, and every earlier diff nobody needs).
func (s *Server) removeSnapshot(ctx context.Context, p *iam.Principal, sid string) ([]api.Layer, error) {
	snap, err := s.snapshotOf(ctx, p, sid)
	if err != nil {
		return nil, err
	}
	inUse := func(format string, a ...any) error {
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("snapshot %s is in use: ", sid) + fmt.Sprintf(format, a...)}
	}
	check := func(err error) error {
		var iu *errInUse
		if errors.As(err, &iu) {
			return inUse("%s", iu.why)
		}
		return &api.Error{Code: api.CodeUnavailable, Message: err.Error()}
	}
	if err := s.trajectoryUse(ctx, sid); err != nil {
		return nil, check(err)
	}
	// Sandboxes on every node (whatever the caller may see): one restored
	// from it keeps it; the layers any live one uses stay.
	liveLayers, users, err := s.liveSnapshotUse(ctx, sid)
	if err != nil {
		return nil, err
	}
	if len(users) > 0 {
		return nil, inUse("sandbox %s was restored from it%s", users[0], map[bool]string{true: fmt.Sprintf(" (and %d more)", len(users)-1)}[len(users) > 1])
	}
	// Its chain's diffs that no other snapshot and no live sandbox needs
	// go, then the record.
	needed, err := s.neededDiffs(ctx, sid, liveLayers)
	if err != nil {
		return nil, check(err)
	}
	gone, err := s.deleteDiffs(ctx, sid, snap, needed)
	if err != nil {
		return nil, err
	}
	if err := s.snaps.Delete(ctx, sid); err != nil {
		return nil, &api.Error{Code: api.CodeUnavailable, Message: err.Error()}
	}
	s.charge(ctx, snap.Project, -snap.Size)
	return gone, nil
}

// trajectoryUse returns an *errInUse when a trajectory needs snapshot sid
// (its latest checkpoint, or the state it starts from), or the store's
// error.
func (s *Server) trajectoryUse(ctx context.Context, sid string) error {
	return s.trajMeta.Each(ctx, func(key string, raw []byte) error {
		var rec edgeproto.TrajectoryRecord
		if json.Unmarshal(raw, &rec) != nil {
			return nil
		}
		switch sid {
		case rec.CheckpointSnap:
			return &errInUse{fmt.Sprintf("it is the latest checkpoint of trajectory %q", rec.Name)}
		case rec.Spec.Snapshot:
			return &errInUse{fmt.Sprintf("trajectory %q starts from it", rec.Name)}
		}
		return nil
	})
}

// neededDiffs is the set of snapshot diffs (by snapshot id) that must stay
// when snapshot sid goes: those a live sandbox uses (liveLayers) and every
// other snapshot's own and its chain's.
func (s *Server) neededDiffs(ctx context.Context, sid string, liveLayers map[string]bool) (map[string]bool, error) {
	needed := map[string]bool{}
	for id := range liveLayers {
		needed[id] = true
	}
	err := s.snaps.Each(ctx, func(key string, raw []byte) error {
		var o api.Snapshot
		if key == sid || json.Unmarshal(raw, &o) != nil {
			return nil
		}
		needed[o.ID] = true // its own diff
		for _, l := range o.Layers {
			if id := snapLayerID(l.Layer); id != "" {
				needed[id] = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return needed, nil
}

// deleteDiffs deletes the diff layers of snapshot sid's chain (its own
// and the earlier ones snap lists) that are not needed, and returns the
// layers the store removed. A diff already gone is no error.
func (s *Server) deleteDiffs(ctx context.Context, sid string, snap *api.Snapshot, needed map[string]bool) ([]api.Layer, error) {
	gone := []api.Layer{}
	candidates := []string{sid}
	for _, l := range snap.Layers {
		if id := snapLayerID(l.Layer); id != "" && id != sid {
			candidates = append(candidates, id)
		}
	}
	for _, id := range candidates {
		if needed[id] {
			continue
		}
		var l api.LayerList
		if err := s.callStore(ctx, edgeproto.OpLayerDelete, &edgeproto.LayerRequest{Name: edgeproto.SnapshotLayerName(id)}, &l); err != nil {
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != api.CodeNotFound {
				return nil, err
			}
		}
		gone = append(gone, l.Layers...)
	}
	return gone, nil
}

// liveSnapshotUse asks every node for its sandboxes that are not stopped:
// the snapshot diffs they have mounted (by snapshot id) and those restored
// from snapshot sid.
func (s *Server) liveSnapshotUse(ctx context.Context, sid string) (map[string]bool, []string, error) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	layers := map[string]bool{}
	var users []string
	var firstErr error
	for _, n := range s.cfg.Watcher.Up() {
		wg.Add(1)
		go func(node string) {
			defer wg.Done()
			var l api.SandboxList
			err := s.cfg.Bus.Call(ctx, bus.EdgeSubject(node), edgeproto.OpList, &edgeproto.ListRequest{}, &l, nil)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				firstErr = err
				return
			}
			for _, sb := range l.Sandboxes {
				if sb.State == api.StateStopped || sb.State == api.StateFailed {
					continue
				}
				if sb.Snapshot == sid {
					users = append(users, sb.ID)
				}
				for _, ref := range sb.Layers {
					if id := snapLayerID(ref); id != "" {
						layers[id] = true
					}
				}
			}
		}(n.Name)
	}
	wg.Wait()
	if firstErr != nil {
		return nil, nil, &api.Error{Code: api.CodeUnavailable, Message: "cannot tell whether a sandbox uses the snapshot: " + firstErr.Error()}
	}
	return layers, users, nil
}

// fork snapshots the source once and restores the snapshot N times on the
// source's node (where its layers are already mounted). The source keeps
// running. If any restore fails, the ones made are removed.
func (s *Server) fork(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var req api.ForkRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Count < 1 || req.Count > MaxFork {
		return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("count must be between 1 and %d", MaxFork)}
	}
	node, err := nodeOf(id)
	if err != nil {
		return err
	}
	ctx := r.Context()
	var src api.Sandbox
	if err := s.callEdge(ctx, id, edgeproto.OpGet, &edgeproto.IDRequest{ID: id}, &src, nil); err != nil {
		return err
	}
	if req.Memory && !slices.Contains(api.MemoryForkTiers, src.Tier) {
		tier := src.Tier
		if tier == "" {
			tier = api.TierContainer
		}
		return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf(
			"sandbox %s is a %s sandbox: a fork from memory needs tier %s (a disk fork, without \"memory\", works on every tier)",
			id, tier, strings.Join(api.MemoryForkTiers, " or "))}
	}
	// The children are the source's project's: they count against its
	// quota (and every quota above it), checked before the snapshot. They
	// run on the source's tier (a microVM's children are microVMs).
	spec := api.CreateSandboxRequest{
		Tier: src.Tier, Display: src.Display,
		Project: src.Project, CPU: src.CPU, MemoryMB: src.MemoryMB, DiskMB: src.DiskMB, Pids: src.Pids,
		Labels: src.Labels, User: src.User, TTL: src.TTL, IdleTimeout: src.IdleTimeout,
	}
	release, err := s.reserveFork(node, &spec, s.limitsOf(src.Project), req.Count)
	if err != nil {
		return err
	}
	if req.Memory {
		return s.forkMemory(w, r, id, node, req.Count, release)
	}
	var snap api.Snapshot
	if err := s.callEdge(ctx, id, edgeproto.OpSnapshot, &edgeproto.SnapshotRequest{ID: id, Name: "fork of " + id}, &snap, nil); err != nil {
		release()
		return err
	}
	spec.Snapshot = snap.ID
	out := api.ForkResult{Snapshot: &snap, Sandboxes: make([]api.Sandbox, req.Count)}
	if err := s.restoreForks(ctx, node, &spec, out.Sandboxes, release); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, &out)
	return nil
}

// reserveFork reserves room for count children of spec on node, all or
// none (a quota refused is the error). release frees what it reserved; the
// caller calls it when the fork fails after this.
func (s *Server) reserveFork(node string, spec *api.CreateSandboxRequest, limits []placement.Limit, count int) (release func(), err error) {
	reserved := 0
	release = func() {
		for ; reserved > 0; reserved-- {
			s.placer.Release(node, spec, limits)
		}
	}
	for reserved < count {
		if err := s.placer.Reserve(node, spec, limits); err != nil {
			release()
			return nil, placeError(err, "the fork")
		}
		reserved++
	}
	return release, nil
}

// restoreForks creates one child of spec (restored from its snapshot) on
// node for each element of kids, in parallel, and fills it in. If any
// fails, it calls release, deletes the children that were made and returns
// the first error.
func (s *Server) restoreForks(ctx context.Context, node string, spec *api.CreateSandboxRequest, kids []api.Sandbox, release func()) error {
	errs := make([]error, len(kids))
	var wg sync.WaitGroup
	for i := 0; i < len(kids); i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			kid := edgeproto.NewSandboxID(node)
			errs[i] = s.callEdge(ctx, kid, edgeproto.OpCreate, &edgeproto.CreateRequest{ID: kid, Spec: *spec}, &kids[i], nil)
		}(i)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			release()
			dctx := context.WithoutCancel(ctx)
			for i, e := range errs {
				if e == nil {
					_ = s.callEdge(dctx, kids[i].ID, edgeproto.OpDelete, &edgeproto.IDRequest{ID: kids[i].ID}, nil, nil)
				}
			}
			return err
		}
	}
	return nil
}

// forkMemory asks the source's edge for count children restored from one
// memory snapshot of it (their place is reserved; release frees it on an
// error).
func (s *Server) forkMemory(w http.ResponseWriter, r *http.Request, id, node string, count int, release func()) error {
	kids := make([]string, count)
	for i := range kids {
		kids[i] = edgeproto.NewSandboxID(node)
	}
	var res edgeproto.ForkMemoryResult
	if err := s.callEdge(r.Context(), id, edgeproto.OpForkMemory, &edgeproto.ForkMemoryRequest{ID: id, Children: kids}, &res, nil); err != nil {
		release()
		return err
	}
	writeJSON(w, http.StatusCreated, &api.ForkResult{Sandboxes: res.Sandboxes})
	return nil
}
