package apiserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"sync"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/iam"
)

// Warm pools live on the edges: each node keeps `size` sandboxes of the
// pool's shape. The apiserver sends a pool to every node that is up and
// sums what they report.

func (s *Server) createPool(w http.ResponseWriter, r *http.Request) error {
	var req api.PoolRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if _, aerr := edge.PoolSpec(&req); aerr != nil {
		return aerr
	}
	if req.Name == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		req.Name = "pool-" + hex.EncodeToString(b[:])
	}
	pr := principal(r)
	existing, err := s.eachNode(r.Context(), edge.OpPoolList, struct{}{})
	if err != nil {
		return err
	}
	old, exists := existing[req.Name]
	if req.Project == "" {
		req.Project = pr.Project
		if exists && pr.Sees(iam.KindPool, old.Project) {
			req.Project = old.Project // resizing a pool it sees, of a project below
		}
	}
	if !pr.Sees(iam.KindProject, req.Project) {
		return &api.Error{Code: api.CodeForbidden, Message: fmt.Sprintf("project %s is outside your project %s", req.Project, pr.Project)}
	}
	if exists && old.Project != req.Project {
		// Pool names are one namespace on the nodes: say no more than that.
		return &api.Error{Code: api.CodeForbidden, Message: fmt.Sprintf("pool name %s is taken by another project", req.Name)}
	}
	pools, err := s.eachNode(r.Context(), edge.OpPoolPut, &req)
	if err != nil {
		return err
	}
	p, ok := pools[req.Name]
	if !ok {
		return &api.Error{Code: api.CodeUnavailable, Message: "no node took the pool"}
	}
	writeJSON(w, http.StatusCreated, &p)
	return nil
}

func (s *Server) listPools(w http.ResponseWriter, r *http.Request) error {
	pools, err := s.eachNode(r.Context(), edge.OpPoolList, struct{}{})
	if err != nil {
		return err
	}
	out := api.PoolList{Pools: []api.Pool{}}
	pr := principal(r)
	for _, p := range pools {
		if pr.Sees(iam.KindPool, p.Project) {
			out.Pools = append(out.Pools, p)
		}
	}
	sort.Slice(out.Pools, func(i, j int) bool { return out.Pools[i].Name < out.Pools[j].Name })
	writeJSON(w, http.StatusOK, &out)
	return nil
}

func (s *Server) getPool(w http.ResponseWriter, r *http.Request) error {
	p, err := s.poolOf(r, r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, p)
	return nil
}

// poolOf reads pool name for the caller: 404 when it does not exist or the
// caller may not see it.
func (s *Server) poolOf(r *http.Request, name string) (*api.Pool, error) {
	pools, err := s.eachNode(r.Context(), edge.OpPoolList, struct{}{})
	if err != nil {
		return nil, err
	}
	missing := &api.Error{Code: api.CodeNotFound, Message: "pool " + truncate(name) + " not found"}
	p, ok := pools[name]
	if !ok {
		return nil, missing
	}
	if err := own(principal(r), iam.KindPool, p.Project, missing); err != nil {
		return nil, err
	}
	return &p, nil
}

func (s *Server) deletePool(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	if _, err := s.poolOf(r, name); err != nil {
		return err
	}
	pools, err := s.eachNode(r.Context(), edge.OpPoolDelete, &edge.PoolNameRequest{Name: name})
	if err != nil {
		return err
	}
	p, ok := pools[name]
	if !ok {
		return &api.Error{Code: api.CodeNotFound, Message: "pool " + truncate(name) + " not found"}
	}
	writeJSON(w, http.StatusOK, &p)
	return nil
}

// eachNode sends a pool operation to every node that is up and merges the
// answers (api.Pool or api.PoolList) by pool name. A 4xx from any node is
// returned as is (not_found only when every node says so).
func (s *Server) eachNode(ctx context.Context, op string, req any) (map[string]api.Pool, error) {
	nodes := s.cfg.Watcher.Up()
	if len(nodes) == 0 {
		return nil, &api.Error{Code: api.CodeUnavailable, Message: "no node is up"}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := map[string]api.Pool{}
	var errs []error
	notFound := 0
	for _, n := range nodes {
		wg.Add(1)
		go func(node string) {
			defer wg.Done()
			var list api.PoolList
			var one api.Pool
			var err error
			if op == edge.OpPoolList {
				err = s.cfg.Bus.Call(ctx, bus.EdgeSubject(node), op, req, &list, nil)
			} else {
				err = s.cfg.Bus.Call(ctx, bus.EdgeSubject(node), op, req, &one, nil)
				list.Pools = []api.Pool{one}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				var ae *api.Error
				if errors.As(err, &ae) && ae.Code == api.CodeNotFound {
					notFound++
					return
				}
				errs = append(errs, err)
				return
			}
			for _, p := range list.Pools {
				if q, ok := out[p.Name]; ok {
					q.Ready += p.Ready
					q.Creating += p.Creating
					q.Claimed += p.Claimed
					if q.Error == "" {
						q.Error = p.Error
					}
					p = q
				}
				out[p.Name] = p
			}
		}(n.Name)
	}
	wg.Wait()
	if len(errs) > 0 && len(out) == 0 {
		return nil, errs[0]
	}
	return out, nil
}
