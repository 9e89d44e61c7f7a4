package warren

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"

	"github.com/warrenhq/warren/api"
)

// Exec runs a command and waits for its result. With req.Background set it
// returns at once with CommandID set; follow it with Command.
// Exec is not retried: a command may have side effects.
func (c *Client) Exec(ctx context.Context, id string, req api.ExecRequest) (*api.ExecResult, error) {
	var res api.ExecResult
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/sandboxes/" + esc(id) + "/exec", json: req}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// ExecStream runs a command and copies its output to stdout and stderr (either
// may be nil to discard) as it arrives. It returns the final result, whose
// Stdout and Stderr are empty because the output went to the writers.
// An error event at the end of the stream is returned as an *APIError.
func (c *Client) ExecStream(ctx context.Context, id string, req api.ExecRequest, stdout, stderr io.Writer) (*api.ExecResult, error) {
	return c.ExecStreamFunc(ctx, id, req, func(ev api.ExecEvent) error {
		if ev.Stdout != nil && stdout != nil {
			if _, err := io.WriteString(stdout, *ev.Stdout); err != nil {
				return err
			}
		}
		if ev.Stderr != nil && stderr != nil {
			if _, err := io.WriteString(stderr, *ev.Stderr); err != nil {
				return err
			}
		}
		return nil
	})
}

// ExecStreamFunc runs a command and calls fn for every stdout/stderr event of
// the NDJSON stream, in order. An error from fn stops the stream (the
// request is cancelled) and is returned.
func (c *Client) ExecStreamFunc(ctx context.Context, id string, req api.ExecRequest, fn func(api.ExecEvent) error) (*api.ExecResult, error) {
	req.Background = false
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resp, err := c.do(ctx, &request{method: http.MethodPost, path: "/v1/sandboxes/" + esc(id) + "/exec", json: req, accept: "application/x-ndjson"})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()

	// A server that answers plain JSON (no streaming support) still works.
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt == "application/json" {
		var res api.ExecResult
		if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
			return nil, fmt.Errorf("warren: exec: decode answer: %w", err)
		}
		if res.Stdout != "" {
			s := res.Stdout
			if err := fn(api.ExecEvent{Stdout: &s}); err != nil {
				return nil, err
			}
		}
		if res.Stderr != "" {
			s := res.Stderr
			if err := fn(api.ExecEvent{Stderr: &s}); err != nil {
				return nil, err
			}
		}
		res.Stdout, res.Stderr = "", ""
		return &res, nil
	}

	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 {
			continue
		}
		var ev api.ExecEvent
		if err := json.Unmarshal(line, &ev); err != nil {
			return nil, fmt.Errorf("warren: exec stream: bad event %q: %w", truncate(line, 80), err)
		}
		switch {
		case ev.Error != nil:
			return nil, &APIError{Status: statusForCode(ev.Error.Code), Code: ev.Error.Code, Message: ev.Error.Message}
		case ev.ExitCode != nil:
			res := &api.ExecResult{ExitCode: *ev.ExitCode, Truncated: ev.Truncated, TimedOut: ev.TimedOut, Signal: ev.Signal,
				OOMKilled: ev.OOMKilled, KilledBy: ev.KilledBy, PidsLimited: ev.PidsLimited, DiskFull: ev.DiskFull,
				Step: ev.Step, Replayed: ev.Replayed, Sandbox: ev.Sandbox, Trajectory: ev.Trajectory}
			if ev.DurationMs != nil {
				res.DurationMs = *ev.DurationMs
			}
			return res, nil
		case ev.Stdout != nil || ev.Stderr != nil:
			if err := fn(ev); err != nil {
				return nil, err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("warren: exec stream: %w", err)
	}
	return nil, fmt.Errorf("warren: exec stream ended without a result: %w", io.ErrUnexpectedEOF)
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// Command returns the state of a background command. With wait set, the
// server holds the answer until the command has finished (or its own wait
// limit passes; check Running).
func (c *Client) Command(ctx context.Context, id, cid string, wait bool) (*api.Command, error) {
	q := url.Values{}
	if wait {
		q.Set("wait", "1")
	}
	var cmd api.Command
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/sandboxes/" + esc(id) + "/commands/" + esc(cid), query: q, retry: true}, &cmd); err != nil {
		return nil, err
	}
	return &cmd, nil
}

// KillCommand sends signal (a number: 15 for SIGTERM, 9 for SIGKILL) to a
// background command and returns its state.
func (c *Client) KillCommand(ctx context.Context, id, cid string, signal int) (*api.Command, error) {
	body := map[string]int{"signal": signal}
	var cmd api.Command
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/sandboxes/" + esc(id) + "/commands/" + esc(cid) + "/kill", json: body, retry: true}, &cmd); err != nil {
		return nil, err
	}
	return &cmd, nil
}

// Commands returns the sandbox's recent command history (the last
// api.MaxCommandHistory commands, oldest first) with how each ended.
func (c *Client) Commands(ctx context.Context, id string) ([]api.CommandRecord, error) {
	var h api.CommandHistory
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/sandboxes/" + esc(id) + "/commands", retry: true}, &h); err != nil {
		return nil, err
	}
	return h.Commands, nil
}
