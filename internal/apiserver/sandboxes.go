package apiserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/placement"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// maxPlacementTries bounds how many nodes one create tries.
const maxPlacementTries = 3

// nodeOf routes a sandbox id to its node, or fails with 404.
func nodeOf(id string) (string, error) {
	node := edgeproto.NodeOf(id)
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
	switch op {
	case edgeproto.OpExec, edgeproto.OpFileWrite, edgeproto.OpFileRemove, edgeproto.OpFileMkdir, edgeproto.OpFileRename, edgeproto.OpTarPut, edgeproto.OpFileUpload, edgeproto.OpTarUpload:
		// A recorded operation: the edge must know how far a fast-forward
		// served here got first.
		if err := s.endFastForward(ctx, id); err != nil {
			return err
		}
	case edgeproto.OpDelete:
		if sess := s.ff.get(id); sess != nil {
			s.ff.drop(sess)
		}
	}
	h := map[string]string{bus.HeaderSandbox: id}
	p, _ := ctx.Value(principalKey{}).(*iam.Principal)
	if p == nil || p.Project != "" {
		if p == nil {
			return &api.Error{Code: api.CodeUnauthorized, Message: "no principal"}
		}
		h[bus.HeaderScope] = p.Project
	}
	if addr := s.dataAddr(node, op); addr != "" {
		err = s.callData(ctx, addr, id, op, req, out, onChunk, h)
	} else {
		err = s.cfg.Bus.Call(bus.WithHeaders(ctx, h), bus.EdgeSubject(node), op, req, out, onChunk)
	}
	if errors.Is(err, bus.ErrNoResponders) || errors.Is(err, dataplane.ErrUnreachable) {
		if project, lost := s.cfg.Watcher.Lost(ctx, id, node); lost {
			if !p.Sees(iam.KindSandbox, project) {
				return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("sandbox %s not found", id)}
			}
			return &lostError{id: id, node: node, project: project}
		}
		if known, _ := s.cfg.Watcher.Known(node); !known {
			return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("sandbox %s not found (no node %s)", id, node)}
		}
		return &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("node %s of sandbox %s is not available", node, id)}
	}
	return err
}

// lostError is a sandbox reported lost with its node (it never comes
// back: its node destroys it when it returns); get answers it as state
// "lost", every other operation as 409, as its node does once back.
type lostError struct{ id, node, project string }

