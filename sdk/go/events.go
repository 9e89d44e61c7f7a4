package warren

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/warrenhq/warren/api"
)

// Events reads up to limit events after sequence number after, waiting up
// to wait for the first (0: a short default). Pass the answer's Next as the
// next call's after.
func (c *Client) Events(ctx context.Context, after uint64, limit int, wait time.Duration) (*api.EventList, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatUint(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if wait > 0 {
		q.Set("wait", strconv.FormatFloat(wait.Seconds(), 'f', 3, 64))
	}
	var out api.EventList
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/events", query: q, retry: true}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
