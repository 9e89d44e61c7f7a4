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
	"github.com/warrenhq/warren/internal/edgeproto"
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
	if _, aerr := edgeproto.PoolSpec(&req); aerr != nil {
		return aerr
	}
	if req.Name == "" {
		var b [4]byte
		_, _ = rand.Read(b[:])
		req.Name = "pool-" + hex.EncodeToString(b[:])
	}
	pr := principal(r)
	if req.Project == "" {
		req.Project = pr.Project
		// Resizing a pool it sees of a project below, named alone: when
		// the caller's project has no pool of that name and exactly one
		// project below has.
		existing, err := s.eachNode(r.Context(), edgeproto.OpPoolList, struct{}{})
		if err != nil {
			return err
		}
		if _, own := existing[edgeproto.TrajKey(pr.Project, req.Name)]; !own {
			if old := visiblePools(pr, existing, req.Name); len(old) == 1 {
				req.Project = old[0].Project
			}
		}
	}
	if !pr.Sees(iam.KindProject, req.Project) {
		return &api.Error{Code: api.CodeForbidden, Message: fmt.Sprintf("project %s is outside your project %s", req.Project, pr.Project)}
	}
	pools, err := s.eachNode(r.Context(), edgeproto.OpPoolPut, &req)
	if err != nil {
		return err
	}
	p, ok := pools[edgeproto.TrajKey(req.Project, req.Name)]
	if !ok {
		return &api.Error{Code: api.CodeUnavailable, Message: "no node took the pool"}
	}
	writeJSON(w, http.StatusCreated, &p)
	return nil
}

func (s *Server) listPools(w http.ResponseWriter, r *http.Request) error {
	pools, err := s.eachNode(r.Context(), edgeproto.OpPoolList, struct{}{})
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

// poolOf reads pool name for the caller: its project's pool of that name
// (or ?project='s, one it sees), else the one pool of that name of a
// project below it; 404 when there is none (pool names are per project:
// another project's pool of the same name is not there for it).
func (s *Server) poolOf(r *http.Request, name string) (*api.Pool, error) {
	pools, err := s.eachNode(r.Context(), edgeproto.OpPoolList, struct{}{})
	if err != nil {
		return nil, err
	}
	missing := &api.Error{Code: api.CodeNotFound, Message: "pool " + truncate(name) + " not found"}
	pr := principal(r)
	if project := r.URL.Query().Get("project"); project != "" {
		p, ok := pools[edgeproto.TrajKey(project, name)]
		if !ok {
			return nil, missing
		}
		if err := own(pr, iam.KindPool, p.Project, missing); err != nil {
			return nil, err
		}
		return &p, nil
	}
	if p, ok := pools[edgeproto.TrajKey(pr.Project, name)]; ok {
		return &p, nil
	}
	if below := visiblePools(pr, pools, name); len(below) == 1 {
		return &below[0], nil
	}
	return nil, missing
}

// visiblePools lists the pools named name that pr sees.
func visiblePools(pr *iam.Principal, pools map[string]api.Pool, name string) []api.Pool {
	var out []api.Pool
	for _, p := range pools {
		if p.Name == name && pr.Sees(iam.KindPool, p.Project) {
			out = append(out, p)
		}
	}
	return out
}

func (s *Server) deletePool(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	old, err := s.poolOf(r, name)
	if err != nil {
		return err
	}
	pools, err := s.eachNode(r.Context(), edgeproto.OpPoolDelete, &edgeproto.PoolNameRequest{Name: name, Project: old.Project})
	if err != nil {
		return err
	}
	p, ok := pools[edgeproto.TrajKey(old.Project, name)]
	if !ok {
		return &api.Error{Code: api.CodeNotFound, Message: "pool " + truncate(name) + " not found"}
	}
	writeJSON(w, http.StatusOK, &p)
	return nil
}

// eachNode sends a pool operation to every node that is up and merges the
// answers (api.Pool or api.PoolList) by edgeproto.TrajKey(project, name):
// pool names are per project. A 4xx from any node is
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
			if op == edgeproto.OpPoolList {
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
				k := edgeproto.TrajKey(p.Project, p.Name)
				if q, ok := out[k]; ok {
					q.Ready += p.Ready
					q.Creating += p.Creating
					q.Claimed += p.Claimed
					if q.Error == "" {
						q.Error = p.Error
					}
					p = q
				}
				out[k] = p
			}
		}(n.Name)
	}
	wg.Wait()
	if len(errs) > 0 && len(out) == 0 {
		return nil, errs[0]
	}
	return out, nil
}
