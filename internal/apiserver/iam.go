package apiserver

import (
	"context"
	"net/http"

	"github.com/warrenhq/warren/api"
)

func (s *Server) withUsage(ctx context.Context, p *api.Project) *api.Project {
	u := s.cfg.Watcher.ProjectUsage(p.ID)
	if rec, _, err := s.storage.Get(ctx, p.ID); err == nil {
		u.StorageBytes = rec.Bytes
	}
	p.Usage = &u
	return p
}

func (s *Server) createProject(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateProjectRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	p, err := s.cfg.IAM.CreateProject(r.Context(), principal(r), &req)
	if err != nil {
		return err
	}
	s.syncStorageLimit(r.Context(), p)
	writeJSON(w, http.StatusCreated, s.withUsage(r.Context(), p))
	return nil
}

func (s *Server) listProjects(w http.ResponseWriter, r *http.Request) error {
	out := api.ProjectList{Projects: s.cfg.IAM.Projects(principal(r))}
	for i := range out.Projects {
		s.withUsage(r.Context(), &out.Projects[i])
	}
	writeJSON(w, http.StatusOK, &out)
	return nil
}

func (s *Server) getProject(w http.ResponseWriter, r *http.Request) error {
	p, err := s.cfg.IAM.Project(principal(r), r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.withUsage(r.Context(), p))
	return nil
}

func (s *Server) updateProject(w http.ResponseWriter, r *http.Request) error {
	var req api.UpdateProjectRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	p, err := s.cfg.IAM.UpdateProject(r.Context(), principal(r), r.PathValue("id"), &req)
	if err != nil {
		return err
	}
	s.syncStorageLimit(r.Context(), p)
	writeJSON(w, http.StatusOK, s.withUsage(r.Context(), p))
	return nil
}

func (s *Server) deleteProject(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	err := s.cfg.IAM.DeleteProject(r.Context(), principal(r), id, func(id string) int {
		return s.cfg.Watcher.ProjectUsage(id).Sandboxes + s.placer.Pending(id).Sandboxes
	})
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) createToken(w http.ResponseWriter, r *http.Request) error {
	var req api.CreateTokenRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	t, err := s.cfg.IAM.CreateToken(r.Context(), principal(r), &req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, t)
	return nil
}

func (s *Server) listTokens(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, &api.TokenList{Tokens: s.cfg.IAM.Tokens(principal(r))})
	return nil
}

func (s *Server) revokeToken(w http.ResponseWriter, r *http.Request) error {
	if err := s.cfg.IAM.RevokeToken(r.Context(), principal(r), r.PathValue("id")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
