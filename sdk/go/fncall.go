package warren

import (
	"context"
	"net/http"

	"github.com/warrenhq/warren/api"
)

// FnCall runs one stateless task in a pre-created container of the fncall
// tier (POST /v1/fncall). Tasks are not retried: a task may have run.
func (c *Client) FnCall(ctx context.Context, req api.FnCallRequest) (*api.ExecResult, error) {
	var res api.ExecResult
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/fncall", json: req}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}
