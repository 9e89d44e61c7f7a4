package warren

import (
	"context"
	"net/http"

	"github.com/warrenhq/warren/api"
)

// BatchCreate creates count sandboxes of one spec in one call. Sandboxes
// that could not be made are counted in the result's Failed and Errors.
// It is not retried (a retry could double the batch).
func (c *Client) BatchCreate(ctx context.Context, req api.BatchCreateRequest) (*api.BatchCreateResult, error) {
	var out api.BatchCreateResult
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/sandboxes:batch", json: req}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// CreateProject makes a project under req.Parent (default: the token's project).
func (c *Client) CreateProject(ctx context.Context, req api.CreateProjectRequest) (*api.Project, error) {
	var p api.Project
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/projects", json: req}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Projects lists the projects the token reaches, with their usage.
func (c *Client) Projects(ctx context.Context) ([]api.Project, error) {
	var l api.ProjectList
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/projects", retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Projects, nil
}

// Project returns one project with its usage.
func (c *Client) Project(ctx context.Context, id string) (*api.Project, error) {
	var p api.Project
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/projects/" + esc(id), retry: true}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// UpdateProject sets a project's quota (needs admin above the project).
func (c *Client) UpdateProject(ctx context.Context, id string, req api.UpdateProjectRequest) (*api.Project, error) {
	var p api.Project
	if _, err := c.doJSON(ctx, &request{method: http.MethodPatch, path: "/v1/projects/" + esc(id), json: req, retry: true}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// DeleteProject removes an empty project.
func (c *Client) DeleteProject(ctx context.Context, id string) error {
	_, err := c.doJSON(ctx, &request{method: http.MethodDelete, path: "/v1/projects/" + esc(id), retry: true}, nil)
	return err
}

// CreateToken issues a token; its secret (Token.Secret) is shown only here.
func (c *Client) CreateToken(ctx context.Context, req api.CreateTokenRequest) (*api.Token, error) {
	var t api.Token
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/tokens", json: req}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// Tokens lists the tokens the caller manages (never their secrets).
func (c *Client) Tokens(ctx context.Context) ([]api.Token, error) {
	var l api.TokenList
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/tokens", retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Tokens, nil
}

// RevokeToken revokes a token by id: it answers 401 from then on.
func (c *Client) RevokeToken(ctx context.Context, id string) error {
	_, err := c.doJSON(ctx, &request{method: http.MethodDelete, path: "/v1/tokens/" + esc(id), retry: true}, nil)
	return err
}
