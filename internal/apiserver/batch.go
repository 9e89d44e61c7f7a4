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
	b := &batchRun{
		s: s, spec: &spec, limits: limits, idsOnly: req.IDsOnly,
		res:     &api.BatchCreateResult{IDs: make([]string, 0, req.Count)},
		errs:    map[api.Error]int{},
		exclude: map[string]bool{},
	}
	left := req.Count
	for try := 0; try < maxPlacementTries && left > 0; try++ {
		left = b.create(r.Context(), b.place(left))
		if try == maxPlacementTries-1 && left > 0 {
			b.fail(left, api.Error{Code: api.CodeUnavailable, Message: "nodes refused these sandboxes"})
		}
	}
	res := b.result()
	status := http.StatusCreated
	if res.Created == 0 {
		if len(res.Errors) > 0 {
			return &res.Errors[0].Error
		}
	}
	writeJSON(w, status, res)
	return nil
}

// batchRun is one batch create in progress: the spec and limits all its
// sandboxes share, what it has made and refused so far, and the nodes that
// answered a sandbox with unavailable (left out of later placements).
type batchRun struct {
	s       *Server
	spec    *api.CreateSandboxRequest
	limits  []placement.Limit
	idsOnly bool

	mu   sync.Mutex // guards res and errs
	res  *api.BatchCreateResult
	errs map[api.Error]int

	retryMu sync.Mutex // guards retry and exclude while chunks are sent
	retry   int
	exclude map[string]bool
}

// fail counts n sandboxes refused with e.
func (b *batchRun) fail(n int, e api.Error) {
	b.mu.Lock()
	b.res.Failed += n
	b.errs[e] += n
	b.mu.Unlock()
}

// place picks a node for each of left sandboxes and returns their create
// requests by node. When no node can take one, it and the rest are
// counted as failed with the reason.
func (b *batchRun) place(left int) map[string][]edgeproto.CreateRequest {
	byNode := map[string][]edgeproto.CreateRequest{}
	for i := 0; i < left; i++ {
		node, err := b.s.placer.Pick(b.spec, b.exclude, b.limits)
		if err != nil {
			var qe *placement.QuotaError
			ae := noNode(err, "more sandboxes")
			if errors.As(err, &qe) {
				ae = &api.Error{Code: api.CodeForbidden, Message: qe.Error()}
				if qe.Transient {
					ae.Code = api.CodeTooManyRequests
				}
			}
			b.fail(left-i, *ae)
			break
		}
		byNode[node] = append(byNode[node], edgeproto.CreateRequest{ID: edgeproto.NewSandboxID(node), Spec: *b.spec})
	}
	return byNode
}

// create sends the placed requests, one bus request per node and chunk of
// batchChunk, all in parallel, and returns how many sandboxes a node
// refused as unavailable (to place again; those nodes are excluded from
// now on).
func (b *batchRun) create(ctx context.Context, byNode map[string][]edgeproto.CreateRequest) int {
	b.retry = 0
	var wg sync.WaitGroup
	for node, items := range byNode {
		for start := 0; start < len(items); start += batchChunk {
			end := min(start+batchChunk, len(items))
			wg.Add(1)
			go func(node string, items []edgeproto.CreateRequest) {
				defer wg.Done()
				b.createChunk(ctx, node, items)
			}(node, items[start:end])
		}
	}
	wg.Wait()
	return b.retry
}

// createChunk sends one chunk of create requests to node and counts each
// sandbox made, refused (its place released) or to place again.
func (b *batchRun) createChunk(ctx context.Context, node string, items []edgeproto.CreateRequest) {
	var out edgeproto.CreateBatchResult
	err := b.s.callNode(ctx, node, edgeproto.OpCreateBatch, &edgeproto.CreateBatchRequest{Items: items}, &out)
	if err == nil && len(out.Items) != len(items) {
		err = &api.Error{Code: api.CodeInternal, Message: "node answered a batch with the wrong count"}
	}
	for i := range items {
		var e *api.Error
		if err != nil {
			ae := b.s.toAPIError(err)
			e = ae
		} else {
			e = out.Items[i].Error
		}
		if e == nil {
			b.mu.Lock()
			b.res.Created++
			b.res.IDs = append(b.res.IDs, out.Items[i].Sandbox.ID)
			if !b.idsOnly {
				b.res.Sandboxes = append(b.res.Sandboxes, *out.Items[i].Sandbox)
			}
			b.mu.Unlock()
			continue
		}
		b.s.placer.Release(node, b.spec, b.limits)
		if e.Code == api.CodeUnavailable {
			b.retryMu.Lock()
			b.retry++
			b.exclude[node] = true
			b.retryMu.Unlock()
			continue
		}
		b.fail(1, *e)
	}
}

// result is the batch's answer: the counts, and the errors grouped, the
// most frequent first.
func (b *batchRun) result() *api.BatchCreateResult {
	for e, n := range b.errs {
		b.res.Errors = append(b.res.Errors, api.BatchError{Count: n, Error: e})
	}
	sort.Slice(b.res.Errors, func(i, j int) bool { return b.res.Errors[i].Count > b.res.Errors[j].Count })
	return b.res
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
