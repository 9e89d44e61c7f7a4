package e2b

import (
	"cmp"
	"context"
	"encoding/base64"
	"errors"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// NewSandbox is the body of POST /sandboxes and /v2/sandboxes. Fields the
// SDKs send that warren does not use (allow_internet_access, mcp,
// volumeMounts, …) are ignored; of network, allowPublicTraffic. secure is
// ignored too, in the safe direction: every sandbox gets its own envd
// access token (signed.go), as a secure one does at E2B.
type NewSandbox struct {
	TemplateID string            `json:"templateID"`
	Timeout    *int64            `json:"timeout,omitempty"` // seconds
	Metadata   map[string]string `json:"metadata,omitempty"`
	EnvVars    map[string]string `json:"envVars,omitempty"`
	AutoPause  bool              `json:"autoPause,omitempty"`
	Network    *Network          `json:"network,omitempty"`
}

// Network is the part of E2B's network config warren serves:
// allowPublicTraffic false makes the sandbox's ports (host.go) need its
// trafficAccessToken.
type Network struct {
	AllowPublicTraffic *bool `json:"allowPublicTraffic,omitempty"`
}

// Sandbox is E2B's answer to create and connect.
type Sandbox struct {
	TemplateID  string  `json:"templateID"`
	SandboxID   string  `json:"sandboxID"`
	ClientID    string  `json:"clientID"`
	EnvdVersion string  `json:"envdVersion"`
	Alias       string  `json:"alias,omitempty"`
	Domain      *string `json:"domain"`
	// EnvdAccessToken is the sandbox's own access token (signed.go): the
	// SDK sends it as X-Access-Token with every envd request, which runs
	// as the key that created or connected the sandbox.
	EnvdAccessToken string `json:"envdAccessToken,omitempty"`
	// TrafficAccessToken (the sandbox's own too, of another kind) is
	// answered for a sandbox whose ports are not public: requests to its
	// host carry it in e2b-traffic-access-token.
	TrafficAccessToken string `json:"trafficAccessToken,omitempty"`
}

// SandboxDetail is E2B's answer to GET /sandboxes/{id} and one element of
// the list (ListedSandbox has the same fields minus domain).
type SandboxDetail struct {
	TemplateID  string            `json:"templateID"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	Alias       string            `json:"alias,omitempty"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	EnvdVersion string            `json:"envdVersion"`
	CPUCount    int64             `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	State       string            `json:"state"` // running or paused
	Metadata    map[string]string `json:"metadata"`
}

// Metric is one element of GET /sandboxes/{id}/metrics.
type Metric struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int64     `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// timeoutBody is the body of /timeout and /connect.
type timeoutBody struct {
	Timeout *int64 `json:"timeout,omitempty"`
}

func checkTimeout(t *int64) (int64, error) {
	if t == nil {
		return DefaultTimeout, nil
	}
	if *t <= 0 || *t > MaxTimeout {
		return 0, errorf(http.StatusBadRequest, "timeout must be between 1 and %d seconds, got %d", MaxTimeout, *t)
	}
	return *t, nil
}

func (s *Server) create(ctx context.Context, c *warren.Client, w http.ResponseWriter, r *http.Request) error {
	var req NewSandbox
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	if req.TemplateID == "" {
		return errorf(http.StatusBadRequest, "templateID is required (a warren image name)")
	}
	spec, err := specOf(ctx, c, req)
	if err != nil {
		return err
	}
	sb, err := c.Create(ctx, spec)
	if err != nil {
		var ae *warren.APIError
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound && !spec.Resume {
			return errorf(http.StatusNotFound, "template %q not found: %s", req.TemplateID, ae.Message)
		}
		return err
	}
	s.keys.remember(sb.ID, r.Header.Get(apiKeyHeader))
	out := s.toSandbox(sb)
	if req.Network != nil && req.Network.AllowPublicTraffic != nil && !*req.Network.AllowPublicTraffic {
		s.keys.setPrivate(sb.ID)
		out.TrafficAccessToken = s.keys.token(trafficTokenPrefix, sb.ID)
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// specOf is the native create of an E2B create: the template's spec with
// E2B's timeout, autoPause, metadata and envVars on top. Metadata
// TrajectoryMetadata makes the sandbox record into that warren
// trajectory; ResumeMetadata "true" beside it re-attaches to the
// trajectory instead (warren's resume: the harness's operations
// fast-forward, docs/api.md "Resume and fast-forward"), which takes
// nothing else of the create.
func specOf(ctx context.Context, c *warren.Client, req NewSandbox) (api.CreateSandboxRequest, error) {
	traj, hasTraj := req.Metadata[TrajectoryMetadata]
	if v, ok := req.Metadata[ResumeMetadata]; ok {
		if !hasTraj || (v != "true" && v != "false") {
			return api.CreateSandboxRequest{}, errorf(http.StatusBadRequest, "metadata %s is \"true\" or \"false\", beside %s naming the trajectory", ResumeMetadata, TrajectoryMetadata)
		}
		if v == "true" {
			return api.CreateSandboxRequest{Trajectory: traj, Resume: true}, nil
		}
		req.Metadata = without(req.Metadata, ResumeMetadata)
	}
	ttl, err := checkTimeout(req.Timeout)
	if err != nil {
		return api.CreateSandboxRequest{}, err
	}
	spec, err := specFor(ctx, c, req.TemplateID)
	if err != nil {
		return api.CreateSandboxRequest{}, err
	}
	spec.TTL = ttl
	if req.AutoPause {
		// On timeout E2B pauses instead of killing: warren's idle timeout
		// with the pause action, and the longest lifetime.
		spec.TTL, spec.IdleTimeout, spec.IdleTimeoutAction = AutoPauseTTL, ttl, api.IdleActionPause
	}
	if hasTraj {
		spec.Trajectory = traj
		req.Metadata = without(req.Metadata, TrajectoryMetadata)
	}
	spec.Labels = merge(spec.Labels, req.Metadata)
	if spec.Image != req.TemplateID {
		spec.Labels = merge(spec.Labels, map[string]string{TemplateLabel: req.TemplateID})
	}
	spec.Env = merge(spec.Env, req.EnvVars)
	return spec, nil
}

// specFor is the sandbox spec of a templateID: the named template's
// (warren template create), else the image of that name.
func specFor(ctx context.Context, c *warren.Client, templateID string) (api.CreateSandboxRequest, error) {
	t, err := c.GetTemplate(ctx, templateID)
	if err == nil {
		return t.Spec, nil
	}
	if warren.IsNotFound(err) {
		return api.CreateSandboxRequest{Image: templateID}, nil
	}
	return api.CreateSandboxRequest{}, err
}

// merge is base with over's entries on top (nil when both are empty).
func merge(base, over map[string]string) map[string]string {
	if len(base) == 0 && len(over) == 0 {
		return nil
	}
	out := make(map[string]string, len(base)+len(over))
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		out[k] = v
	}
	return out
}

// without is m without key (a copy).
func without(m map[string]string, key string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		if k != key {
			out[k] = v
		}
	}
	return out
}

// TrajectoryMetadata is the metadata key of an E2B create that names the
// warren trajectory the sandbox records into; it is shown in the
// sandbox's metadata, not stored as a label.
const TrajectoryMetadata = "warren/trajectory"

// ResumeMetadata "true", beside TrajectoryMetadata, re-attaches to the
// trajectory (warren's resume: true) instead of starting it.
const ResumeMetadata = "warren/resume"

// TemplateLabel records the template a sandbox was made from, when that
// is not simply its image; it is not shown in E2B's metadata.
const TemplateLabel = "e2b/template"

func templateOf(sb *api.Sandbox) string {
	if t := sb.Labels[TemplateLabel]; t != "" {
		return t
	}
	return sb.Image
}

func (s *Server) toSandbox(sb *api.Sandbox) *Sandbox {
	t := templateOf(sb)
	return &Sandbox{TemplateID: t, SandboxID: sb.ID, ClientID: ClientID, EnvdVersion: EnvdVersion, Alias: t, EnvdAccessToken: s.keys.token(envdTokenPrefix, sb.ID)}
}

// AutoPauseTTL is the lifetime of an autoPause sandbox (30 days, as long
// as E2B keeps paused sandboxes): its timeout pauses it instead.
const AutoPauseTTL = 30 * 24 * 60 * 60

// autoPaused reports whether the sandbox's timeout pauses it (autoPause):
// its idle timeout with the pause action.
func autoPaused(sb *api.Sandbox) bool {
	return sb.IdleAction == api.IdleActionPause && sb.IdleTimeout > 0
}

// applyTimeout is E2B's timeout, counted from now: the idle timeout of an
// autoPause sandbox, else its expiry.
func applyTimeout(ctx context.Context, c *warren.Client, sb *api.Sandbox, ttl int64) (*api.Sandbox, error) {
	if autoPaused(sb) {
		return c.SetTimeouts(ctx, sb.ID, api.TimeoutRequest{IdleTimeout: &ttl})
	}
	return c.SetTimeout(ctx, sb.ID, ttl)
}

// e2bState is the E2B state of a warren sandbox, "" for one E2B no longer
// knows (stopped, failed, lost).
func e2bState(state string) string {
	switch state {
	case api.StateRunning, api.StateCreating:
		return "running"
	case api.StatePaused:
		return "paused"
	}
	return ""
}

func toDetail(sb *api.Sandbox) SandboxDetail {
	end := sb.CreatedAt.Add(time.Duration(sb.TTL) * time.Second)
	switch {
	case autoPaused(sb) && !sb.LastActive.IsZero():
		end = sb.LastActive.Add(time.Duration(sb.IdleTimeout) * time.Second) // when it pauses
	case sb.ExpiresAt != nil:
		end = *sb.ExpiresAt
	}
	md := without(sb.Labels, TemplateLabel)
	if sb.Trajectory != "" {
		md[TrajectoryMetadata] = sb.Trajectory
	}
	t := templateOf(sb)
	return SandboxDetail{
		TemplateID: t, SandboxID: sb.ID, ClientID: ClientID, Alias: t,
		StartedAt: sb.CreatedAt.UTC(), EndAt: end.UTC(), EnvdVersion: EnvdVersion,
		CPUCount: cpuCount(sb.CPU), MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskMB,
		State: e2bState(sb.State), Metadata: md,
	}
}

// cpuCount is E2B's integer CPU count for warren's fractional cores.
func cpuCount(cpu float64) int64 { return max(1, int64(math.Ceil(cpu))) }

// live returns the sandbox if E2B would still know it (running or
// paused); any other state is E2B's 404.
func live(ctx context.Context, c *warren.Client, id string) (*api.Sandbox, error) {
	sb, err := c.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if e2bState(sb.State) == "" {
		return nil, errorf(http.StatusNotFound, "sandbox %q not found (it is %s)", id, sb.State)
	}
	return sb, nil
}

func (s *Server) get(ctx context.Context, c *warren.Client, w http.ResponseWriter, r *http.Request) error {
	sb, err := live(ctx, c, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toDetail(sb))
	return nil
}

func (s *Server) kill(ctx context.Context, c *warren.Client, w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if _, err := live(ctx, c, id); err != nil {
		return err
	}
	if _, err := c.Delete(ctx, id); err != nil {
		return err
	}
	s.keys.forget(id)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) setTimeout(ctx context.Context, c *warren.Client, w http.ResponseWriter, r *http.Request) error {
	var req timeoutBody
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	if req.Timeout == nil {
		return errorf(http.StatusBadRequest, "timeout (seconds) is required")
	}
	ttl, err := checkTimeout(req.Timeout)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	sb, err := live(ctx, c, id)
	if err != nil {
		return err
	}
	if _, err := applyTimeout(ctx, c, sb, ttl); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) pause(ctx context.Context, c *warren.Client, w http.ResponseWriter, r *http.Request) error {
	var req struct{}
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	id := r.PathValue("id")
	sb, err := live(ctx, c, id)
	if err != nil {
		return err
	}
	if sb.State == api.StatePaused {
		return errorf(http.StatusConflict, "sandbox %q is already paused", id)
	}
	if _, err := c.Pause(ctx, id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// connect answers 200 for a running sandbox and 201 after resuming a
// paused one; a timeout in the body resets its lifetime from now.
func (s *Server) connect(ctx context.Context, c *warren.Client, w http.ResponseWriter, r *http.Request) error {
	var req timeoutBody
	if err := decodeBody(w, r, &req); err != nil {
		return err
	}
	id := r.PathValue("id")
	sb, err := live(ctx, c, id)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if sb.State == api.StatePaused {
		if sb, err = c.Resume(ctx, id); err != nil {
			return err
		}
		status = http.StatusCreated
	}
	if req.Timeout != nil {
		ttl, err := checkTimeout(req.Timeout)
		if err != nil {
			return err
		}
		if sb, err = applyTimeout(ctx, c, sb, ttl); err != nil {
			return err
		}
	}
	s.keys.remember(sb.ID, r.Header.Get(apiKeyHeader))
	out := s.toSandbox(sb)
	if s.keys.isPrivate(sb.ID) {
		out.TrafficAccessToken = s.keys.token(trafficTokenPrefix, sb.ID)
	}
	writeJSON(w, status, out)
	return nil
}

func (s *Server) metrics(ctx context.Context, c *warren.Client, w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	sb, err := live(ctx, c, id)
	if err != nil {
		return err
	}
	st, err := c.Stats(ctx, id)
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	// warren samples on demand: one point, whose CPU share is the average
	// since the sandbox started.
	pct := 0.0
	if el := now.Sub(sb.CreatedAt).Seconds(); el > 0 && sb.CPU > 0 {
		pct = min(100, 100*st.CPUSeconds/el/sb.CPU)
	}
	writeJSON(w, http.StatusOK, []Metric{{
		Timestamp: now, TimestampUnix: now.Unix(), CPUCount: cpuCount(sb.CPU), CPUUsedPct: pct,
		MemUsed: st.MemoryBytes, MemTotal: sb.MemoryMB << 20, DiskTotal: sb.DiskMB << 20,
	}})
	return nil
}

// listV1 is the old GET /sandboxes: every running sandbox, one page.
func (s *Server) listV1(ctx context.Context, c *warren.Client, w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	q.Set("state", "running")
	q.Set("limit", strconv.Itoa(maxListLimit))
	return s.listWith(ctx, c, w, q)
}

func (s *Server) list(ctx context.Context, c *warren.Client, w http.ResponseWriter, r *http.Request) error {
	return s.listWith(ctx, c, w, r.URL.Query())
}

// listWith answers GET /v2/sandboxes: filters state (comma-joined),
// metadata (url-encoded k=v&k2=v2) and limit; ordered by start time then
// id (order=asc, the default, or desc); X-Next-Token names the last
// sandbox of the page, so creations and deletions between pages neither
// repeat nor skip the others.
func (s *Server) listWith(ctx context.Context, c *warren.Client, w http.ResponseWriter, q url.Values) error {
	lq, err := parseListQuery(q)
	if err != nil {
		return err
	}
	all, err := c.List(ctx, warren.ListOptions{Labels: lq.labels})
	if err != nil {
		return err
	}
	tmpl := q.Get("template")
	var keep []api.Sandbox
	for _, sb := range all {
		st := e2bState(sb.State)
		if st == "" || !lq.states[st] || (tmpl != "" && templateOf(&sb) != tmpl) || sb.CreatedAt.Before(lq.startedAfter) {
			continue
		}
		keep = append(keep, sb)
	}
	slices.SortFunc(keep, func(a, b api.Sandbox) int {
		c := cmpKey(keyOf(&a), keyOf(&b))
		if lq.desc {
			return -c
		}
		return c
	})
	out := make([]SandboxDetail, 0, min(lq.limit, len(keep)))
	var last *api.Sandbox
	more := false
	for i := range keep {
		if lq.after != nil {
			c := cmpKey(keyOf(&keep[i]), *lq.after)
			if (!lq.desc && c <= 0) || (lq.desc && c >= 0) {
				continue
			}
		}
		if len(out) == lq.limit {
			more = true
			break
		}
		out = append(out, toDetail(&keep[i]))
		last = &keep[i]
	}
	if more && last != nil {
		w.Header().Set(nextTokenHdr, keyOf(last).String())
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listQuery is a list's filters and page, as listWith's query gives them.
type listQuery struct {
	states       map[string]bool   // E2B states to keep
	labels       map[string]string // metadata every sandbox must have
	limit        int
	desc         bool
	after        *pageKey // the last sandbox of the previous page, or nil
	startedAfter time.Time
}

// parseListQuery checks and parses listWith's query parameters (all but
// template, which needs no check), with their defaults: running and paused
// sandboxes, defaultLimit of them, in ascending order from the first.
func parseListQuery(q url.Values) (listQuery, error) {
	lq := listQuery{states: map[string]bool{"running": true, "paused": true}, labels: map[string]string{}, limit: defaultLimit}
	if v := q.Get("state"); v != "" {
		lq.states = map[string]bool{}
		for _, st := range strings.Split(v, ",") {
			if st != "running" && st != "paused" {
				return listQuery{}, errorf(http.StatusBadRequest, "state %q is not running or paused", st)
			}
			lq.states[st] = true
		}
	}
	if v := q.Get("metadata"); v != "" {
		md, err := url.ParseQuery(v)
		if err != nil {
			return listQuery{}, errorf(http.StatusBadRequest, "metadata %q is not k=v&k2=v2: %v", v, err)
		}
		for k, vs := range md {
			lq.labels[k] = vs[len(vs)-1]
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxListLimit {
			return listQuery{}, errorf(http.StatusBadRequest, "limit must be between 1 and %d, got %q", maxListLimit, v)
		}
		lq.limit = n
	}
	switch q.Get("order") {
	case "", "asc":
	case "desc":
		lq.desc = true
	default:
		return listQuery{}, errorf(http.StatusBadRequest, "order must be asc or desc, got %q", q.Get("order"))
	}
	if v := q.Get("nextToken"); v != "" {
		k, err := parsePageKey(v)
		if err != nil {
			return listQuery{}, err
		}
		lq.after = &k
	}
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return listQuery{}, errorf(http.StatusBadRequest, "startedAfter %q is not an RFC 3339 time", v)
		}
		lq.startedAfter = t
	}
	return lq, nil
}

// pageKey orders the list: start time, then id.
type pageKey struct {
	at int64 // unix nanoseconds
	id string
}

func keyOf(sb *api.Sandbox) pageKey { return pageKey{at: sb.CreatedAt.UnixNano(), id: sb.ID} }

func cmpKey(a, b pageKey) int {
	if c := cmp.Compare(a.at, b.at); c != 0 {
		return c
	}
	return cmp.Compare(a.id, b.id)
}

func (k pageKey) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(k.at, 10) + "/" + k.id))
}

func parsePageKey(s string) (pageKey, error) {
	bad := errorf(http.StatusBadRequest, "nextToken %q is not a token this server gave", s)
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return pageKey{}, bad
	}
	at, id, ok := strings.Cut(string(b), "/")
	n, err := strconv.ParseInt(at, 10, 64)
	if !ok || err != nil || id == "" {
		return pageKey{}, bad
	}
	return pageKey{at: n, id: id}, nil
}
