package warren

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/warrenhq/warren/api"
)

// AuditQuery selects records of a sandbox's audit.
type AuditQuery struct {
	// Step, when HasStep, keeps the records of that trajectory step only
	// (0 = between steps).
	Step    int64
	HasStep bool
	Kind    string // "" = every kind
	// Summary asks for counts per step and kind (AuditList.Summary)
	// instead of the records.
	Summary bool
}

// Audit returns what a sandbox's processes did (every execve), as its
// node's kernel recorded it, oldest first (GET /v1/sandboxes/{id}/audit).
func (c *Client) Audit(ctx context.Context, id string, q AuditQuery) (*api.AuditList, error) {
	v := url.Values{}
	if q.HasStep {
		v.Set("step", strconv.FormatInt(q.Step, 10))
	}
	if q.Kind != "" {
		v.Set("kind", q.Kind)
	}
	if q.Summary {
		v.Set("summary", "1")
	}
	var out api.AuditList
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/sandboxes/" + esc(id) + "/audit", query: v, retry: true}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// TrajectoryAudit is Trajectory with each step's audit (what the
// sandbox's processes did during it: GET /v1/trajectories/{name}?audit=1).
func (c *Client) TrajectoryAudit(ctx context.Context, name string, after int64, limit int) (*api.TrajectoryPage, error) {
	q := url.Values{"audit": {"1"}}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var p api.TrajectoryPage
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/trajectories/" + escPath(name), query: q, retry: true}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// TrajectoryAuditSummary counts a trajectory's audit records per step and
// kind, and those a policy rule matched (GET
// /v1/trajectories/{name}/audit/summary): one call to flag a rollout. The
// records are kept with the trajectory, so this works after its sandbox
// is gone.
func (c *Client) TrajectoryAuditSummary(ctx context.Context, name string) (*api.AuditList, error) {
	var out api.AuditList
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/trajectories/" + escPath(name), query: url.Values{"audit": {"summary"}}, retry: true}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// FollowAudit streams a sandbox's audit records after seq after, calling
// fn for each as it is recorded, until the sandbox has stopped and its
// last records came (nil), ctx ends, fn fails (its error), or the stream
// fails (GET /v1/sandboxes/{id}/audit?follow=1). Resume with the last
// record's Seq.
func (c *Client) FollowAudit(ctx context.Context, id string, after int64, fn func(api.AuditRecord) error) error {
	q := url.Values{"follow": {"1"}}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	resp, err := c.do(ctx, &request{method: http.MethodGet, path: "/v1/sandboxes/" + esc(id) + "/audit", query: q, accept: "application/x-ndjson"})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue // keepalive
		}
		var msg struct {
			api.AuditRecord
			Error *api.Error `json:"error"`
		}
		if err := json.Unmarshal(line, &msg); err != nil {
			return fmt.Errorf("warren: audit: decode: %w", err)
		}
		if msg.Error != nil {
			return fmt.Errorf("warren: audit stream: %s: %s", msg.Error.Code, msg.Error.Message)
		}
		if err := fn(msg.AuditRecord); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("warren: audit stream: %w", err)
	}
	return ctx.Err()
}
