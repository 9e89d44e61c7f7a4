package warren

import (
	"context"
	"net/http"

	"github.com/warrenhq/warren/api"
)

// CreatePool creates a warm pool (or changes the size of an existing one
// with the same shape): every node keeps req.Size sandboxes of that shape
// ready, and a matching Create claims one.
func (c *Client) CreatePool(ctx context.Context, req api.PoolRequest) (*api.Pool, error) {
	var p api.Pool
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/pools", json: req, retry: true}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// Pools lists the warm pools.
func (c *Client) Pools(ctx context.Context) ([]api.Pool, error) {
	var l api.PoolList
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/pools", retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Pools, nil
}

// Pool returns one warm pool.
func (c *Client) Pool(ctx context.Context, name string) (*api.Pool, error) {
	var p api.Pool
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/pools/" + esc(name), retry: true}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// DeletePool deletes a warm pool; its unclaimed sandboxes are stopped.
func (c *Client) DeletePool(ctx context.Context, name string) (*api.Pool, error) {
	var p api.Pool
	if _, err := c.doJSON(ctx, &request{method: http.MethodDelete, path: "/v1/pools/" + esc(name), retry: true}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}
