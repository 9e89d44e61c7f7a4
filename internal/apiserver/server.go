// Package apiserver is warren's stateless HTTP ingress: it authenticates,
// validates, places and forwards. It holds no per-sandbox state: a sandbox
// id names its node, so any replica can route any request over the bus.
package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/placement"
	"github.com/warrenhq/warren/internal/watcher"
)

// Limits on what a client may send.
const (
	MaxJSONBody   = 1 << 20 // JSON request bodies
	MaxFileBody   = 1 << 30 // one uploaded file
	MaxArchive    = 4 << 30 // one uploaded tar archive
	uploadChunk   = 1 << 20 // bytes per bus message for uploads
	singleWrite   = 4 << 20 // uploads up to this size are written in one atomic step
	idempotentTTL = 24 * time.Hour
)

// Config wires an apiserver.
type Config struct {
	Bus     *bus.Conn
	IAM     *iam.IAM
	Watcher *watcher.Watcher
	Logger  *slog.Logger
	// Registry receives the apiserver's metrics; nil = a private one.
	Registry *prometheus.Registry
	// SweepEvery: how often expired trajectories are deleted and storage
	// quotas copied into the account (0 = DefaultSweepEvery).
	SweepEvery time.Duration
}

// Server is the HTTP API.
type Server struct {
	cfg    Config
	log    *slog.Logger
	placer *placement.Placer
	idem   jetstream.KeyValue

	data     *dataplane.Client // streams to edges' data listeners
	trajMeta *bus.Records
	snaps    *bus.Records
	// layerOwners: which project owns each layer name (owner.go).
	layerOwners *bus.Records
	templates   *bus.Records // templates.go
	netRules    *bus.Records // netrules.go
	ports       *bus.Records // public ports (ports.go)
	ff          *ffSessions
	tlog        *bus.TrajLog
	inputs      *bus.Inputs
	storage     *bus.Storage // the projects' stored bytes and quotas (storage.go)
	mux         *http.ServeMux
	// sweepStop ends the sweeper (storage.go); sweepDone closes when it
	// has.
	sweepStop context.CancelFunc
	sweepDone chan struct{}

	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

type route struct {
	pattern string
	handler func(http.ResponseWriter, *http.Request) error
	public  bool
	// role is the least role the route needs: viewer for reads, member by
	// default; project and token routes check more themselves.
	role string
}

func (s *Server) routes() []route {
	return append([]route{
		{pattern: "GET /healthz", handler: s.healthz, public: true},
		{pattern: "POST /v1/sandboxes", handler: s.createSandbox},
		{pattern: "GET /v1/sandboxes", handler: s.listSandboxes, role: api.RoleViewer},
		{pattern: "GET /v1/sandboxes/{id}", handler: s.getSandbox, role: api.RoleViewer},
		{pattern: "DELETE /v1/sandboxes/{id}", handler: s.deleteSandbox},
		{pattern: "POST /v1/sandboxes/{id}/pause", handler: s.pauseSandbox},
		{pattern: "POST /v1/sandboxes/{id}/resume", handler: s.resumeSandbox},
		{pattern: "POST /v1/sandboxes/{id}/timeout", handler: s.setTimeout},
		{pattern: "POST /v1/sandboxes:pause", handler: s.pauseMatching},
		{pattern: "POST /v1/sandboxes:resume", handler: s.resumeMatching},
		{pattern: "POST /v1/sandboxes/{id}/exec", handler: s.exec},
		{pattern: "GET /v1/sandboxes/{id}/pty", handler: s.pty},
		{pattern: "GET /v1/sandboxes/{id}/commands", handler: s.listCommands, role: api.RoleViewer},
		{pattern: "GET /v1/sandboxes/{id}/stats", handler: s.sandboxStats, role: api.RoleViewer},
		{pattern: "GET /v1/sandboxes/{id}/network", handler: s.sandboxNetwork, role: api.RoleViewer},
		{pattern: "PUT /v1/sandboxes/{id}/network", handler: s.setSandboxNetwork},
		{pattern: "GET /v1/sandboxes/{id}/network/denials", handler: s.sandboxNetworkDenials, role: api.RoleViewer},
		{pattern: "GET /v1/sandboxes/{id}/commands/{cid}", handler: s.getCommand, role: api.RoleViewer},
		{pattern: "GET /v1/sandboxes/{id}/audit", handler: s.getAudit, role: api.RoleViewer},
		{pattern: "POST /v1/sandboxes/{id}/commands/{cid}/kill", handler: s.killCommand},
		{pattern: "PUT /v1/sandboxes/{id}/files", handler: s.putFile},
		{pattern: "GET /v1/sandboxes/{id}/files", handler: s.getFile, role: api.RoleViewer},
		{pattern: "DELETE /v1/sandboxes/{id}/files", handler: s.deleteFile},
		{pattern: "POST /v1/sandboxes/{id}/files/mkdir", handler: s.mkdir},
		{pattern: "POST /v1/sandboxes/{id}/files/rename", handler: s.rename},
		{pattern: "PUT /v1/sandboxes/{id}/archive", handler: s.putArchive},
		{pattern: "GET /v1/sandboxes/{id}/archive", handler: s.getArchive, role: api.RoleViewer},
		{pattern: "GET /v1/images", handler: s.listImages, role: api.RoleViewer},
		{pattern: "GET /v1/nodes", handler: s.listNodes, role: api.RoleViewer},
		{pattern: "GET /v1/events", handler: s.listEvents, role: api.RoleViewer},
		{pattern: "POST /v1/sandboxes:batch", handler: s.batchCreate},
		{pattern: "POST /v1/projects", handler: s.createProject, role: api.RoleViewer},
		{pattern: "GET /v1/projects", handler: s.listProjects, role: api.RoleViewer},
		{pattern: "GET /v1/projects/{id}", handler: s.getProject, role: api.RoleViewer},
		{pattern: "PATCH /v1/projects/{id}", handler: s.updateProject, role: api.RoleViewer},
		{pattern: "DELETE /v1/projects/{id}", handler: s.deleteProject, role: api.RoleViewer},
		{pattern: "POST /v1/tokens", handler: s.createToken, role: api.RoleViewer},
		{pattern: "GET /v1/tokens", handler: s.listTokens, role: api.RoleViewer},
		{pattern: "DELETE /v1/tokens/{id}", handler: s.revokeToken, role: api.RoleViewer},
		{pattern: "POST /v1/sandboxes/{id}/snapshots", handler: s.createSnapshot},
		{pattern: "POST /v1/sandboxes/{id}/fork", handler: s.fork},
		{pattern: "GET /v1/snapshots", handler: s.listSnapshots, role: api.RoleViewer},
		{pattern: "GET /v1/snapshots/{sid}", handler: s.getSnapshot, role: api.RoleViewer},
		{pattern: "DELETE /v1/snapshots/{sid}", handler: s.deleteSnapshot},
		{pattern: "GET /v1/trajectories", handler: s.listTrajectories, role: api.RoleViewer},
		{pattern: "GET /v1/trajectories/{name...}", handler: s.getTrajectory, role: api.RoleViewer},
		{pattern: "DELETE /v1/trajectories/{name...}", handler: s.deleteTrajectory},
		{pattern: "POST /v1/trajectories:replay", handler: s.replayTrajectory},
		{pattern: "POST /v1/images", handler: s.pullImage},
		{pattern: "POST /v1/images:commit", handler: s.commitImage},
		{pattern: "POST /v1/images:import", handler: s.importImage},
		{pattern: "POST /v1/layers", handler: s.createLayer},
		{pattern: "GET /v1/layers", handler: s.listLayers, role: api.RoleViewer},
		{pattern: "POST /v1/layers:gc", handler: s.gcLayers},
		{pattern: "GET /v1/layers/{ref...}", handler: s.getLayer, role: api.RoleViewer},
		{pattern: "DELETE /v1/layers/{ref...}", handler: s.deleteLayer},
		{pattern: "POST /v1/fncall", handler: s.fncall},
		{pattern: "POST /v1/pools", handler: s.createPool},
		{pattern: "POST /v1/templates", handler: s.createTemplate},
		{pattern: "GET /v1/templates", handler: s.listTemplates, role: api.RoleViewer},
		{pattern: "GET /v1/templates/{name}", handler: s.getTemplate, role: api.RoleViewer},
		{pattern: "DELETE /v1/templates/{name}", handler: s.deleteTemplate},
		{pattern: "GET /v1/pools", handler: s.listPools, role: api.RoleViewer},
		{pattern: "GET /v1/pools/{name}", handler: s.getPool, role: api.RoleViewer},
		{pattern: "DELETE /v1/pools/{name}", handler: s.deletePool},
		{pattern: "GET /v1/network-rules", handler: s.listNetworkRules, role: api.RoleViewer},
		{pattern: "GET /v1/network-rules/{name}", handler: s.getNetworkRule, role: api.RoleViewer},
		{pattern: "PUT /v1/network-rules/{name}", handler: s.putNetworkRule},
		{pattern: "DELETE /v1/network-rules/{name}", handler: s.deleteNetworkRule},
	}, append(portRoutes(s), displayRoutes(s)...)...)
}

// Routes lists every route pattern ("METHOD /path") the server answers,
// except /metrics. A test checks it against api/openapi.yaml.
func Routes() []string {
	var out []string
	for _, r := range (&Server{}).routes() {
		out = append(out, r.pattern)
	}
	return out
}

// New builds the server.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	idem, err := cfg.Bus.KeyValue(ctx, "warren-idempotency", idempotentTTL)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg: cfg, log: cfg.Logger.With("part", "apiserver"), placer: placement.New(cfg.Watcher), idem: idem,
		mux: http.NewServeMux(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "warren_api_requests_total", Help: "API requests by route and status code.",
		}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "warren_api_request_seconds", Help: "API request latency by route.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"route"}),
	}
	s.ff = newFFSessions()
	key, err := cfg.Bus.DataPlaneKey(ctx)
	if err != nil {
		return nil, err
	}
	s.data = dataplane.NewClient(key)
	if s.trajMeta, err = cfg.Bus.Records(ctx, bus.BucketTrajectories); err != nil {
		return nil, err
	}
	if s.tlog, err = cfg.Bus.TrajectoryLog(ctx); err != nil {
		return nil, err
	}
	if s.snaps, err = cfg.Bus.Records(ctx, bus.BucketSnapshots); err != nil {
		return nil, err
	}
	if s.layerOwners, err = cfg.Bus.Records(ctx, bus.BucketLayerOwners); err != nil {
		return nil, err
	}
	if s.templates, err = cfg.Bus.Records(ctx, bus.BucketTemplates); err != nil {
		return nil, err
	}
	if s.inputs, err = cfg.Bus.TrajectoryInputs(ctx); err != nil {
		return nil, err
	}
	if s.storage, err = cfg.Bus.Storage(ctx); err != nil {
		return nil, err
	}
	if s.netRules, err = cfg.Bus.Records(ctx, bus.BucketNetworkRules); err != nil {
		return nil, err
	}
	if s.ports, err = cfg.Bus.Records(ctx, bus.BucketPorts); err != nil {
		return nil, err
	}
	cfg.Registry.MustRegister(s.requests, s.latency, deniedCollector{s})
	for _, r := range s.routes() {
		s.mux.Handle(r.pattern, s.wrap(r))
	}
	every := cfg.SweepEvery
	if every <= 0 {
		every = DefaultSweepEvery
	}
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.sweepStop, s.sweepDone = stop, make(chan struct{})
	go s.sweep(sctx, every)
	s.mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)})
	})
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) wrap(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			if rec := recover(); rec != nil {
				if rec == http.ErrAbortHandler { // a broken stream (below): the server aborts the answer
					s.requests.WithLabelValues(rt.pattern, "aborted").Inc()
					panic(rec)
				}
				s.log.Error("handler panic", "route", rt.pattern, "panic", rec)
				if sw.code == 0 {
					writeError(sw, &api.Error{Code: api.CodeInternal, Message: "internal error"})
				}
			}
			s.requests.WithLabelValues(rt.pattern, strconv.Itoa(sw.code)).Inc()
			s.latency.WithLabelValues(rt.pattern).Observe(time.Since(start).Seconds())
		}()
		if !rt.public {
			p, err := s.authenticate(r)
			if err != nil {
				writeError(sw, s.toAPIError(err))
				return
			}
			role := rt.role
			if role == "" {
				role = api.RoleMember
			}
			if !p.Can(role) {
				writeError(sw, &api.Error{Code: api.CodeForbidden, Message: fmt.Sprintf("this needs the %s role; your token has %s", role, p.Role)})
				return
			}
			r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
		}
		if err := rt.handler(sw, r); err != nil {
			if sw.code != 0 {
				// The answer had started (a stream): it must not end as if
				// it were whole. Abort it: HTTP/1.1 closes the connection
				// without the last chunk, HTTP/2 resets the stream, and the
				// client sees an error rather than a short 200.
				s.log.Warn("request failed after its answer started; answer aborted", "route", rt.pattern, "err", err)
				panic(http.ErrAbortHandler)
			}
			writeError(sw, s.toAPIError(err))
		}
	})
}

