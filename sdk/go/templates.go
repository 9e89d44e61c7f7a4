package warren

import (
	"context"
	"net/http"
	"net/url"

	"github.com/warrenhq/warren/api"
)

// CreateTemplate creates (or replaces) a named template of sandboxes.
func (c *Client) CreateTemplate(ctx context.Context, t api.Template) (*api.Template, error) {
	var out api.Template
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/templates", json: t, retry: true}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// GetTemplate resolves a template name: the token's project's, else its
// nearest ancestor's.
func (c *Client) GetTemplate(ctx context.Context, name string) (*api.Template, error) {
	var out api.Template
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/templates/" + esc(name), retry: true}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListTemplates lists the templates the token sees.
func (c *Client) ListTemplates(ctx context.Context) ([]api.Template, error) {
	var out api.TemplateList
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/templates", retry: true}, &out); err != nil {
		return nil, err
	}
	return out.Templates, nil
}

// DeleteTemplate deletes a template of the token's project, or of project
// (one below it) when not empty.
func (c *Client) DeleteTemplate(ctx context.Context, name, project string) (*api.Template, error) {
	q := url.Values{}
	if project != "" {
		q.Set("project", project)
	}
	var out api.Template
	if _, err := c.doJSON(ctx, &request{method: http.MethodDelete, path: "/v1/templates/" + esc(name), query: q, retry: true}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
