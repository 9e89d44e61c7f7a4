package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"sync"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge"
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
	if err := s.callEdge(r.Context(), id, edge.OpSnapshot, &edge.SnapshotRequest{ID: id, Name: req.Name, Stop: req.Stop}, &snap, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, &snap)
	return nil
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) error {
	var snap api.Snapshot
	if err := s.callAnyNode(r.Context(), edge.OpSnapshotGet, &edge.SnapshotGetRequest{Snapshot: r.PathValue("sid")}, &snap); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &snap)
	return nil
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
	if err := s.callEdge(ctx, id, edge.OpGet, &edge.IDRequest{ID: id}, &src, nil); err != nil {
		return err
	}
	var snap api.Snapshot
	if err := s.callEdge(ctx, id, edge.OpSnapshot, &edge.SnapshotRequest{ID: id, Name: "fork of " + id}, &snap, nil); err != nil {
		return err
	}
	spec := api.CreateSandboxRequest{
		Snapshot: snap.ID, CPU: src.CPU, MemoryMB: src.MemoryMB, DiskMB: src.DiskMB, Pids: src.Pids,
		Labels: src.Labels, User: src.User, TTL: src.TTL, IdleTimeout: src.IdleTimeout,
	}
	out := api.ForkResult{Snapshot: snap, Sandboxes: make([]api.Sandbox, req.Count)}
	errs := make([]error, req.Count)
	var wg sync.WaitGroup
	for i := 0; i < req.Count; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			kid := edge.NewSandboxID(node)
			errs[i] = s.callEdge(ctx, kid, edge.OpCreate, &edge.CreateRequest{ID: kid, Spec: spec}, &out.Sandboxes[i], nil)
		}(i)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			dctx := context.WithoutCancel(ctx)
			for i, e := range errs {
				if e == nil {
					_ = s.callEdge(dctx, out.Sandboxes[i].ID, edge.OpDelete, &edge.IDRequest{ID: out.Sandboxes[i].ID}, nil, nil)
				}
			}
			return err
		}
	}
	writeJSON(w, http.StatusCreated, &out)
	return nil
}