func (e *lostError) Error() string {
	return fmt.Sprintf("sandbox %s is lost: its node %s went down", e.id, e.node)
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

// requestDigest is the SHA-256 of a decoded request, to tell a retry (the
// same request again) from a reuse of its Idempotency-Key for another one.
func requestDigest(v any) string {
	b, _ := json.Marshal(v)
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// idemSandbox reads an idempotency record ("<sandbox id> <request
// digest>"): a key reused with another request is refused with 422, as
// Stripe does, rather than answered with the first request's sandbox.
func idemSandbox(v []byte, body string) (string, error) {
	id, digest, _ := strings.Cut(string(v), " ")
	if digest != "" && digest != body {
		return "", &api.Error{Code: api.CodeInvalid, Message: "Idempotency-Key was already used with a different request body; use a new key for a new request"}
	}
	return id, nil
}

// prepareCreate validates a create request and resolves its project and
// the quotas that bind it.
func (s *Server) prepareCreate(r *http.Request, req *api.CreateSandboxRequest) ([]placement.Limit, error) {
	ownIdle := req.IdleCPU != nil
	if aerr := sandboxspec.Normalize(req); aerr != nil {
		return nil, aerr
	}
	p := principal(r)
	if req.Project == "" {
		req.Project = p.Project
	}
	if !p.Sees(iam.KindProject, req.Project) {
		return nil, &api.Error{Code: api.CodeForbidden, Message: fmt.Sprintf("project %s is outside your project %s", req.Project, p.Project)}
	}
	if req.Project != "" {
		if _, err := s.cfg.IAM.Project(p, req.Project); err != nil {
			return nil, err
		}
		if v := s.cfg.IAM.IdleCPU(req.Project); v != nil && !ownIdle {
			*v = min(*v, req.CPU) // the project's default, within this sandbox's cpu
			req.IdleCPU = v
		}
	}
	if err := s.checkSpecUses(r.Context(), p, req); err != nil {
		return nil, err
	}
	limits := s.limitsOf(req.Project)
	if err := checkNetRates(req.Network, limits); err != nil {
		return nil, err
	}
	return limits, nil
}

// checkNetRates holds a networked create's rates and connection limit
// within its projects' quotas (403 naming the project whose quota one
// exceeds); one the create leaves to the node becomes the tightest
// quota's.
func checkNetRates(n *api.NetworkSpec, limits []placement.Limit) error {
	if n == nil {
		return nil
	}
	for _, r := range []struct {
		field, unit string
		rate        *int
		quota       func(api.Quota) int
	}{
		{"egress_rate_mbit", "Mbit/s", &n.EgressRateMbit, func(q api.Quota) int { return q.EgressRateMbit }},
		{"ingress_rate_mbit", "Mbit/s", &n.IngressRateMbit, func(q api.Quota) int { return q.IngressRateMbit }},
		{"max_conns", "connections", &n.MaxConns, func(q api.Quota) int { return q.MaxConns }},
	} {
		tightest := 0
		for _, l := range limits {
			q := r.quota(l.Quota)
			if q == 0 {
				continue
			}
			if *r.rate > q {
				return &api.Error{Code: api.CodeForbidden, Message: fmt.Sprintf(
					"network.%s %d exceeds the %d %s per sandbox that project %s's quota allows", r.field, *r.rate, q, r.unit, l.Project)}
			}
			if tightest == 0 || q < tightest {
				tightest = q
			}
		}
		if *r.rate == 0 {
			*r.rate = tightest
		}
	}
	return nil
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
		return s.resumeTrajectory(w, r, &req)
	}
	body := requestDigest(&req)
	limits, err := s.prepareCreate(r, &req)
	if err != nil {
		return err
	}
	key, err := idempotencyKey(r)
	if err != nil {
		return err
	}
	ctx := r.Context()
	if key != "" {
		if e, err := s.idem.Get(ctx, key); err == nil {
			id, err := idemSandbox(e.Value(), body)
			if err != nil {
				return err
			}
			var sb api.Sandbox
			if err := s.callEdge(ctx, id, edgeproto.OpCreate, &edgeproto.CreateRequest{ID: id, Spec: req}, &sb, nil); err != nil {
				return err
			}
			writeJSON(w, http.StatusOK, &sb)
			return nil
		} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return storeUnavailable("idempotency store", err)
		}
	}
	sb, err := s.place(ctx, &req, limits, key, body)
	if err != nil {
		return err
	}
	writeRawJSON(w, http.StatusCreated, sb)
	return nil
}

