package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/placement"
)

// MaxBatch bounds one batch create.
const MaxBatch = 65536

// batchChunk is how many sandboxes go to one node in one bus request.
const batchChunk = 512

// batchCreate places count sandboxes of one spec and creates them with one
// request per node (and chunk), in parallel. Sandboxes a node refuses are
// placed again elsewhere, at most maxPlacementTries times in all.
func (s *Server) batchCreate(w http.ResponseWriter, r *http.Request) error {
	var req api.BatchCreateRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Count < 1 || req.Count > MaxBatch {
		return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("count must be between 1 and %d", MaxBatch)}
	}
	spec := req.Spec
	limits, err := s.prepareCreate(r, &spec)
	if err != nil {
		return err
	}
	ctx := r.Context()
	res := &api.BatchCreateResult{IDs: make([]string, 0, req.Count)}
	errs := map[api.Error]int{}
	var mu sync.Mutex
	fail := func(n int, e api.Error) {
		mu.Lock()
		res.Failed += n
		errs[e] += n
		mu.Unlock()
	}
	left := req.Count
	exclude := map[string]bool{}
	for try := 0; try < maxPlacementTries && left > 0; try++ {
		byNode := map[string][]edgeproto.CreateRequest{}
		placed := 0
		for i := 0; i < left; i++ {
			node, err := s.placer.Pick(&spec, exclude, limits)
			if err != nil {
				var qe *placement.QuotaError
				ae := noNode(err, "more sandboxes")
				if errors.As(err, &qe) {
					ae = &api.Error{Code: api.CodeForbidden, Message: qe.Error()}
					if qe.Transient {
						ae.Code = api.CodeTooManyRequests
					}
				}
				fail(left-i, *ae)
				break
			}
			byNode[node] = append(byNode[node], edgeproto.CreateRequest{ID: edgeproto.NewSandboxID(node), Spec: spec})
			placed++
		}
		left = 0
		var retryMu sync.Mutex
		retry := 0
		var wg sync.WaitGroup
		for node, items := range byNode {
			for start := 0; start < len(items); start += batchChunk {
				end := min(start+batchChunk, len(items))
				wg.Add(1)
				go func(node string, items []edgeproto.CreateRequest) {
					defer wg.Done()
					var out edgeproto.CreateBatchResult
					err := s.callNode(ctx, node, edgeproto.OpCreateBatch, &edgeproto.CreateBatchRequest{Items: items}, &out)
					if err == nil && len(out.Items) != len(items) {
						err = &api.Error{Code: api.CodeInternal, Message: "node answered a batch with the wrong count"}
					}
					for i := range items {
						var e *api.Error
						if err != nil {
							ae := s.toAPIError(err)
							e = ae
						} else {
							e = out.Items[i].Error
						}
						if e == nil {
							mu.Lock()
							res.Created++
							res.IDs = append(res.IDs, out.Items[i].Sandbox.ID)
							if !req.IDsOnly {
								res.Sandboxes = append(res.Sandboxes, *out.Items[i].Sandbox)
							}
							mu.Unlock()
							continue
						}
						s.placer.Release(node, &spec, limits)
						if e.Code == api.CodeUnavailable {
							retryMu.Lock()
							retry++
							exclude[node] = true
							retryMu.Unlock()
							continue
						}
						fail(1, *e)
					}
				}(node, items[start:end])
			}
		}
		wg.Wait()
		left = retry
		if try == maxPlacementTries-1 && left > 0 {
			fail(left, api.Error{Code: api.CodeUnavailable, Message: "nodes refused these sandboxes"})
		}
	}
	for e, n := range errs {
		res.Errors = append(res.Errors, api.BatchError{Count: n, Error: e})
	}
	sort.Slice(res.Errors, func(i, j int) bool { return res.Errors[i].Count > res.Errors[j].Count })
	status := http.StatusCreated
	if res.Created == 0 {
		if len(res.Errors) > 0 {
			return &res.Errors[0].Error
		}
	}
	writeJSON(w, status, res)
	return nil
}

// callNode sends one node-level operation (not about one sandbox) on behalf
// of the caller.
func (s *Server) callNode(ctx context.Context, node, op string, req, out any) error {
	p, _ := ctx.Value(principalKey{}).(*iam.Principal)
	if p == nil {
		return &api.Error{Code: api.CodeUnauthorized, Message: "no principal"}
	}
	if p.Project != "" {
		ctx = bus.WithHeaders(ctx, map[string]string{bus.HeaderScope: p.Project})
	}
	err := s.cfg.Bus.Call(ctx, bus.EdgeSubject(node), op, req, out, nil)
	if errors.Is(err, bus.ErrNoResponders) {
		return &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("node %s is not available", node)}
	}
	return err
}
