package warren

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// FollowEvents streams the events after sequence number after to fn as the
// cluster appends them (GET /v1/events?follow=1), until ctx ends (it then
// returns ctx.Err()) or fn returns an error (returned as is). A broken
// connection or a restarted apiserver is resumed from the last event seen,
// so fn sees each event once and in order. Errors the server answers
// before streaming (401, 422, ...) end it.
func (c *Client) FollowEvents(ctx context.Context, after uint64, fn func(api.Event) error) error {
	for attempt := 1; ; attempt++ {
		n, err := c.followOnce(ctx, &after, fn)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var fe *fnError
		var ae *APIError
		switch {
		case errors.As(err, &fe):
			return fe.err
		case errors.As(err, &ae) && ae.Status != http.StatusServiceUnavailable && ae.Status != http.StatusTooManyRequests:
			return err
		}
		if n > 0 {
			attempt = 1
		}
		if werr := c.sleep(ctx, min(attempt, 6), 0); werr != nil {
			return werr
		}
	}
}

// fnError carries the callback's own error out of followOnce.
type fnError struct{ err error }

func (e *fnError) Error() string { return e.err.Error() }

// followOnce reads one stream, advancing *after; it returns how many
// events it delivered.
func (c *Client) followOnce(ctx context.Context, after *uint64, fn func(api.Event) error) (int, error) {
	q := url.Values{"follow": {"1"}}
	if *after > 0 {
		q.Set("after", strconv.FormatUint(*after, 10))
	}
	resp, err := c.do(ctx, &request{method: http.MethodGet, path: "/v1/events", query: q, accept: "application/x-ndjson"})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	n := 0
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue // keepalive
		}
		var ev api.Event
		if err := json.Unmarshal(line, &ev); err != nil {
			return n, fmt.Errorf("warren: events: decode: %w", err)
		}
		if ev.Seq <= *after {
			continue
		}
		*after = ev.Seq
		n++
		if err := fn(ev); err != nil {
			return n, &fnError{err: err}
		}
	}
	if err := sc.Err(); err != nil {
		return n, err
	}
	return n, io.ErrUnexpectedEOF
}
