// Package e2b serves E2B's REST control plane (the API the official `e2b`
// SDKs call through E2B_API_URL) on top of warren's native API.
//
// It holds no state and does no authorisation of its own: every request is
// turned into calls of the native API (sdk/go) against the apiserver's
// http.Handler in-process, carrying the caller's key as its bearer token, so
// authentication, roles, project scope and ownership are exactly the native
// API's. An object another project owns is therefore "not found" here too.
//
// The wire facts (paths, field names, status codes, the {"code","message"}
// error body) follow ../shared/reference/e2b.md, which records what the
// official SDKs send and expect. envd.go serves part of the in-sandbox API
// (filesystem, /files, /health) on the same origin.
package e2b

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"

	warren "github.com/warrenhq/warren/sdk/go"
)

// Wire constants the SDKs check.
const (
	// EnvdVersion is reported for every sandbox: valid semver at or above
	// every version gate the control plane needs (e2b.md §5).
	EnvdVersion = "0.5.7"
	// ClientID is the deprecated-but-required clientID field.
	ClientID = "warren"
	// DefaultTimeout is the lifetime, in seconds, of a sandbox created
	// without a timeout (E2B's default).
	DefaultTimeout = 300
	// MaxTimeout bounds the timeout a client may ask for (24 h).
	MaxTimeout    = 24 * 60 * 60
	maxBody       = 1 << 20
	internalBase  = "http://warren.internal"
	apiKeyHeader  = "X-API-KEY"
	e2bKeyPrefix  = "e2b_"
	defaultLimit  = 100
	maxListLimit  = 1000
	nextTokenHdr  = "X-Next-Token"
	contentJSON   = "application/json"
	internalError = "internal error"
)

// Config wires a Server.
type Config struct {
	// API is the native apiserver's handler; every request is served by it.
	API    http.Handler
	Logger *slog.Logger
}

// Server is the E2B control plane. It is safe for concurrent use.
type Server struct {
	hc       *http.Client
	streamHC *http.Client // streamTransport: exec streams
	api      http.Handler
	// live: an in-process client that can upgrade to a WebSocket
	// (terminals: process.go), made on first use; liveStop stops it.
	liveOnce sync.Once
	live     *http.Client
	liveStop func()
	log      *slog.Logger
	mux      *http.ServeMux
	envd     http.Handler // envd.go
	// facts: each sandbox's default user and whether it has bash (process.go).
	facts factCache
	// procs: the processes started through envd (process.go).
	procs procTable
	// keys: the access token given for each sandbox (signed.go).
	keys keyTable
	// watchers: the polling watchers (watch.go).
	watchers watcherTable
}

// New returns the control plane over cfg.API.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{
		hc:       &http.Client{Transport: handlerTransport{h: cfg.API}},
		streamHC: &http.Client{Transport: streamTransport{h: cfg.API}},
		api:      cfg.API,
		log:      cfg.Logger.With("part", "e2b"),
		mux:      http.NewServeMux(),
		keys:     newKeyTable(),
	}
	s.routes()
	s.envd = s.newEnvd()
	return s
}

// liveClient is the in-process client for commands with live input.
func (s *Server) liveClient() *http.Client {
	s.liveOnce.Do(func() { s.live, s.liveStop = warren.InProcess(s.api) })
	return s.live
}

// Close stops the in-process connections of live commands and of sandbox
// hosts: their commands end, and later ones fail.
func (s *Server) Close() {
	s.liveClient()
	s.liveStop()
}

// ServeHTTP implements http.Handler: a sandbox's host
// ("<port>-<id>.<domain>", host.go), envd traffic (by its E2b-Sandbox-Id
// header) or the control plane.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.serveHost(w, r) {
		return
	}
	if isEnvd(r) {
		s.envd.ServeHTTP(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

type handler func(ctx context.Context, c *warren.Client, w http.ResponseWriter, r *http.Request) error

func (s *Server) routes() {
	s.handle("POST /sandboxes", s.create)
	s.handle("POST /v2/sandboxes", s.create)
	s.handle("GET /sandboxes", s.listV1)
	s.handle("GET /v2/sandboxes", s.list)
	s.handle("GET /sandboxes/{id}", s.get)
	s.handle("DELETE /sandboxes/{id}", s.kill)
	s.handle("POST /sandboxes/{id}/timeout", s.setTimeout)
	s.handle("POST /sandboxes/{id}/pause", s.pause)
	s.handle("POST /sandboxes/{id}/connect", s.connect)
	s.handle("POST /v2/sandboxes/{id}/connect", s.connect)
	s.handle("POST /sandboxes/{id}/resume", s.connect) // the deprecated resume call
	s.handle("GET /sandboxes/{id}/metrics", s.metrics)
	// Any other method on a known path, and any unknown path, still
	// answers E2B's JSON error (the SDKs decode every error body).
	for _, p := range []string{"/sandboxes", "/v2/sandboxes", "/sandboxes/{id}", "/sandboxes/{id}/timeout",
		"/sandboxes/{id}/pause", "/sandboxes/{id}/connect", "/v2/sandboxes/{id}/connect", "/sandboxes/{id}/resume",
		"/sandboxes/{id}/metrics"} {
		s.mux.HandleFunc(p, func(w http.ResponseWriter, r *http.Request) {
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s is not allowed on %s", r.Method, r.URL.Path))
		})
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path))
	})
}