type principalKey struct{}

// principal is the authenticated caller of r.
func principal(r *http.Request) *iam.Principal {
	p, _ := r.Context().Value(principalKey{}).(*iam.Principal)
	if p == nil {
		return &iam.Principal{Role: "none", Project: "\x00"} // reaches nothing
	}
	return p
}

func (s *Server) authenticate(r *http.Request) (*iam.Principal, error) {
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	if !ok || tok == "" {
		return nil, &api.Error{Code: api.CodeUnauthorized, Message: "missing bearer token (Authorization: Bearer <token>)"}
	}
	p, err := s.cfg.IAM.Authenticate(r.Context(), strings.TrimSpace(tok))
	if err != nil {
		if errors.Is(err, iam.ErrUnauthenticated) {
			return nil, &api.Error{Code: api.CodeUnauthorized, Message: "invalid, expired or revoked token"}
		}
		return nil, &api.Error{Code: api.CodeUnavailable, Message: "cannot check the token now"}
	}
	return p, nil
}

func (s *Server) toAPIError(err error) *api.Error {
	var ae *api.Error
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, new(*lostError)):
		return &api.Error{Code: api.CodeConflict, Message: err.Error()}
	case errors.Is(err, dataplane.ErrBroken):
		s.log.Warn("data plane stream broke", "err", err)
		return &api.Error{Code: api.CodeUnavailable, Message: "the stream from the sandbox's node broke"}
	case errors.Is(err, bus.ErrNoResponders):
		return &api.Error{Code: api.CodeUnavailable, Message: "the sandbox's node is not available"}
	case errors.Is(err, context.DeadlineExceeded):
		return &api.Error{Code: api.CodeTimeout, Message: "timed out"}
	case errors.Is(err, context.Canceled):
		return &api.Error{Code: api.CodeBadRequest, Message: "request cancelled"}
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return &api.Error{Code: api.CodeTooLarge, Message: fmt.Sprintf("request body exceeds %d bytes", mbe.Limit)}
	}
	s.log.Error("internal error", "err", err)
	return &api.Error{Code: api.CodeInternal, Message: err.Error()}
}

