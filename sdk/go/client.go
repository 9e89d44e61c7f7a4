// Package warren is the Go client of warren's REST API v1.
//
//	c := warren.FromEnv()
//	sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox"})
//	res, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo hi"})
//
// Every method takes a context; cancel it to abandon a call (and a stream).
// Errors from the server are *APIError values; see IsNotFound and friends.
package warren

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults used by FromEnv when the environment says nothing.
const (
	DefaultURL       = "http://127.0.0.1:7070"
	DefaultTokenFile = "/var/lib/warren/admin-token"
	EnvURL           = "WARREN_URL"
	EnvToken         = "WARREN_TOKEN"
)

// UserAgent is sent with every request.
var UserAgent = "warren-go-sdk/1"

// Client talks to a warren API: one endpoint, or several apiserver replicas
// (New with comma-separated URLs) among which it fails over when one stops
// answering. It is safe for concurrent use.
type Client struct {
	base        string // the first endpoint, without trailing slash
	bases       []string
	cur         atomic.Uint32 // index of the endpoint in use
	token       string
	hc          *http.Client
	maxAttempts int
	baseDelay   time.Duration
	maxDelay    time.Duration
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient replaces the HTTP client (and so its transport).
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithRetry sets how many attempts a retryable call makes (1 = no retries)
// and the first backoff delay; the delay doubles up to max, with jitter.
func WithRetry(attempts int, base, max time.Duration) Option {
	return func(c *Client) {
		if attempts < 1 {
			attempts = 1
		}
		c.maxAttempts, c.baseDelay, c.maxDelay = attempts, base, max
	}
}

// NewTransport returns the keep-alive transport the client uses by default:
// many idle connections per host, because one client often drives hundreds
// of sandboxes on the same apiserver.
func NewTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 1024
	t.MaxIdleConnsPerHost = 256
	t.IdleConnTimeout = 90 * time.Second
	return t
}

// New returns a client for the API at baseURL (e.g. "http://127.0.0.1:7070")
// authenticating with token. baseURL may list several apiservers separated
// by commas: a request that cannot connect to one moves to the next.
func New(baseURL, token string, opts ...Option) *Client {
	var bases []string
	for _, b := range strings.Split(baseURL, ",") {
		if b = strings.TrimRight(strings.TrimSpace(b), "/"); b != "" {
			bases = append(bases, b)
		}
	}
	if len(bases) == 0 {
		bases = []string{""}
	}
	c := &Client{
		base:        bases[0],
		bases:       bases,
		token:       token,
		maxAttempts: 5,
		baseDelay:   50 * time.Millisecond,
		maxDelay:    2 * time.Second,
	}
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		c.hc = &http.Client{Transport: NewTransport()}
	}
	return c
}

// FromEnv returns a client configured from WARREN_URL and WARREN_TOKEN, with
// the fallbacks of ResolveEnv.
func FromEnv(opts ...Option) *Client {
	u, t := ResolveEnv("", "")
	return New(u, t, opts...)
}

// ResolveEnv fills in an empty url or token: first from WARREN_URL and
// WARREN_TOKEN, then DefaultURL and the contents of DefaultTokenFile when
// that file is readable.
func ResolveEnv(baseURL, token string) (string, string) {
	if baseURL == "" {
		baseURL = os.Getenv(EnvURL)
	}
	if baseURL == "" {
		baseURL = DefaultURL
	}
	if token == "" {
		token = os.Getenv(EnvToken)
	}
	if token == "" {
		if b, err := os.ReadFile(DefaultTokenFile); err == nil {
			token = strings.TrimSpace(string(b))
		}
	}
	return baseURL, token
}

// URL returns the base URL the client talks to now.
func (c *Client) URL() string { return c.bases[int(c.cur.Load())%len(c.bases)] }

// failover moves to the next endpoint after endpoint i failed to connect.
func (c *Client) failover(i uint32) {
	c.cur.CompareAndSwap(i, (i+1)%uint32(len(c.bases)))
}

// request describes one API call.
type request struct {
	method string
	path   string // already escaped path, starting with "/"
	query  url.Values
	header http.Header
	body   io.Reader // nil; replayed on retry only when it is an io.Seeker
	json   any       // encoded as the body when non-nil
	retry  bool      // safe to retry on 429/503/connection refused
	noAuth bool
	accept string
	ctype  string
}

