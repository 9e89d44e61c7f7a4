package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// Templates are named sandbox shapes, stored in a KV bucket under
// "project/name". Like layers they are catalogs for the projects below: a
// name resolves to the caller's project's template first, then its
// ancestors' up to root's (iam.KindTemplate). A template carries no
// authority: a sandbox made from one is created with the caller's token,
// so its image and layers pass the same checks as if named directly.

var templateNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._:-]{0,62}$`)

func templateKey(project, name string) string { return project + "/" + name }

// ancestry is project, its parent, …, and root ("").
func ancestry(project string) []string {
	out := []string{project}
	for project != "" {
		if i := strings.LastIndexByte(project, '.'); i >= 0 {
			project = project[:i]
		} else {
			project = ""
		}
		out = append(out, project)
	}
	return out
}

func (s *Server) createTemplate(w http.ResponseWriter, r *http.Request) error {
	var t api.Template
	if err := decodeJSON(w, r, &t); err != nil {
		return err
	}
	p := principal(r)
	if t.Project == "" {
		t.Project = p.Project
	}
	if !p.Changes(iam.KindTemplate, t.Project) {
		return &api.Error{Code: api.CodeForbidden, Message: fmt.Sprintf("project %s is outside your project %s", t.Project, p.Project)}
	}
	if t.Project != "" && !sandboxspec.ValidProject(t.Project) {
		return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("project %q is not a project id", truncate(t.Project))}
	}
	if t.Project != "" {
		if _, err := s.cfg.IAM.Project(p, t.Project); err != nil {
			return err
		}
	}
	if !templateNameRE.MatchString(t.Name) {
		return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("template name %q: want 1-63 of a-z 0-9 . _ : - starting with a letter or digit", truncate(t.Name))}
	}
	sp := &t.Spec
	switch {
	case sp.Image == "":
		return &api.Error{Code: api.CodeInvalid, Message: "spec.image is required"}
	case sp.Snapshot != "" || sp.Trajectory != "" || sp.Resume || sp.Branch || sp.Project != "":
		return &api.Error{Code: api.CodeInvalid, Message: "a template's spec takes no snapshot, trajectory, resume, branch or project"}
	}
	t.CreatedAt = time.Now().UTC()
	if err := s.templates.Put(r.Context(), templateKey(t.Project, t.Name), &t); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, &t)
	return nil
}

// findTemplate resolves name for p: its project's template, then its
// ancestors'.
func (s *Server) findTemplate(ctx context.Context, p *iam.Principal, name string) (*api.Template, error) {
	for _, proj := range ancestry(p.Project) {
		var t api.Template
		found, _, err := s.templates.Get(ctx, templateKey(proj, name), &t)
		if err != nil {
			return nil, err
		}
		if found && p.Sees(iam.KindTemplate, t.Project) {
			return &t, nil
		}
	}
	return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("template %q not found", truncate(name))}
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) error {
	t, err := s.findTemplate(r.Context(), principal(r), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, t)
	return nil
}

// deleteTemplate deletes the caller's project's template of that name
// (an ancestor's is not the caller's to delete: 404 as for none).
func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) error {
	p := principal(r)
	name := r.PathValue("name")
	project := r.URL.Query().Get("project")
	if project == "" {
		project = p.Project
	}
	var t api.Template
	key := templateKey(project, name)
	found, _, err := s.templates.Get(r.Context(), key, &t)
	if err != nil {
		return err
	}
	if !found || !p.Changes(iam.KindTemplate, t.Project) {
		return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("template %q not found", truncate(name))}
	}
	if err := s.templates.Delete(r.Context(), key); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &t)
	return nil
}

// listTemplates lists the templates the caller sees: its project's and
// those below, and its ancestors'.
func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) error {
	p := principal(r)
	out := api.TemplateList{Templates: []api.Template{}}
	err := s.templates.Each(r.Context(), func(_ string, raw []byte) error {
		var t api.Template
		if json.Unmarshal(raw, &t) != nil || !p.Sees(iam.KindTemplate, t.Project) {
			return nil
		}
		out.Templates = append(out.Templates, t)
		return nil
	})
	if err != nil {
		return err
	}
	sort.Slice(out.Templates, func(i, j int) bool {
		a, b := out.Templates[i], out.Templates[j]
		if a.Project != b.Project {
			return a.Project < b.Project
		}
		return a.Name < b.Name
	})
	writeJSON(w, http.StatusOK, &out)
	return nil
}
