package apiserver

import (
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

func (s *Server) pauseSandbox(w http.ResponseWriter, r *http.Request) error {
	return s.sandboxOp(w, r, edgeproto.OpPause)
}

func (s *Server) resumeSandbox(w http.ResponseWriter, r *http.Request) error {
	var req api.ResumeRequest
	if r.ContentLength != 0 {
		if err := decodeJSON(w, r, &req); err != nil {
			var ae *api.Error
			// An empty chunked body is no options.
			if !errors.As(err, &ae) || ae.Message != "request body is empty" {
				return err
			}
		}
	}
	id := r.PathValue("id")
	var sb api.Sandbox
	ereq := &edgeproto.ResumeSandboxRequest{ID: id, NoPrefetch: req.Prefetch != nil && !*req.Prefetch}
	if err := s.callEdge(r.Context(), id, edgeproto.OpResume, ereq, &sb, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &sb)
	return nil
}

// setTimeout makes a sandbox expire ttl seconds from now.
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) error {
	var req api.TimeoutRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if req.TTL == 0 && req.IdleTimeout == nil {
		return &api.Error{Code: api.CodeInvalid, Message: "ttl or idle_timeout is required"}
	}
	if req.TTL < 0 || req.TTL > sandboxspec.MaxTTL {
		return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("ttl must be between 1 and %d seconds, got %d", sandboxspec.MaxTTL, req.TTL)}
	}
	if it := req.IdleTimeout; it != nil && (*it < 0 || *it > sandboxspec.MaxTTL) {
		return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("idle_timeout must be between 0 and %d seconds, got %d", sandboxspec.MaxTTL, *it)}
	}
	id := r.PathValue("id")
	var sb api.Sandbox
	if err := s.callEdge(r.Context(), id, edgeproto.OpTimeout, &edgeproto.TimeoutRequest{ID: id, TTL: req.TTL, IdleTimeout: req.IdleTimeout}, &sb, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &sb)
	return nil
}

func (s *Server) sandboxOp(w http.ResponseWriter, r *http.Request, op string) error {
	id := r.PathValue("id")
	var sb api.Sandbox
	if err := s.callEdge(r.Context(), id, op, &edgeproto.IDRequest{ID: id}, &sb, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &sb)
	return nil
}

func (s *Server) pauseMatching(w http.ResponseWriter, r *http.Request) error {
	return s.pauseMatchingOp(w, r, false)
}

func (s *Server) resumeMatching(w http.ResponseWriter, r *http.Request) error {
	return s.pauseMatchingOp(w, r, true)
}

// pauseMatchingOp pauses (or resumes) every sandbox, on every node, whose
// labels match: the job-level pause of a preempted job.
func (s *Server) pauseMatchingOp(w http.ResponseWriter, r *http.Request, resume bool) error {
	var req api.PauseRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	labels := map[string]string{}
	for k, v := range req.Labels {
		labels[k] = v
	}
	if req.Label != "" {
		k, v, ok := strings.Cut(req.Label, "=")
		if !ok || k == "" {
			return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("label %q is not key=value", truncate(req.Label))}
		}
		labels[k] = v
	}
	if len(labels) == 0 {
		return &api.Error{Code: api.CodeInvalid, Message: "label (key=value) or labels is required"}
	}
	if principal(r).Project != "" {
		return s.pauseMatchingScoped(w, r, labels, resume)
	}
	ereq := &edgeproto.PauseMatchingRequest{Labels: labels, Resume: resume}
	out := api.PauseResult{Sandboxes: []string{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, n := range s.cfg.Watcher.Up() {
		wg.Add(1)
		go func(node string) {
			defer wg.Done()
			var res api.PauseResult
			err := s.cfg.Bus.Call(r.Context(), bus.EdgeSubject(node), edgeproto.OpPauseMatch, ereq, &res, nil)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if out.Errors == nil {
					out.Errors = map[string]string{}
				}
				out.Errors["node "+node] = err.Error()
				return
			}
			out.Sandboxes = append(out.Sandboxes, res.Sandboxes...)
			for id, msg := range res.Errors {
				if out.Errors == nil {
					out.Errors = map[string]string{}
				}
				out.Errors[id] = msg
			}
		}(n.Name)
	}
	wg.Wait()
	sort.Strings(out.Sandboxes)
	writeJSON(w, http.StatusOK, &out)
	return nil
}

// pauseMatchingScoped is pauseMatchingOp for a project-scoped caller: it
// lists the matching sandboxes the caller sees (the edges filter the list
// by its scope) and pauses or resumes each by id, so the caller reaches no
// other project's sandbox whatever its labels.
func (s *Server) pauseMatchingScoped(w http.ResponseWriter, r *http.Request, labels map[string]string, resume bool) error {
	ctx := bus.WithHeaders(r.Context(), map[string]string{bus.HeaderScope: principal(r).Project})
	state, op := api.StateRunning, edgeproto.OpPause
	if resume {
		state, op = api.StatePaused, edgeproto.OpResume
	}
	out := api.PauseResult{Sandboxes: []string{}}
	var mu sync.Mutex
	fail := func(what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if out.Errors == nil {
			out.Errors = map[string]string{}
		}
		out.Errors[what] = err.Error()
	}
	var wg sync.WaitGroup
	for _, n := range s.cfg.Watcher.Up() {
		wg.Add(1)
		go func(node string) {
			defer wg.Done()
			var l api.SandboxList
			if err := s.cfg.Bus.Call(ctx, bus.EdgeSubject(node), edgeproto.OpList, &edgeproto.ListRequest{Labels: labels, State: state}, &l, nil); err != nil {
				fail("node "+node, err)
				return
			}
			for _, sb := range l.Sandboxes {
				var v api.Sandbox
				if err := s.callEdge(r.Context(), sb.ID, op, &edgeproto.ResumeSandboxRequest{ID: sb.ID}, &v, nil); err != nil {
					fail(sb.ID, err)
					continue
				}
				mu.Lock()
				out.Sandboxes = append(out.Sandboxes, sb.ID)
				mu.Unlock()
			}
		}(n.Name)
	}
	wg.Wait()
	sort.Strings(out.Sandboxes)
	writeJSON(w, http.StatusOK, &out)
	return nil
}
