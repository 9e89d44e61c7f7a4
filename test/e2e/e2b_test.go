package e2e

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// e2bClient speaks E2B's control-plane wire as the official JS SDK 2.51
// does (../shared/reference/e2b.md §1, §2): X-API-KEY, its User-Agent and
// informational headers, JSON bodies sent chunked.
type e2bClient struct {
	base string
	key  string
}

type e2bAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (a *e2bAnswer) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(a.body, v); err != nil {
		t.Fatalf("answer %d is not the expected JSON: %v: %s", a.status, err, a.body)
	}
}

func (c *e2bClient) do(t *testing.T, method, path, body string) *e2bAnswer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		// No length: undici sends request bodies chunked.
		rd = io.NopCloser(strings.NewReader(body))
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if c.key != "" {
		req.Header.Set("X-API-KEY", c.key)
	}
	req.Header.Set("User-Agent", "e2b-js-sdk/2.51.0")
	for k, v := range map[string]string{"lang": "js", "lang_version": "v22", "package_version": "2.51.0", "publisher": "e2b", "sdk_runtime": "node", "system": "Linux"} {
		req.Header.Set(k, v)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return &e2bAnswer{status: resp.StatusCode, header: resp.Header, body: b}
}

// wantStatus checks the status, and for an error that the body is E2B's
// {"code":<status>,"message":"..."} with Content-Type application/json.
func (a *e2bAnswer) wantStatus(t *testing.T, what string, status int) {
	t.Helper()
	if a.status != status {
		t.Fatalf("%s: status %d, want %d: %s", what, a.status, status, a.body)
	}
	if status < 400 {
		return
	}
	if ct := a.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("%s: error Content-Type %q, want application/json", what, ct)
	}
	var e struct {
		Code    *int    `json:"code"`
		Message *string `json:"message"`
	}
	a.decode(t, &e)
	if e.Code == nil || *e.Code != status || e.Message == nil || *e.Message == "" {
		t.Fatalf("%s: error body %s is not {\"code\":%d,\"message\":...}", what, a.body, status)
	}
}

// e2bSandbox has the fields the SDKs require of create/connect answers.
type e2bSandbox struct {
	TemplateID  *string `json:"templateID"`
	SandboxID   *string `json:"sandboxID"`
	ClientID    *string `json:"clientID"`
	EnvdVersion *string `json:"envdVersion"`
}

func (s *e2bSandbox) check(t *testing.T, template string) string {
	t.Helper()
	if s.TemplateID == nil || *s.TemplateID != template || s.SandboxID == nil || *s.SandboxID == "" || s.ClientID == nil || s.EnvdVersion == nil || *s.EnvdVersion != "0.5.7" {
		b, _ := json.Marshal(s)
		t.Fatalf("sandbox answer lacks a required field: %s", b)
	}
	return *s.SandboxID
}

// e2bDetail has the fields Python's SandboxDetail/ListedSandbox require.
type e2bDetail struct {
	TemplateID  string            `json:"templateID"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    *string           `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	EnvdVersion string            `json:"envdVersion"`
	CPUCount    *int              `json:"cpuCount"`
	MemoryMB    *int              `json:"memoryMB"`
	DiskSizeMB  *int              `json:"diskSizeMB"`
	State       string            `json:"state"`
	Metadata    map[string]string `json:"metadata"`
}

func (d *e2bDetail) check(t *testing.T) {
	t.Helper()
	if d.ClientID == nil || d.CPUCount == nil || d.MemoryMB == nil || d.DiskSizeMB == nil || d.StartedAt.IsZero() || d.EndAt.IsZero() || d.EnvdVersion == "" || d.TemplateID == "" {
		t.Fatalf("sandbox detail lacks a required field: %+v", d)
	}
	if d.State != "running" && d.State != "paused" {
		t.Fatalf("state %q is not running or paused", d.State)
	}
}

func (c *e2bClient) detail(t *testing.T, id string) e2bDetail {
	t.Helper()
	a := c.do(t, "GET", "/sandboxes/"+id, "")
	a.wantStatus(t, "get "+id, 200)
	var d e2bDetail
	a.decode(t, &d)
	d.check(t)
	return d
}

