package warren

import (
	"context"
	"net/http"
	"net/url"
	"sort"

	"github.com/warrenhq/warren/api"
)

// Create starts a sandbox. It sends a fresh Idempotency-Key, so the retries
// it makes on 429/503/connection refused never create a second sandbox.
func (c *Client) Create(ctx context.Context, req api.CreateSandboxRequest) (*api.Sandbox, error) {
	return c.CreateWithKey(ctx, req, idempotencyKey())
}

// CreateWithKey is Create with a caller-chosen idempotency key: calling it
// again with the same key returns the sandbox the first call created.
func (c *Client) CreateWithKey(ctx context.Context, req api.CreateSandboxRequest, key string) (*api.Sandbox, error) {
	var sb api.Sandbox
	h := http.Header{}
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	_, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/sandboxes", header: h, json: req, retry: key != ""}, &sb)
	if err != nil {
		return nil, err
	}
	return &sb, nil
}

// Get returns one sandbox.
func (c *Client) Get(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/sandboxes/" + esc(id), retry: true}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ListOptions filters List. Every label must match; State is one of the
// api.State* constants or empty for all.
type ListOptions struct {
	Labels  map[string]string
	State   string
	Project string // this project and its descendants
}

// List returns the sandboxes visible to the token.
func (c *Client) List(ctx context.Context, opts ListOptions) ([]api.Sandbox, error) {
	q := url.Values{}
	keys := make([]string, 0, len(opts.Labels))
	for k := range opts.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		q.Add("label", k+"="+opts.Labels[k])
	}
	if opts.Project != "" {
		q.Set("project", opts.Project)
	}
	if opts.State != "" {
		q.Set("state", opts.State)
	}
	var l api.SandboxList
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/sandboxes", query: q, retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Sandboxes, nil
}

// Delete stops and removes a sandbox and returns its final state.
func (c *Client) Delete(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if _, err := c.doJSON(ctx, &request{method: http.MethodDelete, path: "/v1/sandboxes/" + esc(id), retry: true}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Pause freezes a sandbox and pushes its memory out; any later operation
// on it resumes it.
func (c *Client) Pause(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/sandboxes/" + esc(id) + "/pause", retry: true}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Resume thaws a paused sandbox and prefetches its swapped-out memory.
func (c *Client) Resume(ctx context.Context, id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/sandboxes/" + esc(id) + "/resume", retry: true}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// ResumeWith resumes a paused sandbox with options (prefetch false leaves
// its swapped-out memory to page faults).
func (c *Client) ResumeWith(ctx context.Context, id string, opts api.ResumeRequest) (*api.Sandbox, error) {
	var sb api.Sandbox
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/sandboxes/" + esc(id) + "/resume", json: opts, retry: true}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// SetTimeout makes a sandbox expire ttl seconds from now, whatever its
// lifetime was.
func (c *Client) SetTimeout(ctx context.Context, id string, ttl int64) (*api.Sandbox, error) {
	return c.SetTimeouts(ctx, id, api.TimeoutRequest{TTL: ttl})
}

// SetTimeouts moves a sandbox's expiry and/or replaces its idle timeout
// (both counted from now).
func (c *Client) SetTimeouts(ctx context.Context, id string, req api.TimeoutRequest) (*api.Sandbox, error) {
	var sb api.Sandbox
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/sandboxes/" + esc(id) + "/timeout", json: req, retry: true}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// PauseMatching pauses every sandbox whose labels all match (the
// job-level pause of a preempted job).
func (c *Client) PauseMatching(ctx context.Context, labels map[string]string) (*api.PauseResult, error) {
	var res api.PauseResult
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/sandboxes:pause", json: api.PauseRequest{Labels: labels}, retry: true}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// ResumeMatching resumes every paused sandbox whose labels all match.
func (c *Client) ResumeMatching(ctx context.Context, labels map[string]string) (*api.PauseResult, error) {
	var res api.PauseResult
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/sandboxes:resume", json: api.PauseRequest{Labels: labels}, retry: true}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Network returns the sandbox's network (address, allowlist) and what its
// policy refused so far, by reason.
func (c *Client) Network(ctx context.Context, id string) (*api.SandboxNetwork, error) {
	var n api.SandboxNetwork
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/sandboxes/" + esc(id) + "/network", retry: true}, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// SetNetwork replaces a running networked sandbox's egress list; new
// connections obey it when this returns, open ones to destinations no
// longer listed are cut.
func (c *Client) SetNetwork(ctx context.Context, id string, egress []string) (*api.SandboxNetwork, error) {
	if egress == nil {
		egress = []string{}
	}
	var n api.SandboxNetwork
	if _, err := c.doJSON(ctx, &request{method: http.MethodPut, path: "/v1/sandboxes/" + esc(id) + "/network", json: api.NetworkSpec{Egress: egress}, retry: true}, &n); err != nil {
		return nil, err
	}
	return &n, nil
}

// Stats returns what the sandbox uses now (CPU time, memory) beside its limits.
func (c *Client) Stats(ctx context.Context, id string) (*api.SandboxStats, error) {
	var st api.SandboxStats
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/sandboxes/" + esc(id) + "/stats", retry: true}, &st); err != nil {
		return nil, err
	}
	return &st, nil
}