// StatusOf maps an error code to its HTTP status.
func StatusOf(code string) int { return api.HTTPStatus(code) }

func writeError(w http.ResponseWriter, e *api.Error) {
	status := StatusOf(e.Code)
	if status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, status, api.ErrorBody{Error: *e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal","message":"encode answer"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// writeRawJSON answers with JSON already encoded (an edge's answer).
func writeRawJSON(w http.ResponseWriter, status int, b json.RawMessage) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// decodeJSON reads a bounded JSON body into v, refusing unknown fields and
// trailing data.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	r.Body = http.MaxBytesReader(w, r.Body, MaxJSONBody)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return &api.Error{Code: api.CodeTooLarge, Message: fmt.Sprintf("JSON body exceeds %d bytes", MaxJSONBody)}
		}
		if errors.Is(err, io.EOF) {
			return &api.Error{Code: api.CodeBadRequest, Message: "request body is empty"}
		}
		return &api.Error{Code: api.CodeBadRequest, Message: "malformed JSON: " + err.Error()}
	}
	if dec.More() {
		return &api.Error{Code: api.CodeBadRequest, Message: "malformed JSON: data after the object"}
	}
	return nil
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) error {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	return nil
}

func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) error {
	nodes := s.cfg.Watcher.Nodes()
	if p := principal(r); p.Project != "" {
		for i := range nodes {
			nodes[i] = ownView(p, nodes[i])
		}
	}
	writeJSON(w, http.StatusOK, api.NodeList{Nodes: nodes})
	return nil
}