// listAll follows X-Next-Token from query q and returns the ids of every page.
func (c *e2bClient) listAll(t *testing.T, q string) (ids []string, pages int) {
	t.Helper()
	next := ""
	for {
		path := "/v2/sandboxes?" + q
		if next != "" {
			path += "&nextToken=" + next
		}
		a := c.do(t, "GET", path, "")
		a.wantStatus(t, "list "+path, 200)
		var page []e2bDetail
		a.decode(t, &page)
		for i := range page {
			page[i].check(t)
			ids = append(ids, page[i].SandboxID)
		}
		pages++
		if next = a.header.Get("X-Next-Token"); next == "" {
			return ids, pages
		}
		if pages > 10 {
			t.Fatalf("list does not end: %v", ids)
		}
	}
}

func has(ids []string, id string) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// TestE2BControlPlane drives `warren serve --e2b-listen` with the requests
// and checks the answers of the official E2B SDKs, byte for byte as
// e2b.md records them: create (v2 and v1 paths), get, list with filters
// and paging, setTimeout, pause and connect (resume), metrics, kill, the
// error shapes, and that another project's key neither sees nor kills the
// sandbox.
func TestE2BControlPlane(t *testing.T) {
	parallel(t)
	e2bAddr := freePort(t)
	s := startServer(t, "--e2b-listen", e2bAddr)
	ctx := context.Background()
	base := "http://" + e2bAddr
	// warren serve prints what an E2B user exports.
	for _, want := range []string{"export E2B_API_URL=" + base + "\n", "export E2B_SANDBOX_URL=" + base + "\n", "export E2B_API_KEY=e2b_" + hex.EncodeToString([]byte(s.Token)) + "\n"} {
		for deadline := time.Now().Add(10 * time.Second); !strings.Contains(s.logs.String(), want); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("warren serve did not print %q:\n%s", want, tail(s.logs.String(), 20))
			}
		}
	}
	for _, p := range []string{"ea", "eb"} {
		if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: p}); err != nil {
			t.Fatal(err)
		}
	}
	tok := func(project string) string {
		tk, err := s.C.CreateToken(ctx, api.CreateTokenRequest{Principal: "e2b-" + project, Project: project, Role: api.RoleMember})
		if err != nil {
			t.Fatal(err)
		}
		return tk.Secret
	}
	tokA := tok("ea")
	// The Python SDK insists on ^e2b_[0-9a-f]+$: the token in hex, as
	// `warren token create --e2b` prints it.
	a := &e2bClient{base: base, key: "e2b_" + hex.EncodeToString([]byte(tokA))}
	keyB := strings.TrimSpace(s.cliOK(t, "token", "create", "e2b-eb", "--project", "eb", "--e2b"))
	if !regexp.MustCompile(`^e2b_[0-9a-f]+$`).MatchString(keyB) {
		t.Fatalf("token create --e2b printed %q", keyB)
	}
	b := &e2bClient{base: base, key: keyB}
	aRaw := &e2bClient{base: base, key: tokA} // JS accepts any key: the token itself
	cleanup := func(id string) { t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), id) }) }

	// Create, as JS 2.51 sends it.
	ans := a.do(t, "POST", "/v2/sandboxes", `{"templateID":"busybox","timeout":120,"metadata":{"owner":"test"},"envVars":{"FOO":"bar"}}`)
	ans.wantStatus(t, "create v2", 201)
	if ct := ans.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("create Content-Type %q", ct)
	}
	var created e2bSandbox
	ans.decode(t, &created)
	id1 := created.check(t, "busybox")
	cleanup(id1)
	// The sandbox is warren's own, in the key's project, with envVars and metadata.
	native := warren.New(s.URL, tokA)
	nsb, err := native.Get(ctx, id1)
	if err != nil {
		t.Fatal(err)
	}
	if nsb.Project != "ea" || nsb.Labels["owner"] != "test" || nsb.State != api.StateRunning {
		t.Fatalf("native view of the E2B sandbox: %+v", nsb)
	}
	res, err := native.Exec(ctx, id1, api.ExecRequest{Cmd: "echo $FOO"})
	if err != nil || strings.TrimSpace(res.Stdout) != "bar" {
		t.Fatalf("envVars did not reach the sandbox: %+v %v", res, err)
	}

	// Create, as Python 2.45 sends it (old path, every field), with the raw token as key.
	ans = aRaw.do(t, "POST", "/sandboxes", `{"templateID":"busybox","timeout":300,"secure":true,"allow_internet_access":true,"metadata":{},"envVars":{}}`)
	ans.wantStatus(t, "create v1", 201)
	var created2 e2bSandbox
	ans.decode(t, &created2)
	id2 := created2.check(t, "busybox")
	cleanup(id2)

	// Get.
	d := a.detail(t, id1)
	if d.SandboxID != id1 || d.State != "running" || d.Metadata["owner"] != "test" || d.TemplateID != "busybox" {
		t.Fatalf("get: %+v", d)
	}
	if life := d.EndAt.Sub(d.StartedAt); life < 119*time.Second || life > 121*time.Second {
		t.Fatalf("timeout 120 gave a lifetime of %v", life)
	}

	// List: paging by one follows X-Next-Token through both; filters.
	ids, pages := a.listAll(t, "limit=1")
	if len(ids) != 2 || !has(ids, id1) || !has(ids, id2) || pages != 2 {
		t.Fatalf("paged list: %v in %d pages, want %s and %s in 2", ids, pages, id1, id2)
	}
	if ids, _ := a.listAll(t, "metadata=owner%3Dtest&state=running,paused"); len(ids) != 1 || ids[0] != id1 {
		t.Fatalf("metadata filter: %v", ids)
	}
	if ids, _ := a.listAll(t, "state=paused"); len(ids) != 0 {
		t.Fatalf("state=paused before any pause: %v", ids)
	}
	a.do(t, "GET", "/v2/sandboxes?nextToken=garbage!", "").wantStatus(t, "bad nextToken", 400)

	// setTimeout: the sandbox now ends 600 s from now.
	a.do(t, "POST", "/sandboxes/"+id1+"/timeout", `{"timeout":600}`).wantStatus(t, "timeout", 204)
	d = a.detail(t, id1)
	if until := time.Until(d.EndAt); until < 590*time.Second || until > 601*time.Second {
		t.Fatalf("after setTimeout(600) the sandbox ends in %v", until)
	}
	a.do(t, "POST", "/sandboxes/"+id1+"/timeout", `{"timeout":-1}`).wantStatus(t, "negative timeout", 400)

	// Another project's key sees nothing and kills nothing: 404 everywhere.
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/sandboxes/" + id1, ""},
		{"DELETE", "/sandboxes/" + id1, ""},
		{"POST", "/sandboxes/" + id1 + "/timeout", `{"timeout":1}`},
		{"POST", "/sandboxes/" + id1 + "/pause", `{}`},
		{"POST", "/v2/sandboxes/" + id1 + "/connect", `{}`},
		{"POST", "/sandboxes/" + id1 + "/connect", `{"timeout":1}`},
		{"GET", "/sandboxes/" + id1 + "/metrics", ""},
	} {
		b.do(t, r.method, r.path, r.body).wantStatus(t, "other project: "+r.method+" "+r.path, 404)
	}
	if ids, _ := b.listAll(t, ""); len(ids) != 0 {
		t.Fatalf("another project lists %v", ids)
	}
	if d = a.detail(t, id1); d.State != "running" || time.Until(d.EndAt) < 500*time.Second {
		t.Fatalf("another project's calls changed the sandbox: %+v", d)
	}

	// Pause; pausing again is 409; connect resumes (201), then 200.
	a.do(t, "POST", "/sandboxes/"+id1+"/pause", `{}`).wantStatus(t, "pause", 204)
	if d = a.detail(t, id1); d.State != "paused" {
		t.Fatalf("after pause the state is %q", d.State)
	}
	a.do(t, "POST", "/sandboxes/"+id1+"/pause", `{"memory":false}`).wantStatus(t, "pause twice", 409)
	if ids, _ := a.listAll(t, "state=paused"); len(ids) != 1 || ids[0] != id1 {
		t.Fatalf("state=paused: %v", ids)
	}
	ans = a.do(t, "POST", "/v2/sandboxes/"+id1+"/connect", `{}`)
	ans.wantStatus(t, "connect (resume)", 201)
	var conn e2bSandbox
	ans.decode(t, &conn)
	if conn.check(t, "busybox") != id1 {
		t.Fatalf("connect answered another sandbox")
	}
	if d = a.detail(t, id1); d.State != "running" {
		t.Fatalf("after connect the state is %q", d.State)
	}
	if res, err := native.Exec(ctx, id1, api.ExecRequest{Cmd: "echo alive"}); err != nil || strings.TrimSpace(res.Stdout) != "alive" {
		t.Fatalf("resumed sandbox: %+v %v", res, err)
	}
	a.do(t, "POST", "/sandboxes/"+id1+"/connect", `{"timeout":300}`).wantStatus(t, "connect (running)", 200)
	if until := time.Until(a.detail(t, id1).EndAt); until > 301*time.Second || until < 290*time.Second {
		t.Fatalf("connect with timeout 300: ends in %v", until)
	}

	// Metrics: one sample with every field Python requires.
	ans = a.do(t, "GET", "/sandboxes/"+id1+"/metrics", "")
	ans.wantStatus(t, "metrics", 200)
	var ms []map[string]any
	ans.decode(t, &ms)
	if len(ms) != 1 {
		t.Fatalf("metrics: %s", ans.body)
	}
	for _, f := range []string{"timestamp", "timestampUnix", "cpuCount", "cpuUsedPct", "memUsed", "memTotal", "memCache", "diskUsed", "diskTotal"} {
		if _, ok := ms[0][f]; !ok {
			t.Fatalf("metrics lack %s: %s", f, ans.body)
		}
	}
	if ms[0]["memUsed"].(float64) <= 0 || ms[0]["memTotal"].(float64) != float64(*d.MemoryMB<<20) {
		t.Fatalf("metrics memory: %s", ans.body)
	}

	// A named template (warren template create, in project ea): its image,
	// resources and env, E2B's metadata and envVars on top; templateID and
	// metadata answer as E2B sent them. Root's templates are everyone's.
	cliA := func(args ...string) string {
		t.Helper()
		out, errs, code := s.cli(t, append(args, "--token", tokA)...)
		if code != 0 {
			t.Fatalf("warren %v: %d %s %s", args, code, out, errs)
		}
		return out
	}
	cliA("template", "create", "small", "--image", "busybox", "--memory", "96m", "--disk", "300m", "-e", "TPL=yes", "-e", "FOO=tpl")
	s.cliOK(t, "template", "create", "rootbase", "--image", "busybox", "--memory", "80m")
	ans = a.do(t, "POST", "/v2/sandboxes", `{"templateID":"small","metadata":{"k":"v"},"envVars":{"FOO":"e2b"}}`)
	ans.wantStatus(t, "create from a template", 201)
	var fromT e2bSandbox
	ans.decode(t, &fromT)
	idT := fromT.check(t, "small")
	cleanup(idT)
	dT := a.detail(t, idT)
	if dT.TemplateID != "small" || *dT.MemoryMB != 96 || *dT.DiskSizeMB != 300 || len(dT.Metadata) != 1 || dT.Metadata["k"] != "v" {
		t.Fatalf("sandbox from template: %+v", dT)
	}
	if ids, _ := a.listAll(t, "template=small"); len(ids) != 1 || ids[0] != idT {
		t.Fatalf("template filter: %v", ids)
	}
	if res, err := native.Exec(ctx, idT, api.ExecRequest{Cmd: "echo $TPL $FOO"}); err != nil || strings.TrimSpace(res.Stdout) != "yes e2b" {
		t.Fatalf("template env under envVars: %+v %v", res, err)
	}
	ans = a.do(t, "POST", "/sandboxes", `{"templateID":"rootbase"}`)
	ans.wantStatus(t, "create from root's template", 201)
	var fromRoot e2bSandbox
	ans.decode(t, &fromRoot)
	idR := fromRoot.check(t, "rootbase")
	cleanup(idR)
	if dR := a.detail(t, idR); *dR.MemoryMB != 80 {
		t.Fatalf("sandbox from root's template: %+v", dR)
	}
	// Another project does not see ea's template.
	b.do(t, "POST", "/v2/sandboxes", `{"templateID":"small"}`).wantStatus(t, "another project's template", 404)
	a.do(t, "DELETE", "/sandboxes/"+idT, "").wantStatus(t, "kill template sandbox", 204)
	a.do(t, "DELETE", "/sandboxes/"+idR, "").wantStatus(t, "kill root template sandbox", 204)

	// autoPause: the timeout pauses the sandbox instead of killing it;
	// connect resumes it, and setTimeout moves the pause.
	ans = a.do(t, "POST", "/v2/sandboxes", `{"templateID":"busybox","timeout":2,"autoPause":true}`)
	ans.wantStatus(t, "create autoPause", 201)
	var ap e2bSandbox
	ans.decode(t, &ap)
	idP := ap.check(t, "busybox")
	cleanup(idP)
	for deadline := time.Now().Add(60 * time.Second); a.detail(t, idP).State != "paused"; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the autoPause sandbox did not pause after its timeout: %+v", a.detail(t, idP))
		}
	}
	a.do(t, "POST", "/v2/sandboxes/"+idP+"/connect", `{"timeout":60}`).wantStatus(t, "connect autoPaused", 201)
	dP := a.detail(t, idP)
	if dP.State != "running" {
		t.Fatalf("after connect: %+v", dP)
	}
	a.do(t, "POST", "/sandboxes/"+idP+"/timeout", `{"timeout":120}`).wantStatus(t, "timeout autoPause", 204)
	dP = a.detail(t, idP)
	if until := time.Until(dP.EndAt); dP.State != "running" || until < 110*time.Second || until > 121*time.Second {
		t.Fatalf("autoPause setTimeout(120): %+v ends in %v", dP, until)
	}
	if nsb, err := native.Get(ctx, idP); err != nil || nsb.IdleTimeout != 120 || nsb.IdleAction != api.IdleActionPause || nsb.ExpiresAt == nil || time.Until(*nsb.ExpiresAt) < 29*24*time.Hour {
		t.Fatalf("native view of the autoPause sandbox: %+v %v", nsb, err)
	}
	a.do(t, "DELETE", "/sandboxes/"+idP, "").wantStatus(t, "kill autoPause", 204)

	// The old list path: running sandboxes, one page.
	ans = a.do(t, "GET", "/sandboxes", "")
	ans.wantStatus(t, "list v1", 200)
	var v1 []e2bDetail
	ans.decode(t, &v1)
	if len(v1) != 2 {
		t.Fatalf("GET /sandboxes: %s", ans.body)
	}

	// Errors, each E2B's JSON.
	a.do(t, "POST", "/v2/sandboxes", `{"templateID":"no-such-template"}`).wantStatus(t, "unknown template", 404)
	a.do(t, "POST", "/v2/sandboxes", `{"templateID":`).wantStatus(t, "malformed body", 400)
	a.do(t, "POST", "/v2/sandboxes", `{"templateID":"busybox","metadata":{"bad key!":"x"}}`).wantStatus(t, "bad metadata key", 400)
	a.do(t, "POST", "/v2/sandboxes", `{"templateID":"busybox","timeout":999999}`).wantStatus(t, "timeout too long", 400)
	(&e2bClient{base: base, key: "e2b_00ff"}).do(t, "GET", "/v2/sandboxes", "").wantStatus(t, "wrong key", 401)
	(&e2bClient{base: base, key: "wrn_notatokenatall0000"}).do(t, "GET", "/sandboxes/"+id1, "").wantStatus(t, "wrong raw key", 401)
	(&e2bClient{base: base}).do(t, "DELETE", "/sandboxes/"+id1, "").wantStatus(t, "no key", 401)
	a.do(t, "GET", "/sandboxes/nosuch/metrics", "").wantStatus(t, "unknown sandbox", 404)
	a.do(t, "GET", "/nowhere", "").wantStatus(t, "unknown route", 404)
	a.do(t, "PUT", "/sandboxes/"+id1, "").wantStatus(t, "wrong method", 405)

	// Kill: 204, then 404 with a JSON body (JS returns false on code 404).
	a.do(t, "DELETE", "/sandboxes/"+id1, "").wantStatus(t, "kill", 204)
	a.do(t, "DELETE", "/sandboxes/"+id1, "").wantStatus(t, "kill twice", 404)
	a.do(t, "GET", "/sandboxes/"+id1, "").wantStatus(t, "get killed", 404)
	if ids, _ := a.listAll(t, ""); len(ids) != 1 || ids[0] != id2 {
		t.Fatalf("list after kill: %v", ids)
	}
	a.do(t, "DELETE", "/sandboxes/"+id2, "").wantStatus(t, "kill v1-created", 204)
}
