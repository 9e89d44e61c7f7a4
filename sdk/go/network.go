package warren

import (
	"context"
	"net/http"

	"github.com/warrenhq/warren/api"
)

// NetworkDenials returns a networked sandbox's log of refusals (names the
// resolver refused, packets its policy refused), oldest first.
func (c *Client) NetworkDenials(ctx context.Context, id string) (*api.NetworkDenials, error) {
	var out api.NetworkDenials
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/sandboxes/" + esc(id) + "/network/denials", retry: true}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// PutNetworkRule creates or replaces a named network rule (root admins
// only); the answer carries its new version.
func (c *Client) PutNetworkRule(ctx context.Context, rule api.NetworkRule) (*api.NetworkRule, error) {
	var out api.NetworkRule
	if _, err := c.doJSON(ctx, &request{method: http.MethodPut, path: "/v1/network-rules/" + esc(rule.Name), json: rule, retry: true}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// NetworkRule returns one named network rule.
func (c *Client) NetworkRule(ctx context.Context, name string) (*api.NetworkRule, error) {
	var out api.NetworkRule
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/network-rules/" + esc(name), retry: true}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// NetworkRules lists the cluster's named network rules.
func (c *Client) NetworkRules(ctx context.Context) ([]api.NetworkRule, error) {
	var out api.NetworkRuleList
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/network-rules", retry: true}, &out); err != nil {
		return nil, err
	}
	return out.Rules, nil
}

// DeleteNetworkRule deletes a named network rule (root admins only).
func (c *Client) DeleteNetworkRule(ctx context.Context, name string) (*api.NetworkRule, error) {
	var out api.NetworkRule
	if _, err := c.doJSON(ctx, &request{method: http.MethodDelete, path: "/v1/network-rules/" + esc(name), retry: true}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