// ownView is a node as a project-scoped caller sees it: the fleet's
// capacity and load, but only the usage and warm pools of the projects it
// sees, only those projects' network groups, and no job counts (job
// labels of every project are mixed there).
func ownView(p *iam.Principal, n api.Node) api.Node {
	projects := map[string]api.Usage{}
	for id, u := range n.Projects {
		if p.Sees(iam.KindSandbox, id) {
			projects[id] = u
		}
	}
	n.Projects, n.Jobs = projects, nil
	groups := map[string]int{}
	for k, c := range n.NetworkGroups {
		if i := strings.LastIndexByte(k, '/'); i > 0 && p.Sees(iam.KindSandbox, k[:i]) {
			groups[k] = c
		}
	}
	n.NetworkGroups = groups
	pools := []api.NodePool{}
	for _, pl := range n.Pools {
		if (pl.Project == "" && strings.HasPrefix(pl.Name, "fncall:")) || p.Sees(iam.KindPool, pl.Project) {
			pools = append(pools, pl)
		}
	}
	n.Pools = pools
	return n
}

// listEvents answers GET /v1/events?after=SEQ&limit=N&wait=SECONDS, and
// with follow=1 streams them (followEvents).
func (s *Server) listEvents(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	var after uint64
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return &api.Error{Code: api.CodeInvalid, Message: "after must be a sequence number"}
		}
		after = n
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 10000 {
			return &api.Error{Code: api.CodeInvalid, Message: "limit must be between 1 and 10000"}
		}
		limit = n
	}
	follow := false
	switch q.Get("follow") {
	case "", "0", "false":
	case "1", "true":
		follow = true
	default:
		return &api.Error{Code: api.CodeInvalid, Message: "follow must be 1 or 0"}
	}
	if follow {
		if q.Get("limit") == "" {
			limit = 0 // until the client goes away
		}
		return s.followEvents(w, r, after, limit)
	}
	wait := 100 * time.Millisecond
	if v := q.Get("wait"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 60 {
			return &api.Error{Code: api.CodeInvalid, Message: "wait must be between 0 and 60 seconds"}
		}
		if f > 0 {
			wait = time.Duration(f * float64(time.Second))
		}
	}
	evs := s.cfg.Watcher.Events()
	if evs == nil {
		return &api.Error{Code: api.CodeUnavailable, Message: "no event stream"}
	}
	list, err := evs.Read(r.Context(), after, limit, wait)
	if err != nil {
		return err
	}
	out := api.EventList{Events: []api.Event{}, Next: after}
	for _, ev := range list {
		if ev.Seq > out.Next {
			out.Next = ev.Seq
		}
		if visibleEvent(r, &ev) {
			out.Events = append(out.Events, ev)
		}
	}
	writeJSON(w, http.StatusOK, &out)
	return nil
}