// place picks a node and creates the sandbox there; a node that refuses
// (full, shutting down) is skipped and another tried, at most
// maxPlacementTries times, then 503. The answer is the edge's JSON sandbox,
// passed through without decoding and encoding it again.
func (s *Server) place(ctx context.Context, req *api.CreateSandboxRequest, limits []placement.Limit, key, body string) (json.RawMessage, error) {
	exclude := map[string]bool{}
	var lastErr error
	for try := 0; try < maxPlacementTries; try++ {
		node, err := s.placer.Pick(req, exclude, limits)
		if err != nil {
			var qe *placement.QuotaError
			switch {
			case errors.As(err, &qe):
				if qe.Transient {
					return nil, &api.Error{Code: api.CodeTooManyRequests, Message: qe.Error()}
				}
				return nil, &api.Error{Code: api.CodeForbidden, Message: qe.Error()}
			case lastErr != nil:
				return nil, lastErr
			case errors.Is(err, placement.ErrNoNode):
				return nil, noNode(err, "this sandbox")
			}
			return nil, err
		}
		id := edgeproto.NewSandboxID(node)
		if key != "" {
			if _, err := s.idem.Create(ctx, key, []byte(id+" "+body)); err != nil {
				if errors.Is(err, jetstream.ErrKeyExists) {
					// A concurrent request with the same key won the race: answer as it does.
					e, gerr := s.idem.Get(ctx, key)
					if gerr != nil {
						s.placer.Release(node, req, limits)
						return nil, storeUnavailable("idempotency store", gerr)
					}
					s.placer.Release(node, req, limits)
					if id, err = idemSandbox(e.Value(), body); err != nil {
						return nil, err
					}
					var sb json.RawMessage
					if err := s.callEdge(ctx, id, edgeproto.OpCreate, &edgeproto.CreateRequest{ID: id, Spec: *req}, &sb, nil); err != nil {
						return nil, err
					}
					return sb, nil
				} else {
					s.placer.Release(node, req, limits)
					return nil, storeUnavailable("idempotency store", err)
				}
			}
		}
		var sb json.RawMessage
		err = s.callEdge(ctx, id, edgeproto.OpCreate, &edgeproto.CreateRequest{ID: id, Spec: *req}, &sb, nil)
		if err == nil && len(sb) > 0 {
			return sb, nil
		}
		if err == nil {
			err = &api.Error{Code: api.CodeInternal, Message: "node " + node + " answered the create with nothing"}
		}
		s.placer.Release(node, req, limits)
		if key != "" {
			_ = s.idem.Delete(context.WithoutCancel(ctx), key)
		}
		var ae *api.Error
		if errors.As(err, &ae) && ae.Code == api.CodeUnavailable {
			exclude[node] = true
			lastErr = err
			continue
		}
		return nil, err
	}
	return nil, lastErr
}

// noNode is the 503 of a placement that found no node: it names the short
// resource in the message and in the error's reason.
func noNode(err error, what string) *api.Error {
	e := &api.Error{Code: api.CodeUnavailable, Message: "no node can take " + what + " now"}
	var ne *placement.NoNodeError
	if errors.As(err, &ne) {
		e.Message += ": " + ne.Detail
		e.Reason = ne.Reason
	}
	return e
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var sb api.Sandbox
	if err := s.callEdge(r.Context(), id, edgeproto.OpGet, &edgeproto.IDRequest{ID: id}, &sb, nil); err != nil {
		var le *lostError
		if !errors.As(err, &le) {
			return err
		}
		sb = api.Sandbox{ID: id, Node: le.node, Project: le.project, State: api.StateLost, Reason: edgeproto.LostReason(le.node)}
	}
	writeJSON(w, http.StatusOK, &sb)
	return nil
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var sb api.Sandbox
	if err := s.callEdge(r.Context(), id, edgeproto.OpDelete, &edgeproto.IDRequest{ID: id}, &sb, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &sb)
	return nil
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	req := edgeproto.ListRequest{State: q.Get("state"), Labels: map[string]string{}, Project: q.Get("project")}
	if req.Project != "" && !sandboxspec.ValidProject(req.Project) {
		return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("project %q is not a project id", truncate(req.Project))}
	}
	p := principal(r)
	ctx := r.Context()
	if p.Project != "" {
		ctx = bus.WithHeaders(ctx, map[string]string{bus.HeaderScope: p.Project})
	}
	switch req.State {
	case "", api.StateCreating, api.StateRunning, api.StatePaused, api.StateStopped, api.StateFailed:
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
			err := s.cfg.Bus.Call(ctx, bus.EdgeSubject(node), edgeproto.OpList, &req, &l, nil)
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
		if err := s.cfg.Bus.Call(r.Context(), bus.EdgeSubject(n.Name), edgeproto.OpImages, struct{}{}, &l, nil); err != nil {
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

// storeUnavailable turns a failed JetStream call into a 503: the cluster is
// electing a leader or lost its quorum, and the client should retry.
func storeUnavailable(what string, err error) error {
	return &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("%s is not available now: %v", what, err)}
}