// handle registers h behind authentication and error mapping.
func (s *Server) handle(pattern string, h handler) {
	s.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if rec := recover(); rec != nil {
				s.log.Error("e2b handler panic", "route", pattern, "panic", rec)
				writeError(w, http.StatusInternalServerError, internalError)
			}
		}()
		tok, err := TokenFromKey(r.Header.Get(apiKeyHeader))
		if err != nil {
			writeError(w, http.StatusUnauthorized, err.Error())
			return
		}
		c := warren.New(internalBase, tok, warren.WithHTTPClient(s.hc), warren.WithRetry(1, 0, 0))
		if err := h(r.Context(), c, w, r); err != nil {
			s.writeErr(w, pattern, err)
		}
	})
}

// TokenFromKey turns an E2B API key into the warren token it carries. The
// key is either the token itself ("wrn_…") or E2BKey(token): "e2b_" and the
// token's bytes in hex, the shape the Python SDK insists on
// (^e2b_[0-9a-f]+$).
func TokenFromKey(key string) (string, error) {
	key = strings.TrimSpace(key)
	if key == "" {
		return "", errors.New("missing API key (X-API-KEY header): set E2B_API_KEY to a warren token or its e2b_ form")
	}
	if rest, ok := strings.CutPrefix(key, e2bKeyPrefix); ok {
		b, err := hex.DecodeString(rest)
		if err != nil || len(b) == 0 {
			return "", errors.New("invalid API key: an e2b_ key is e2b_ followed by a warren token in hex")
		}
		return string(b), nil
	}
	return key, nil
}

// E2BKey is the e2b_<hex> form of a warren token, accepted as E2B_API_KEY.
func E2BKey(token string) string { return e2bKeyPrefix + hex.EncodeToString([]byte(token)) }

// httpError is an error with the status E2B's answer carries.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func errorf(status int, format string, a ...any) error {
	return &httpError{status: status, msg: fmt.Sprintf(format, a...)}
}

// writeErr answers err as E2B's error JSON with the native API's status
// (unauthorized 401, not found 404, conflict 409, bad input 400, …).
func (s *Server) writeErr(w http.ResponseWriter, route string, err error) {
	var he *httpError
	var ae *warren.APIError
	switch {
	case errors.As(err, &he):
		writeError(w, he.status, he.msg)
	case errors.As(err, &ae):
		status := ae.Status
		if status == http.StatusUnprocessableEntity {
			status = http.StatusBadRequest // E2B's API answers bad input with 400
		}
		if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
			w.Header().Set("Retry-After", "1")
		}
		writeError(w, status, ae.Message)
	case errors.Is(err, context.Canceled):
		writeError(w, http.StatusBadRequest, "request cancelled")
	case errors.Is(err, context.DeadlineExceeded):
		writeError(w, http.StatusGatewayTimeout, "timed out")
	default:
		s.log.Error("e2b internal error", "route", route, "err", err)
		writeError(w, http.StatusInternalServerError, internalError)
	}
}

// Error is E2B's error body.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, &Error{Code: status, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", contentJSON)
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// decodeBody reads an optional JSON body into v: an empty body (chunked or
// not) leaves v as it is. Unknown fields are ignored, as the SDKs send
// optional fields warren does not use.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return errorf(http.StatusRequestEntityTooLarge, "request body exceeds %d bytes", maxBody)
		}
		return errorf(http.StatusBadRequest, "reading the request body: %v", err)
	}
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errorf(http.StatusBadRequest, "request body is not valid JSON for this call: %v", err)
	}
	return nil
}

// handlerTransport serves requests with an in-process http.Handler: the
// native API, with all its checks, without a network hop. Its answers are
// buffered (the control plane answers are small JSON documents).
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(req *http.Request) (resp *http.Response, err error) {
	if req.Body == nil {
		req.Body = http.NoBody
	}
	req.RemoteAddr = "127.0.0.1:0"
	req.RequestURI = req.URL.RequestURI()
	rec := httptest.NewRecorder()
	defer func() {
		if p := recover(); p != nil { // an aborted answer (http.ErrAbortHandler)
			resp, err = nil, fmt.Errorf("e2b: native API aborted the answer: %v", p)
		}
	}()
	t.h.ServeHTTP(rec, req)
	res := rec.Result()
	res.Request = req
	return res, nil
}