// eventKeepalive is how often a followed stream with nothing to say sends
// an empty line, so that proxies and clients see the connection alive.
var eventKeepalive = 15 * time.Second

// followEvents streams the events after seq after as NDJSON, one event per
// line as it is appended to the stream, until the client goes away (or
// after limit visible events, when limit > 0). Empty lines are keepalives.
// A client resumes from the seq of the last event it saw.
func (s *Server) followEvents(w http.ResponseWriter, r *http.Request, after uint64, limit int) error {
	evs := s.cfg.Watcher.Events()
	if evs == nil {
		return &api.Error{Code: api.CodeUnavailable, Message: "no event stream"}
	}
	fl, _ := w.(http.Flusher)
	h := w.Header()
	h.Set("Content-Type", "application/x-ndjson")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if fl != nil {
		fl.Flush()
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	sent := 0
	errDone := errors.New("limit reached")
	err := evs.Follow(ctx, after, eventKeepalive, func() error {
		if _, err := w.Write([]byte("\n")); err != nil {
			return err
		}
		if fl != nil {
			fl.Flush()
		}
		return nil
	}, func(ev api.Event) error {
		if !visibleEvent(r, &ev) {
			return nil
		}
		b, err := json.Marshal(&ev)
		if err != nil {
			return err
		}
		if _, err := w.Write(append(b, '\n')); err != nil {
			return err
		}
		if fl != nil {
			fl.Flush()
		}
		if sent++; limit > 0 && sent >= limit {
			return errDone
		}
		return nil
	})
	if err == nil || errors.Is(err, errDone) || r.Context().Err() != nil {
		return nil
	}
	return err
}

// visibleEvent reports whether the caller may see ev: node events are
// public to every caller, sandbox events to the sandbox's project scope.
func visibleEvent(r *http.Request, ev *api.Event) bool {
	if ev.Sandbox == "" {
		return true
	}
	return principal(r).Sees(iam.KindEvent, ev.Project)
}
