package warren

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/warrenhq/warren/api"
)

// Screenshot is the screen of a sandbox created with tier vm and display
// true, as a PNG.
func (c *Client) Screenshot(ctx context.Context, id string) ([]byte, error) {
	resp, err := c.do(ctx, &request{method: http.MethodGet, path: "/v1/sandboxes/" + esc(id) + "/screenshot", accept: "image/png", retry: true})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("warren: screenshot: %w", err)
	}
	return b, nil
}

// DisplayInput sends one keyboard or mouse event to a sandbox's screen:
// api.DisplayInput{Type: "text", Text: "ls\n"}, {Type: "key", Key:
// "ctrl-alt-delete"} or {Type: "click", X: 10, Y: 20}.
func (c *Client) DisplayInput(ctx context.Context, id string, in api.DisplayInput) error {
	resp, err := c.do(ctx, &request{method: http.MethodPost, path: "/v1/sandboxes/" + esc(id) + "/display/input", json: &in})
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}