// do performs r with retries and returns a response whose status is 2xx.
// Any other status is turned into an *APIError.
func (c *Client) do(ctx context.Context, r *request) (*http.Response, error) {
	var payload []byte
	if r.json != nil {
		b, err := json.Marshal(r.json)
		if err != nil {
			return nil, fmt.Errorf("warren: encode request: %w", err)
		}
		payload = b
	}
	// A seekable body can be replayed; remember where it started.
	var seeker io.Seeker
	var start, size int64 = 0, -1
	if r.body != nil {
		if s, ok := r.body.(io.Seeker); ok {
			if pos, err := s.Seek(0, io.SeekCurrent); err == nil {
				if end, err := s.Seek(0, io.SeekEnd); err == nil {
					if _, err := s.Seek(pos, io.SeekStart); err == nil {
						seeker, start, size = s, pos, end-pos
					}
				}
			}
		}
	}
	attempts := 1
	if r.retry && (r.body == nil || seeker != nil) {
		attempts = c.maxAttempts
	}
	query := ""
	if len(r.query) > 0 {
		query = "?" + r.query.Encode()
	}
	// A request that could not connect never reached a server: it may go
	// to each other endpoint once, whatever the method.
	failovers := len(c.bases) - 1
	for attempt := 1; ; attempt++ {
		ci := c.cur.Load() % uint32(len(c.bases))
		u := c.bases[ci] + r.path + query
		var body io.Reader
		switch {
		case payload != nil:
			body = bytes.NewReader(payload)
		case r.body != nil:
			if attempt > 1 {
				if _, err := seeker.Seek(start, io.SeekStart); err != nil {
					return nil, fmt.Errorf("warren: rewind body: %w", err)
				}
			}
			// Hide Close: the transport closes request bodies, and the
			// caller owns r.body (and a retry needs it open).
			body = struct{ io.Reader }{r.body}
		}
		req, err := http.NewRequestWithContext(ctx, r.method, u, body)
		if err != nil {
			return nil, fmt.Errorf("warren: %w", err)
		}
		if r.body != nil && payload == nil && size >= 0 {
			req.ContentLength = size
			if size == 0 {
				req.Body = http.NoBody
			}
		}
		for k, v := range r.header {
			req.Header[k] = v
		}
		if !r.noAuth && c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		req.Header.Set("User-Agent", UserAgent)
		if payload != nil {
			req.Header.Set("Content-Type", "application/json")
		} else if r.ctype != "" {
			req.Header.Set("Content-Type", r.ctype)
		}
		if r.accept != "" {
			req.Header.Set("Accept", r.accept)
		} else {
			req.Header.Set("Accept", "application/json")
		}
		resp, err := c.hc.Do(req)
		if err != nil {
			if retryableNetErr(err) && ctx.Err() == nil && len(c.bases) > 1 {
				c.failover(ci)
				if failovers > 0 {
					failovers--
					attempt--
					continue
				}
			}
			if attempt < attempts && retryableNetErr(err) && ctx.Err() == nil {
				if werr := c.sleep(ctx, attempt, 0); werr != nil {
					return nil, werr
				}
				continue
			}
			return nil, fmt.Errorf("warren: %s %s: %w", r.method, r.path, err)
		}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			return resp, nil
		}
		apiErr := readError(resp)
		if attempt < attempts && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
			if werr := c.sleep(ctx, attempt, retryAfter(resp)); werr != nil {
				return nil, werr
			}
			continue
		}
		return nil, apiErr
	}
}

// doJSON performs r and decodes a JSON answer into out (when non-nil).
func (c *Client) doJSON(ctx context.Context, r *request, out any) (int, error) {
	resp, err := c.do(ctx, r)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return resp.StatusCode, fmt.Errorf("warren: %s %s: decode answer: %w", r.method, r.path, err)
	}
	return resp.StatusCode, nil
}

// sleep waits before attempt+1: the server's Retry-After when given,
// otherwise exponential backoff with full jitter in [d/2, d].
func (c *Client) sleep(ctx context.Context, attempt int, hint time.Duration) error {
	d := c.baseDelay << (attempt - 1)
	if d > c.maxDelay || d <= 0 {
		d = c.maxDelay
	}
	if d > 0 {
		d = d/2 + rand.N(d/2+1)
	}
	if hint > 0 {
		d = hint
		if d > c.maxDelay*4 {
			d = c.maxDelay * 4
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func retryAfter(resp *http.Response) time.Duration {
	v := resp.Header.Get("Retry-After")
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 {
		return time.Duration(s * float64(time.Second))
	}
	if t, err := http.ParseTime(v); err == nil {
		return time.Until(t)
	}
	return 0
}

// retryableNetErr reports errors where the request surely never reached the
// server: connection refused (server restarting) or reset before any answer.
func retryableNetErr(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	return false
}

// idempotencyKey returns a fresh random key for Create.
func idempotencyKey() string {
	return fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
}

// esc escapes one path segment (ids are simple, but be safe).
func esc(s string) string { return url.PathEscape(s) }
