package apiserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/placement"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// maxPlacementTries bounds how many nodes one create tries.
const maxPlacementTries = 3

// nodeOf routes a sandbox id to its node, or fails with 404.
func nodeOf(id string) (string, error) {
	node := edge.NodeOf(id)
	if node == "" {
		return "", &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("sandbox %q not found (malformed id)", truncate(id))}
	}
	return node, nil
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// callEdge sends one operation to the node that owns sandbox id.
func (s *Server) callEdge(ctx context.Context, id, op string, req, out any, onChunk func(bus.Chunk) error) error {
	node, err := nodeOf(id)
	if err != nil {
		return err
	}
	err = s.cfg.Bus.Call(ctx, bus.EdgeSubject(node), op, req, out, onChunk)
	if errors.Is(err, bus.ErrNoResponders) {
		if !s.knownNode(node) {
			return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("sandbox %s not found (no node %s)", id, node)}
		}
		return &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("node %s of sandbox %s is not available", node, id)}
	}
	return err
}

// knownNode reports whether the fleet has ever reported node (up or down).
func (s *Server) knownNode(node string) bool {
	for _, n := range s.cfg.Watcher.Nodes() {
		if n.Name == node {
			return true
		}
	}
	return false
}

func idempotencyKey(r *http.Request) (string, error) {
	k := r.Header.Get("Idempotency-Key")
	if k == "" {
		return "", nil
	}
	if len(k) > 256 {
		return "", &api.Error{Code: api.CodeBadRequest, Message: "Idempotency-Key is longer than 256 bytes"}
	}
	// Scope the key by the caller's token so callers cannot collide.
	h := sha256.Sum256([]byte(r.Header.Get("Authorization") + "\x00" + k))
	return "k" + hex.EncodeToString(h[:]), nil
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateSandboxRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.Resume {
		if aerr := sandboxspec.CheckResume(&req); aerr != nil {
			return aerr
		}
		return s.resumeSandbox(w, r, &req)
	}
	if aerr := sandboxspec.Normalize(&req); aerr != nil {
		return aerr
	}
	key, err := idempotencyKey(r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	if key != "" {
		if e, err := s.idem.Get(ctx, key); err == nil {
			id := string(e.Value())
			var sb api.Sandbox
			err := s.callEdge(ctx, id, edge.OpCreate, &edge.CreateRequest{ID: id, Spec: req}, &sb, nil)
			if err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, &sb)
			return nil
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("idempotency store: %w", err)
		}
	}
	exclude := map[string]bool{}
	var lastErr error
	for try := 0; try < maxPlacementTries; try++ {
		node, err := s.placer.Pick(&req, exclude)
		if err != nil {
			if lastErr != nil {
				return lastErr
			}
			if errors.Is(err, placement.ErrNoNode) {
				return &api.Error{Code: api.CodeUnavailable, Message: "no node can take this sandbox now"}
			}
			return err
		}
		id := edge.NewSandboxID(node)
		if key != "" {
			if _, err := s.idem.Create(ctx, key, []byte(id)); err != nil {
				if errors.Is(err, jetstream.ErrKeyExists) {
					// A concurrent request with the same key won the race: answer as it does.
					e, gerr := s.idem.Get(ctx, key)
					if gerr != nil {
						return fmt.Errorf("idempotency store: %w", gerr)
					}
					id = string(e.Value())
				} else {
					return fmt.Errorf("idempotency store: %w", err)
				}
			}
		}
		var sb api.Sandbox
		err = s.callEdge(ctx, id, edge.OpCreate, &edge.CreateRequest{ID: id, Spec: req}, &sb, nil)
		if err == nil {
			writeJSON(w, http.StatusCreated, &sb)
			return nil
		}
		if key != "" {
			_ = s.idem.Delete(context.WithoutCancel(ctx), key)
		}
		var ae *api.Error
		if errors.As(err, &ae) && ae.Code == api.CodeUnavailable {
			exclude[node] = true
			lastErr = err
			continue
		}
		return err
	}
	return lastErr
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var sb api.Sandbox
	if err := s.callEdge(r.Context(), id, edge.OpGet, &edge.IDRequest{ID: id}, &sb, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &sb)
	return nil
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var sb api.Sandbox
	if err := s.callEdge(r.Context(), id, edge.OpDelete, &edge.IDRequest{ID: id}, &sb, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &sb)
	return nil
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	req := edge.ListRequest{State: q.Get("state"), Labels: map[string]string{}}
	switch req.State {
	case "", api.StateCreating, api.StateRunning, api.StateStopped, api.StateFailed:
	default:
		return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("unknown state %q", truncate(req.State))}
	}
	for _, l := range q["label"] {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("label filter %q is not key=value", truncate(l))}
		}
		req.Labels[k] = v
	}
	nodes := s.cfg.Watcher.Up()
	var mu sync.Mutex
	var wg sync.WaitGroup
	out := api.SandboxList{Sandboxes: []api.Sandbox{}}
	var firstErr error
	for _, n := range nodes {
		wg.Add(1)
		go func(node string) {
			defer wg.Done()
			var l api.SandboxList
			err := s.cfg.Bus.Call(r.Context(), bus.EdgeSubject(node), edge.OpList, &req, &l, nil)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			out.Sandboxes = append(out.Sandboxes, l.Sandboxes...)
		}(n.Name)
	}
	wg.Wait()
	if firstErr != nil && len(out.Sandboxes) == 0 && len(nodes) > 0 {
		return firstErr
	}
	sort.Slice(out.Sandboxes, func(i, j int) bool { return out.Sandboxes[i].CreatedAt.Before(out.Sandboxes[j].CreatedAt) })
	writeJSON(w, http.StatusOK, &out)
	return nil
}

func (s *Server) listImages(w http.ResponseWriter, r *http.Request) error {
	nodes := s.cfg.Watcher.Up()
	seen := map[string]api.Image{}
	for _, n := range nodes {
		var l api.ImageList
		if err := s.cfg.Bus.Call(r.Context(), bus.EdgeSubject(n.Name), edge.OpImages, struct{}{}, &l, nil); err != nil {
			continue
		}
		for _, img := range l.Images {
			seen[img.Name] = img
		}
	}
	out := api.ImageList{Images: []api.Image{}}
	for _, img := range seen {
		out.Images = append(out.Images, img)
	}
	sort.Slice(out.Images, func(i, j int) bool { return out.Images[i].Name < out.Images[j].Name })
	writeJSON(w, http.StatusOK, &out)
	return nil
}
