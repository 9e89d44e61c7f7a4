package cli

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

const tok = "secret"

// fakeAPI is an httptest server speaking the REST contract with canned,
// in-memory answers; requests are recorded for the tests to inspect.
type fakeAPI struct {
	t   *testing.T
	srv *httptest.Server

	mu       sync.Mutex
	reqs     []recorded
	files    map[string]fakeFile // "id:path"
	dirs     map[string]bool     // "id:path"
	archives map[string][]byte   // "id:path" -> tar
}

type recorded struct {
	Method, Path string
	Query        map[string][]string
	Header       http.Header
	Body         []byte
}

type fakeFile struct {
	data []byte
	mode uint32
}

func newFakeAPI(t *testing.T) *fakeAPI {
	f := &fakeAPI{t: t, files: map[string]fakeFile{}, dirs: map[string]bool{}, archives: map[string][]byte{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAPI) last(method, p string) *recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := len(f.reqs) - 1; i >= 0; i-- {
		if f.reqs[i].Method == method && f.reqs[i].Path == p {
			r := f.reqs[i]
			return &r
		}
	}
	f.t.Fatalf("no request %s %s", method, p)
	return nil
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func replyErr(w http.ResponseWriter, status int, code, msg string) {
	reply(w, status, api.ErrorBody{Error: api.Error{Code: code, Message: msg}})
}

func (f *fakeAPI) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.reqs = append(f.reqs, recorded{r.Method, r.URL.Path, r.URL.Query(), r.Header.Clone(), body})
	f.mu.Unlock()
	if r.Header.Get("Authorization") != "Bearer "+tok {
		replyErr(w, 401, api.CodeUnauthorized, "invalid token")
		return
	}
	parts := strings.Split(strings.TrimPrefix(r.URL.Path, "/v1/"), "/")
	q := r.URL.Query()
	switch {
	case r.Method == "POST" && r.URL.Path == "/v1/sandboxes":
		var req api.CreateSandboxRequest
		_ = json.Unmarshal(body, &req)
		reply(w, 201, api.Sandbox{ID: "sb-n1-new", State: api.StateRunning, Image: req.Image, CPU: req.CPU, MemoryMB: req.MemoryMB, Labels: req.Labels})
	case r.Method == "GET" && r.URL.Path == "/v1/sandboxes":
		reply(w, 200, api.SandboxList{Sandboxes: []api.Sandbox{
			{ID: "sb-n1-a", State: "running", Image: "busybox", Node: "n1", CPU: 1.5, MemoryMB: 2048, CreatedAt: time.Now().Add(-3 * time.Minute), Labels: map[string]string{"team": "x", "a": "b"}},
			{ID: "sb-n1-b", State: "stopped", Image: "python", Node: "n1", CPU: 1, MemoryMB: 512},
		}})
	case r.Method == "DELETE" && len(parts) == 2 && parts[0] == "sandboxes":
		if parts[1] == "sb-missing" {
			replyErr(w, 404, api.CodeNotFound, "no sandbox sb-missing")
			return
		}
		reply(w, 200, api.Sandbox{ID: parts[1], State: api.StateStopped})
	case r.Method == "GET" && len(parts) == 3 && parts[2] == "audit" && q.Get("follow") == "1":
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(200)
		_, _ = w.Write([]byte("{\"seq\":1,\"step\":2,\"kind\":\"exec\",\"pid\":7,\"path\":\"/bin/true\",\"argv\":[\"true\"]}\n\n{\"seq\":2,\"kind\":\"signal\",\"signal\":15,\"target\":1}\n"))
	case r.Method == "GET" && len(parts) == 3 && parts[2] == "audit":
		reply(w, 200, api.AuditList{Telemetry: true, Dropped: 2, Records: []api.AuditRecord{
			{Time: time.Now(), Step: 3, Kind: api.AuditKindExec, Pid: 7, Ppid: 6, Path: "/bin/ls", Argv: []string{"ls", "/"}},
			{Time: time.Now(), Step: 3, Kind: api.AuditKindSignal, Pid: 8, Signal: 15, Target: 1},
		}})
	case r.Method == "POST" && len(parts) == 3 && parts[2] == "exec":
		f.exec(w, r, body)
	case len(parts) == 3 && parts[2] == "files":
		f.filesOp(w, r, parts[1], q, body)
	case r.Method == "POST" && len(parts) == 4 && parts[3] == "mkdir":
		var req api.MkdirRequest
		_ = json.Unmarshal(body, &req)
		f.mu.Lock()
		f.dirs[parts[1]+":"+req.Path] = true
		f.mu.Unlock()
		reply(w, 200, api.FileInfo{Path: req.Path, Type: "dir", Mode: req.Mode})
	case len(parts) == 3 && parts[2] == "archive":
		key := parts[1] + ":" + q.Get("path")
		if r.Method == "PUT" {
			f.mu.Lock()
			f.archives[key] = body
			f.mu.Unlock()
			reply(w, 200, map[string]int{"files": 3})
			return
		}
		f.mu.Lock()
		b, ok := f.archives[key]
		f.mu.Unlock()
		if !ok {
			replyErr(w, 404, api.CodeNotFound, "no dir")
			return
		}
		w.Header().Set("Content-Type", "application/x-tar")
		w.Write(b)
	case r.Method == "POST" && len(parts) == 3 && (parts[2] == "pause" || parts[2] == "resume"):
		if parts[1] == "sb-missing" {
			replyErr(w, 404, api.CodeNotFound, "no sandbox sb-missing")
			return
		}
		st := map[string]string{"pause": api.StatePaused, "resume": api.StateRunning}[parts[2]]
		reply(w, 200, api.Sandbox{ID: parts[1], State: st})
	case r.Method == "POST" && (r.URL.Path == "/v1/sandboxes:pause" || r.URL.Path == "/v1/sandboxes:resume"):
		reply(w, 200, api.PauseResult{Sandboxes: []string{"sb-n1-a"}, Errors: map[string]string{"sb-n1-c": "conflict: busy"}})
	case r.Method == "POST" && len(parts) == 3 && parts[2] == "fork":
		var req api.ForkRequest
		_ = json.Unmarshal(body, &req)
		res := api.ForkResult{Snapshot: &api.Snapshot{ID: "snap-1"}}
		for i := 0; i < req.Count; i++ {
			res.Sandboxes = append(res.Sandboxes, api.Sandbox{ID: "sb-n1-f" + strconv.Itoa(i)})
		}
		reply(w, 201, res)
	case r.Method == "GET" && len(parts) == 3 && parts[2] == "commands":
		zero, three := 0, 3
		reply(w, 200, api.CommandHistory{Commands: []api.CommandRecord{
			{StartedAt: time.Now(), Cmd: "echo hi", ExitCode: &zero, DurationMs: 1.5},
			{StartedAt: time.Now(), Argv: []string{"false", "x"}, ExitCode: &three, Trusted: true},
			{StartedAt: time.Now(), Cmd: "sleep 9", TimedOut: true, Signal: "SIGKILL"},
			{StartedAt: time.Now(), Cmd: "sleep 100", CommandID: "cmd-7"},
		}})
	case r.Method == "GET" && len(parts) == 3 && parts[2] == "stats":
		reply(w, 200, api.SandboxStats{ID: parts[1], State: "running", CPUSeconds: 1.25, MemoryBytes: 64 << 20, CPU: 1, MemoryLimitMB: 256, Commands: 4})
	case r.Method == "POST" && r.URL.Path == "/v1/fncall":
		var req api.FnCallRequest
		_ = json.Unmarshal(body, &req)
		code := 0
		if req.Cmd == "exit 4" {
			code = 4
		}
		reply(w, 200, api.ExecResult{ExitCode: code, Stdout: "fn:" + req.Cmd + strings.Join(req.Argv, "|") + "\n", Stderr: "e\n"})
	case r.URL.Path == "/v1/pools" && r.Method == "POST":
		var req api.PoolRequest
		_ = json.Unmarshal(body, &req)
		reply(w, 201, api.Pool{Name: req.Name, Image: req.Image, Size: req.Size})
	case r.URL.Path == "/v1/pools" && r.Method == "GET":
		reply(w, 200, api.PoolList{Pools: []api.Pool{{Name: "warm", Image: "busybox", Tier: "container", CPU: 1, MemoryMB: 512, Size: 2, Ready: 2, Claimed: 7}}})
	case len(parts) == 2 && parts[0] == "pools":
		if parts[1] != "warm" {
			replyErr(w, 404, api.CodeNotFound, "no pool "+parts[1])
			return
		}
		reply(w, 200, api.Pool{Name: "warm", Image: "busybox", Size: 2})
	case r.Method == "GET" && r.URL.Path == "/v1/images":
		reply(w, 200, api.ImageList{Images: []api.Image{{Name: "busybox", Digest: "sha256:0123456789abcdef0123", Layers: []string{"l1"}, Size: 4 << 20}}})
	case r.Method == "GET" && r.URL.Path == "/v1/nodes":
		reply(w, 200, api.NodeList{Nodes: []api.Node{{Name: "n1", State: "up", CPUCapacity: 2, CPURequested: 0.5, MemoryMB: 24576, MemRequested: 1024, Sandboxes: 3, Tiers: []string{"container"}, LastHeartbeat: time.Now()}}})
	case r.Method == "GET" && r.URL.Path == "/v1/events":
		evs := []api.Event{
			{Seq: 1, Type: api.EventNodeDown, Node: "n2", Message: "node n2 missed its heartbeats"},
			{Seq: 2, Type: api.EventSandboxLost, Node: "n2", Sandbox: "sb-n2-aaaa", Message: "its node n2 is down"},
			{Seq: 3, Type: api.EventNodeUp, Node: "n2", Message: "node n2 is back"},
		}
		after, _ := strconv.ParseUint(r.URL.Query().Get("after"), 10, 64)
		if r.URL.Query().Get("follow") != "1" {
			reply(w, 200, api.EventList{Events: evs[after:], Next: 3})
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		for _, ev := range evs[after:] {
			b, _ := json.Marshal(ev)
			w.Write(append(append(b, '\n'), '\n')) // each followed by a keepalive line
		}
	case r.Method == "PUT" && len(parts) == 2 && parts[0] == "network-rules":
		var nr api.NetworkRule
		_ = json.Unmarshal(body, &nr)
		nr.Name, nr.Version = parts[1], 3
		reply(w, 200, nr)
	case r.Method == "GET" && r.URL.Path == "/v1/network-rules":
		reply(w, 200, api.NetworkRuleList{Rules: []api.NetworkRule{{Name: "pypi", Version: 2, Hosts: []string{"pypi.org"}, Ports: []int{443}}}})
	case r.Method == "PUT" && len(parts) == 3 && parts[2] == "network":
		var n api.NetworkSpec
		_ = json.Unmarshal(body, &n)
		reply(w, 200, api.SandboxNetwork{ID: parts[1], Enabled: true, Egress: n.Egress})
	case r.Method == "GET" && len(parts) == 4 && parts[3] == "denials":
		reply(w, 200, api.NetworkDenials{ID: parts[1], Denials: []api.NetworkDenialRecord{
			{Time: time.Now(), Step: 4, Destination: "evil.test", Protocol: "dns", Reason: "dns", Count: 1}}})
	default:
		replyErr(w, 404, api.CodeNotFound, "no route "+r.Method+" "+r.URL.Path)
	}
}

// TestNetworkCmds: warren network-rules put/ls and network set/denials
// send and show what the API takes and answers.
func TestNetworkCmds(t *testing.T) {
	f := newFakeAPI(t)
	code, out, errs := f.run(t, "", "network-rules", "put", "pypi", "--host", "pypi.org", "--host", "*.pythonhosted.org", "--port", "443", "--proto", "tcp")
	if code != 0 || out != "pypi version 3\n" {
		t.Fatalf("put: %d %q %q", code, out, errs)
	}
	var nr api.NetworkRule
	if err := json.Unmarshal(f.last("PUT", "/v1/network-rules/pypi").Body, &nr); err != nil ||
		strings.Join(nr.Hosts, ",") != "pypi.org,*.pythonhosted.org" || len(nr.Ports) != 1 || nr.Ports[0] != 443 || nr.Protocols[0] != "tcp" {
		t.Errorf("put sent %+v %v", nr, err)
	}
	if code, _, errs := f.run(t, "", "network-rules", "put", "x", "--cidr", "10.0.0.0/8", "--port", "https"); code == 0 || !strings.Contains(errs, "https") {
		t.Errorf("a bad port: %d %q", code, errs)
	}
	if code, out, _ := f.run(t, "", "network-rules", "ls"); code != 0 || !strings.Contains(out, "pypi") || !strings.Contains(out, "443") {
		t.Errorf("ls: %d %q", code, out)
	}
	if code, out, _ := f.run(t, "", "network", "set", "sb-n1-a", "pypi", "10.0.0.0/8:443"); code != 0 || !strings.Contains(out, "pypi 10.0.0.0/8:443") {
		t.Errorf("set: %d %q", code, out)
	}
	if code, out, _ := f.run(t, "", "network", "denials", "sb-n1-a"); code != 0 || !strings.Contains(out, "evil.test") || !strings.Contains(out, "dns") {
		t.Errorf("denials: %d %q", code, out)
	}
	if code, _, _ := f.run(t, "", "create", "--image", "busybox", "--allow", "pypi", "--allow", "10.0.0.0/8:443"); code != 0 {
		t.Fatal("create --allow")
	}
	var raw struct{ Network json.RawMessage }
	if err := json.Unmarshal(f.last("POST", "/v1/sandboxes").Body, &raw); err != nil || string(raw.Network) != `{"egress":["pypi","10.0.0.0/8:443"]}` {
		t.Errorf("create --allow pypi: network %s", raw.Network)
	}
}

func (f *fakeAPI) exec(w http.ResponseWriter, r *http.Request, body []byte) {
	var req api.ExecRequest
	_ = json.Unmarshal(body, &req)
	if req.Background {
		reply(w, 202, api.ExecResult{CommandID: "cmd-1"})
		return
	}
	code := 0
	if req.Cmd == "exit 3" {
		code = 3
	}
	out := "out:" + req.Cmd + strings.Join(req.Argv, "|") + req.Stdin + "\n"
	if r.Header.Get("Accept") != "application/x-ndjson" {
		reply(w, 200, api.ExecResult{ExitCode: code, Stdout: out, Stderr: "err\n", DurationMs: 2})
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	enc.Encode(map[string]string{"stdout": out})
	w.(http.Flusher).Flush()
	enc.Encode(map[string]string{"stderr": "err\n"})
	enc.Encode(map[string]any{"exit_code": code, "truncated": false, "duration_ms": 2})
}

func (f *fakeAPI) filesOp(w http.ResponseWriter, r *http.Request, id string, q map[string][]string, body []byte) {
	p := ""
	if v := q["path"]; len(v) > 0 {
		p = v[0]
	}
	key := id + ":" + p
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.Method {
	case "PUT":
		mode, _ := strconv.ParseUint(strings.Join(q["mode"], ""), 8, 32)
		f.files[key] = fakeFile{data: body, mode: uint32(mode)}
		reply(w, 200, api.FileInfo{Path: p, Name: path.Base(p), Size: int64(len(body)), Mode: uint32(mode), Type: "file"})
	case "GET":
		if _, ok := q["stat"]; ok {
			if ff, ok := f.files[key]; ok {
				reply(w, 200, api.FileInfo{Path: p, Name: path.Base(p), Size: int64(len(ff.data)), Mode: ff.mode, Type: "file"})
			} else if f.dirs[key] || f.archives[key] != nil {
				reply(w, 200, api.FileInfo{Path: p, Name: path.Base(p), Mode: 0o755, Type: "dir"})
			} else {
				replyErr(w, 404, api.CodeNotFound, "no such file "+p)
			}
			return
		}
		ff, ok := f.files[key]
		if !ok {
			replyErr(w, 404, api.CodeNotFound, "no such file "+p)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(ff.data)
	}
}

// run runs the CLI against the fake server and returns exit code and output.
func (f *fakeAPI) run(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	full := append([]string{"--url", f.srv.URL, "--token", tok}, args...)
	code := Main(context.Background(), full, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestCreate(t *testing.T) {
	f := newFakeAPI(t)
	code, out, errs := f.run(t, "", "create", "--image", "busybox", "--cpu", "2", "--memory", "4g", "--disk", "512",
		"--ttl", "1h", "--idle-timeout", "90", "--env", "A=1", "-e", "B=x=y", "--label", "team=ml")
	if code != 0 || out != "sb-n1-new\n" {
		t.Fatalf("code %d out %q err %q", code, out, errs)
	}
	r := f.last("POST", "/v1/sandboxes")
	var req api.CreateSandboxRequest
	if err := json.Unmarshal(r.Body, &req); err != nil {
		t.Fatal(err)
	}
	if req.Image != "busybox" || req.CPU != 2 || req.MemoryMB != 4096 || req.DiskMB != 512 || req.TTL != 3600 ||
		req.IdleTimeout != 90 || req.Env["A"] != "1" || req.Env["B"] != "x=y" || req.Labels["team"] != "ml" {
		t.Fatalf("request %+v", req)
	}
	if r.Header.Get("Idempotency-Key") == "" {
		t.Fatal("no idempotency key")
	}
	if req.Network != nil {
		t.Fatalf("a create without --network/--allow asked for a network: %+v", req.Network)
	}
	for args, want := range map[string]string{"--allow 10.1.2.0/24:443/tcp --allow 10.9.9.9": `{"egress":["10.1.2.0/24:443/tcp","10.9.9.9"]}`,
		"--network": `{"egress":[]}`} {
		if code, _, errs := f.run(t, "", append([]string{"create", "--image", "busybox"}, strings.Fields(args)...)...); code != 0 {
			t.Fatalf("%s: %d %s", args, code, errs)
		}
		var raw struct{ Network json.RawMessage }
		if err := json.Unmarshal(f.last("POST", "/v1/sandboxes").Body, &raw); err != nil || string(raw.Network) != want {
			t.Errorf("%s: network %s, want %s", args, raw.Network, want)
		}
	}
	code, out, _ = f.run(t, "", "--json", "create", "--image", "busybox")
	var sb api.Sandbox
	if code != 0 || json.Unmarshal([]byte(out), &sb) != nil || sb.ID != "sb-n1-new" {
		t.Fatalf("json: %d %q", code, out)
	}
	if code, _, errs := f.run(t, "", "create"); code != 1 || !strings.Contains(errs, "image") {
		t.Fatalf("missing --image: %d %q", code, errs)
	}
	if code, _, errs := f.run(t, "", "create", "--image", "x", "--label", "novalue"); code != 1 || !strings.Contains(errs, "KEY=VALUE") {
		t.Fatalf("bad label: %d %q", code, errs)
	}
}

func TestEnvFallbackAndAuthError(t *testing.T) {
	f := newFakeAPI(t)
	t.Setenv("WARREN_URL", f.srv.URL)
	t.Setenv("WARREN_TOKEN", tok)
	var out, errb bytes.Buffer
	if code := Main(context.Background(), []string{"ls"}, nil, &out, &errb); code != 0 || !strings.Contains(out.String(), "sb-n1-a") {
		t.Fatalf("env config: %d %q %q", code, out.String(), errb.String())
	}
	out.Reset()
	code := Main(context.Background(), []string{"--token", "wrong", "ls"}, nil, &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), "unauthorized") {
		t.Fatalf("bad token: %d %q", code, errb.String())
	}
	// One "warren:" prefix, not one from the SDK's error and one from the CLI.
	if strings.Count(errb.String(), "warren:") != 1 {
		t.Fatalf("bad token: %q, want one warren: prefix", errb.String())
	}
}

func TestRun(t *testing.T) {
	f := newFakeAPI(t)
	// A shell string: output streams, the exit code is the command's.
	code, out, errs := f.run(t, "", "run", "sb-n1-a", "exit 3")
	if code != 3 || out != "out:exit 3\n" || errs != "err\n" {
		t.Fatalf("code %d out %q err %q", code, out, errs)
	}
	var req api.ExecRequest
	json.Unmarshal(f.last("POST", "/v1/sandboxes/sb-n1-a/exec").Body, &req)
	if req.Cmd != "exit 3" || req.Argv != nil {
		t.Fatalf("req %+v", req)
	}
	// "--" and argv, with flags before the id.
	code, out, _ = f.run(t, "", "run", "--cwd", "/w", "--session", "s1", "-e", "K=V", "--timeout", "2m", "sb-n1-a", "--", "ls", "-la", "/")
	if code != 0 || out != "out:ls|-la|/\n" {
		t.Fatalf("argv: %d %q", code, out)
	}
	req = api.ExecRequest{}
	json.Unmarshal(f.last("POST", "/v1/sandboxes/sb-n1-a/exec").Body, &req)
	if strings.Join(req.Argv, " ") != "ls -la /" || req.Cwd != "/w" || req.Session != "s1" || req.Env["K"] != "V" || req.Timeout != 120 {
		t.Fatalf("req %+v", req)
	}
	// Several words without "--" are argv too; a single "--"-prefixed word stays a command word.
	if code, out, _ = f.run(t, "", "run", "sb-n1-a", "echo", "--x"); code != 0 || out != "out:echo|--x\n" {
		t.Fatalf("words: %d %q", code, out)
	}
	// --json: one JSON result, same exit code.
	code, out, _ = f.run(t, "", "--json", "run", "sb-n1-a", "exit 3")
	var res api.ExecResult
	if code != 3 || json.Unmarshal([]byte(out), &res) != nil || res.Stdout != "out:exit 3\n" || res.Stderr != "err\n" {
		t.Fatalf("json: %d %q", code, out)
	}
	if f.last("POST", "/v1/sandboxes/sb-n1-a/exec").Header.Get("Accept") == "application/x-ndjson" {
		t.Fatal("--json must not stream")
	}
	// stdin and detach.
	if code, out, _ = f.run(t, "input", "run", "-i", "sb-n1-a", "cat"); code != 0 || out != "out:catinput\n" {
		t.Fatalf("stdin: %d %q", code, out)
	}
	if code, out, _ = f.run(t, "", "run", "-d", "sb-n1-a", "sleep 100"); code != 0 || out != "cmd-1\n" {
		t.Fatalf("detach: %d %q", code, out)
	}
	if code, _, errs = f.run(t, "", "run", "sb-n1-a", "--"); code != 1 || !strings.Contains(errs, "no command") {
		t.Fatalf("empty: %d %q", code, errs)
	}
}

func TestLsRm(t *testing.T) {
	f := newFakeAPI(t)
	code, out, _ := f.run(t, "", "ls", "--label", "team=x", "-l", "a=b", "--state", "running")
	if code != 0 {
		t.Fatal(code)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[1], "sb-n1-a") ||
		!strings.Contains(lines[1], "a=b,team=x") || !strings.Contains(lines[1], "2G") || !strings.Contains(lines[1], "3m") {
		t.Fatalf("table:\n%s", out)
	}
	r := f.last("GET", "/v1/sandboxes")
	if got := r.Query["label"]; len(got) != 2 || r.Query["state"][0] != "running" {
		t.Fatalf("query %v", r.Query)
	}
	// Without --state or --all only live sandboxes.
	code, out, _ = f.run(t, "", "--json", "ls")
	var l api.SandboxList
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != "sb-n1-a" {
		t.Fatalf("json %q", out)
	}
	code, out, _ = f.run(t, "", "--json", "ls", "--all")
	if code != 0 || json.Unmarshal([]byte(out), &l) != nil || len(l.Sandboxes) != 2 {
		t.Fatalf("json --all %q", out)
	}
	if code, out, _ = f.run(t, "", "ls"); code != 0 || strings.Contains(out, "sb-n1-b") || !strings.Contains(out, "sb-n1-a") {
		t.Fatalf("ls shows a stopped sandbox:\n%s", out)
	}
	code, out, errs := f.run(t, "", "rm", "sb-n1-a", "sb-missing", "sb-n1-b")
	if code != 1 || out != "sb-n1-a\nsb-n1-b\n" || !strings.Contains(errs, "warren: rm sb-missing: not_found") || strings.Contains(errs, "warren: warren:") {
		t.Fatalf("rm: %d %q %q", code, out, errs)
	}
	// rm -l: every live sandbox the label selects (the stopped one is left).
	code, out, errs = f.run(t, "", "rm", "-l", "team=x")
	if code != 0 || out != "sb-n1-a\n" {
		t.Fatalf("rm -l: %d %q %q", code, out, errs)
	}
	if q := f.last("GET", "/v1/sandboxes").Query; q["label"][0] != "team=x" {
		t.Fatalf("rm -l listed %v", q)
	}
	if code, _, errs = f.run(t, "", "rm"); code != 1 || !strings.Contains(errs, "--label") {
		t.Fatalf("rm without ids: %d %q", code, errs)
	}
	if code, _, errs = f.run(t, "", "rm", "sb-n1-a", "-l", "a=b"); code != 1 || !strings.Contains(errs, "not both") {
		t.Fatalf("rm ids and labels: %d %q", code, errs)
	}
}

func TestImagesNodesVersion(t *testing.T) {
	f := newFakeAPI(t)
	code, out, _ := f.run(t, "", "image", "ls")
	if code != 0 || !strings.Contains(out, "busybox") || !strings.Contains(out, "sha256:0123456789ab ") || !strings.Contains(out, "4.0MiB") {
		t.Fatalf("image ls %d:\n%s", code, out)
	}
	code, out, _ = f.run(t, "", "nodes")
	if code != 0 || !strings.Contains(out, "0.5/2") || !strings.Contains(out, "1G/24G") || !strings.Contains(out, "container") {
		t.Fatalf("nodes %d:\n%s", code, out)
	}
	code, out, _ = f.run(t, "", "--json", "nodes")
	var nl api.NodeList
	if code != 0 || json.Unmarshal([]byte(out), &nl) != nil || nl.Nodes[0].Sandboxes != 3 {
		t.Fatalf("nodes json %q", out)
	}
	code, out, _ = f.run(t, "", "events")
	if code != 0 || strings.Count(out, "\n") != 3 || !strings.Contains(out, "sandbox.lost\tsb-n2-aaaa") {
		t.Fatalf("events %d:\n%s", code, out)
	}
	code, out, _ = f.run(t, "", "events", "-f", "--after", "1", "--limit", "2")
	if code != 0 || !strings.HasPrefix(out, "2\t") || !strings.Contains(out, "\n3\t") || strings.Count(out, "\n") != 2 {
		t.Fatalf("events -f %d:\n%s", code, out)
	}
	if q := f.last("GET", "/v1/events").Query; q["follow"][0] != "1" || q["after"][0] != "1" {
		t.Fatalf("events -f asked %v", q)
	}
	code, out, _ = f.run(t, "", "--json", "events", "-f", "--limit", "1")
	var ev api.Event
	if code != 0 || json.Unmarshal([]byte(out), &ev) != nil || ev.Seq != 1 || ev.Type != api.EventNodeDown {
		t.Fatalf("events -f --json %d: %q", code, out)
	}
	code, out, _ = f.run(t, "", "version")
	if code != 0 || !strings.HasPrefix(out, "warren "+Version) {
		t.Fatalf("version %q", out)
	}
}

func TestImageImport(t *testing.T) {
	f := newFakeAPI(t)
	old := importImage
	t.Cleanup(func() { importImage = old })
	importImage = nil
	if code, _, errs := f.run(t, "", "image", "import", "x.tar", "--name", "x", "--store", "/s"); code != 1 || !strings.Contains(errs, "not available") {
		t.Fatalf("nil importer: %d %q", code, errs)
	}
	var got []string
	importImage = func(ctx context.Context, dataDir, src, name string) error {
		got = []string{dataDir, src, name}
		return nil
	}
	code, out, _ := f.run(t, "", "image", "import", "/tmp/img.tar", "--name", "busybox:1", "--data-dir", "/srv/w")
	if code != 0 || out != "busybox:1\n" || strings.Join(got, ",") != "/srv/w/images,/tmp/img.tar,busybox:1" {
		t.Fatalf("%d %q %v", code, out, got)
	}
	f.run(t, "", "image", "import", "a", "--name", "n", "--data-dir", DefaultDataDir)
	if got[0] != DefaultDataDir+"/images" {
		t.Fatalf("default store %q", got[0])
	}
	// Without --data-dir or --store: uploaded through the API.
	tarFile := filepath.Join(t.TempDir(), "img.tar")
	os.WriteFile(tarFile, []byte("tar bytes"), 0o644)
	got = nil
	f.run(t, "", "image", "import", tarFile, "--name", "up:1")
	r := f.last("POST", "/v1/images:import")
	if got != nil || url.Values(r.Query).Get("name") != "up:1" || string(r.Body) != "tar bytes" {
		t.Fatalf("upload: local %v, query %v, body %q", got, r.Query, r.Body)
	}
	f.run(t, "", "image", "import", "a", "--name", "n", "--store", "/shared/store")
	if got[0] != "/shared/store" {
		t.Fatalf("--store %q", got[0])
	}
}

func TestCpFiles(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "hello.sh")
	os.WriteFile(src, []byte("echo hi\n"), 0o750)
	f.dirs["sb-1:/work"] = true

	// Into an existing remote directory: lands under its own name, mode kept.
	if code, _, errs := f.run(t, "", "cp", src, "sb-1:/work"); code != 0 {
		t.Fatalf("upload: %q", errs)
	}
	r := f.last("PUT", "/v1/sandboxes/sb-1/files")
	if r.Query["path"][0] != "/work/hello.sh" || r.Query["mode"][0] != "0750" || string(r.Body) != "echo hi\n" {
		t.Fatalf("put %v %q", r.Query, r.Body)
	}
	// Back into a local directory, and to a new local name.
	if code, _, errs := f.run(t, "", "cp", "sb-1:/work/hello.sh", filepath.Join(dir, "sub")); code != 0 {
		// sub does not exist: it becomes the file
		t.Fatalf("download: %q", errs)
	}
	b, err := os.ReadFile(filepath.Join(dir, "sub"))
	st, _ := os.Stat(filepath.Join(dir, "sub"))
	if err != nil || string(b) != "echo hi\n" || st.Mode().Perm() != 0o750 {
		t.Fatalf("downloaded %q %v %v", b, err, st.Mode())
	}
	os.Mkdir(filepath.Join(dir, "into"), 0o755)
	if code, _, errs := f.run(t, "", "cp", "sb-1:/work/hello.sh", filepath.Join(dir, "into")); code != 0 {
		t.Fatalf("download into dir: %q", errs)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "into", "hello.sh")); string(b) != "echo hi\n" {
		t.Fatalf("into dir: %q", b)
	}
	// stdin and stdout.
	if code, _, _ := f.run(t, "from stdin", "cp", "-", "sb-1:/in.txt"); code != 0 {
		t.Fatal("stdin upload")
	}
	if code, out, _ := f.run(t, "", "cp", "sb-1:/in.txt", "-"); code != 0 || out != "from stdin" {
		t.Fatalf("stdout download %q", out)
	}
	// Errors.
	if code, _, errs := f.run(t, "", "cp", "a", "b"); code != 1 || !strings.Contains(errs, "ID:/path") {
		t.Fatalf("local-local: %q", errs)
	}
	if code, _, errs := f.run(t, "", "cp", "sb-1:/nope", dir); code != 1 || !strings.Contains(errs, "not_found") {
		t.Fatalf("missing: %q", errs)
	}
	if code, _, errs := f.run(t, "", "cp", src, "sb-1:rel"); code != 1 || !strings.Contains(errs, "absolute") {
		t.Fatalf("relative: %q", errs)
	}
}

func TestCpDirectoryRoundTrip(t *testing.T) {
	f := newFakeAPI(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "proj")
	os.MkdirAll(filepath.Join(src, "pkg", "deep"), 0o755)
	os.WriteFile(filepath.Join(src, "main.go"), []byte("package main\n"), 0o644)
	os.WriteFile(filepath.Join(src, "pkg", "deep", "run.sh"), []byte("#!/bin/sh\n"), 0o755)
	os.Symlink("main.go", filepath.Join(src, "link"))

	// The remote target does not exist: it becomes the copy.
	if code, _, errs := f.run(t, "", "cp", src, "sb-1:/srv/proj"); code != 0 {
		t.Fatalf("upload: %q", errs)
	}
	var mk api.MkdirRequest
	json.Unmarshal(f.last("POST", "/v1/sandboxes/sb-1/files/mkdir").Body, &mk)
	if mk.Path != "/srv/proj" || !mk.Parents {
		t.Fatalf("mkdir %+v", mk)
	}
	ar := f.last("PUT", "/v1/sandboxes/sb-1/archive")
	if ar.Query["path"][0] != "/srv/proj" || ar.Header.Get("Content-Type") != "application/x-tar" {
		t.Fatalf("archive %v", ar.Query)
	}
	names := tarNames(t, ar.Body)
	if strings.Join(names, " ") != "link main.go pkg/ pkg/deep/ pkg/deep/run.sh" {
		t.Fatalf("tar entries %v", names)
	}
	// Download into an existing local dir: lands as out/proj.
	out := filepath.Join(dir, "out")
	os.Mkdir(out, 0o755)
	if code, _, errs := f.run(t, "", "cp", "sb-1:/srv/proj", out); code != 0 {
		t.Fatalf("download: %q", errs)
	}
	got := filepath.Join(out, "proj")
	if b, _ := os.ReadFile(filepath.Join(got, "pkg", "deep", "run.sh")); string(b) != "#!/bin/sh\n" {
		t.Fatalf("content %q", b)
	}
	if st, err := os.Stat(filepath.Join(got, "pkg", "deep", "run.sh")); err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("mode %v %v", st, err)
	}
	if l, err := os.Readlink(filepath.Join(got, "link")); err != nil || l != "main.go" {
		t.Fatalf("symlink %q %v", l, err)
	}
}

func tarNames(t *testing.T, b []byte) []string {
	tr := tar.NewReader(bytes.NewReader(b))
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
}

func TestExtractTarRefusesEscapes(t *testing.T) {
	mk := func(entries ...tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			h := h
			if h.Typeflag == tar.TypeReg {
				h.Size = 1
			}
			tw.WriteHeader(&h)
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte("x"))
			}
		}
		tw.Close()
		return buf.Bytes()
	}
	outside := t.TempDir()
	cases := map[string][]byte{
		"dotdot": mk(tar.Header{Name: "../evil", Typeflag: tar.TypeReg, Mode: 0o644}),
		"symlink parent": mk(
			tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside},
			tar.Header{Name: "l/evil", Typeflag: tar.TypeReg, Mode: 0o644}),
	}
	for name, b := range cases {
		dir := t.TempDir()
		if err := extractTar(bytes.NewReader(b), dir); err == nil {
			t.Errorf("%s: extracted without error", name)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("wrote outside: %v", ents)
	}
	// Absolute names are taken relative to the target.
	dir := t.TempDir()
	if err := extractTar(bytes.NewReader(mk(tar.Header{Name: "/abs/f", Typeflag: tar.TypeReg, Mode: 0o600})), dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "abs", "f")); err != nil {
		t.Fatal(err)
	}
}

func TestParsers(t *testing.T) {
	for in, want := range map[string]int64{"512": 512, "4g": 4096, "4GiB": 4096, "256m": 256, "1.5g": 1536, "1t": 1 << 20, "512k": 1} {
		if got, err := parseSizeMB("memory", in); err != nil || got != want {
			t.Errorf("parseSizeMB(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := parseSizeMB("memory", "lots"); err == nil {
		t.Error("parseSizeMB accepted garbage")
	}
	for in, want := range map[string]float64{"30": 30, "1.5": 1.5, "2m": 120, "1h30m": 5400} {
		if got, err := parseSeconds("ttl", in); err != nil || got != want {
			t.Errorf("parseSeconds(%q) = %v, %v", in, got, err)
		}
	}
	for _, s := range []string{"sb-1:/x", "a:/"} {
		if _, _, ok := remoteSpec(s); !ok {
			t.Errorf("%q should be remote", s)
		}
	}
	for _, s := range []string{"./a:b", "/tmp/x:y", "plain", ":x"} {
		if _, _, ok := remoteSpec(s); ok {
			t.Errorf("%q should be local", s)
		}
	}
}

func TestCreateLayersAndMore(t *testing.T) {
	f := newFakeAPI(t)
	code, _, errs := f.run(t, "", "create", "--image", "debian:12", "--layer", "ws/calc@2", "--layer", "toolkit/grader:/opt/grader:protected",
		"--layer", "data:/data", "--trajectory", "r/1", "--priority", "latency", "--idle-action", "pause", "--node-selector", "gpu=no", "--project", "acme")
	if code != 0 {
		t.Fatalf("create: %d %q", code, errs)
	}
	var req api.CreateSandboxRequest
	if err := json.Unmarshal(f.last("POST", "/v1/sandboxes").Body, &req); err != nil {
		t.Fatal(err)
	}
	want := []api.LayerAttachment{{Layer: "ws/calc@2"}, {Layer: "toolkit/grader", Mount: "/opt/grader", Protected: true}, {Layer: "data", Mount: "/data"}}
	if len(req.Layers) != 3 || req.Layers[0] != want[0] || req.Layers[1] != want[1] || req.Layers[2] != want[2] {
		t.Fatalf("layers %+v", req.Layers)
	}
	if req.Trajectory != "r/1" || req.Priority != "latency" || req.IdleTimeoutAction != "pause" || req.NodeSelector["gpu"] != "no" || req.Project != "acme" {
		t.Fatalf("request %+v", req)
	}
	for _, bad := range []string{"x:rel", "x:/m:rw", ":/m"} {
		if code, _, errs := f.run(t, "", "create", "--image", "x", "--layer", bad); code != 1 || !strings.Contains(errs, "--layer") {
			t.Errorf("--layer %q: %d %q", bad, code, errs)
		}
	}
}

func TestRunTrusted(t *testing.T) {
	f := newFakeAPI(t)
	if code, out, _ := f.run(t, "", "run", "--trusted", "sb-n1-a", "grade"); code != 0 || out != "out:grade\n" {
		t.Fatalf("run --trusted: %d %q", code, out)
	}
	var req api.ExecRequest
	json.Unmarshal(f.last("POST", "/v1/sandboxes/sb-n1-a/exec").Body, &req)
	if !req.Trusted || req.Cmd != "grade" {
		t.Fatalf("req %+v", req)
	}
	f.run(t, "", "run", "sb-n1-a", "x")
	req = api.ExecRequest{}
	json.Unmarshal(f.last("POST", "/v1/sandboxes/sb-n1-a/exec").Body, &req)
	if req.Trusted {
		t.Fatal("trusted without --trusted")
	}
}

func TestPauseResume(t *testing.T) {
	f := newFakeAPI(t)
	code, out, errs := f.run(t, "", "pause", "sb-n1-a", "sb-missing")
	if code != 1 || out != "sb-n1-a\n" || !strings.Contains(errs, "warren: pause sb-missing: not_found") {
		t.Fatalf("pause ids: %d %q %q", code, out, errs)
	}
	f.last("POST", "/v1/sandboxes/sb-n1-a/pause")
	if code, out, _ = f.run(t, "", "resume", "--no-prefetch", "sb-n1-a"); code != 0 || out != "sb-n1-a\n" {
		t.Fatalf("resume: %d %q", code, out)
	}
	var rr api.ResumeRequest
	if json.Unmarshal(f.last("POST", "/v1/sandboxes/sb-n1-a/resume").Body, &rr); rr.Prefetch == nil || *rr.Prefetch {
		t.Fatalf("resume body %+v", rr)
	}
	// By label: the server's answer, errors on stderr and exit status 1.
	for _, verb := range []string{"pause", "resume"} {
		code, out, errs = f.run(t, "", verb, "-l", "job=7", "-l", "a=b")
		if code != 1 || out != "sb-n1-a\n" || !strings.Contains(errs, verb+" sb-n1-c: conflict: busy") {
			t.Fatalf("%s -l: %d %q %q", verb, code, out, errs)
		}
		var pr api.PauseRequest
		json.Unmarshal(f.last("POST", "/v1/sandboxes:"+verb).Body, &pr)
		if pr.Labels["job"] != "7" || pr.Labels["a"] != "b" {
			t.Fatalf("%s body %+v", verb, pr)
		}
	}
	code, out, _ = f.run(t, "", "--json", "pause", "-l", "job=7")
	var res api.PauseResult
	if code != 1 || json.Unmarshal([]byte(out), &res) != nil || res.Sandboxes[0] != "sb-n1-a" {
		t.Fatalf("pause --json: %d %q", code, out)
	}
	if code, _, errs = f.run(t, "", "pause"); code != 1 || !strings.Contains(errs, "--label") {
		t.Fatalf("pause nothing: %d %q", code, errs)
	}
}

func TestForkCount(t *testing.T) {
	f := newFakeAPI(t)
	for _, args := range [][]string{{"fork", "sb-n1-a", "3"}, {"fork", "-n", "3", "sb-n1-a"}} {
		code, out, errs := f.run(t, "", args...)
		if code != 0 || out != "sb-n1-f0\nsb-n1-f1\nsb-n1-f2\n" {
			t.Fatalf("%v: %d %q %q", args, code, out, errs)
		}
		var req api.ForkRequest
		if json.Unmarshal(f.last("POST", "/v1/sandboxes/sb-n1-a/fork").Body, &req); req.Count != 3 {
			t.Fatalf("%v: count %d", args, req.Count)
		}
	}
	if code, out, _ := f.run(t, "", "fork", "sb-n1-a"); code != 0 || out != "sb-n1-f0\n" {
		t.Fatalf("default 1: %d %q", code, out)
	}
	for _, bad := range [][]string{{"fork", "sb-n1-a", "zero"}, {"fork", "sb-n1-a", "0"}, {"fork", "-n", "2", "sb-n1-a", "3"}} {
		if code, _, _ := f.run(t, "", bad...); code != 1 {
			t.Errorf("%v accepted", bad)
		}
	}
}

func TestFnCall(t *testing.T) {
	f := newFakeAPI(t)
	src := filepath.Join(t.TempDir(), "judge.py")
	os.WriteFile(src, []byte("print(1)"), 0o644)
	code, out, errs := f.run(t, "", "fncall", "--image", "python", "--file", src+":/work/judge.py", "-e", "K=V", "--timeout", "5", "--memory", "256m", "exit 4")
	if code != 4 || out != "fn:exit 4\n" || errs != "e\n" {
		t.Fatalf("fncall: %d %q %q", code, out, errs)
	}
	var req api.FnCallRequest
	json.Unmarshal(f.last("POST", "/v1/fncall").Body, &req)
	if req.Image != "python" || string(req.Files["/work/judge.py"]) != "print(1)" || req.Env["K"] != "V" || req.Timeout != 5 || req.MemoryMB != 256 || req.Cmd != "exit 4" {
		t.Fatalf("request %+v", req)
	}
	if code, out, _ = f.run(t, "", "fncall", "--", "python3", "judge.py"); code != 0 || out != "fn:python3|judge.py\n" {
		t.Fatalf("argv: %d %q", code, out)
	}
	code, out, _ = f.run(t, "", "--json", "fncall", "exit 4")
	var res api.ExecResult
	if code != 4 || json.Unmarshal([]byte(out), &res) != nil || res.Stdout != "fn:exit 4\n" {
		t.Fatalf("json: %d %q", code, out)
	}
	if code, _, errs = f.run(t, "", "fncall", "--file", "nocolon", "x"); code != 1 || !strings.Contains(errs, "LOCAL:/PATH") {
		t.Fatalf("bad --file: %d %q", code, errs)
	}
}

func TestPool(t *testing.T) {
	f := newFakeAPI(t)
	code, out, errs := f.run(t, "", "pool", "create", "warm", "--image", "busybox", "--size", "4", "--cpu", "0.5", "--memory", "1g")
	if code != 0 || out != "warm\n" {
		t.Fatalf("pool create: %d %q %q", code, out, errs)
	}
	var req api.PoolRequest
	json.Unmarshal(f.last("POST", "/v1/pools").Body, &req)
	if req.Name != "warm" || req.Image != "busybox" || req.Size != 4 || req.CPU != 0.5 || req.MemoryMB != 1024 {
		t.Fatalf("request %+v", req)
	}
	if code, out, _ = f.run(t, "", "pool", "ls"); code != 0 || !strings.Contains(out, "warm") || !strings.Contains(out, "512M") || strings.Count(out, "\n") != 2 {
		t.Fatalf("pool ls: %d\n%s", code, out)
	}
	if code, out, _ = f.run(t, "", "pool", "get", "warm"); code != 0 || !strings.Contains(out, `"name": "warm"`) {
		t.Fatalf("pool get: %d %q", code, out)
	}
	code, out, errs = f.run(t, "", "pool", "rm", "warm", "cold")
	if code != 1 || out != "warm\n" || !strings.Contains(errs, "warren: pool rm cold: not_found") {
		t.Fatalf("pool rm: %d %q %q", code, out, errs)
	}
	f.last("DELETE", "/v1/pools/warm")
	if code, _, errs = f.run(t, "", "pool", "create", "x"); code != 1 || !strings.Contains(errs, "--image") {
		t.Fatalf("pool create without image: %d %q", code, errs)
	}
}

func TestLogs(t *testing.T) {
	f := newFakeAPI(t)
	code, out, errs := f.run(t, "", "logs", "sb-n1-a")
	rows := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(rows) != 5 || !strings.HasPrefix(rows[0], "STARTED") {
		t.Fatalf("logs: %d %q\n%s", code, errs, out)
	}
	for i, want := range []string{"0 .*1.5ms .*echo hi", "3 .*\\[trusted\\] false x", "timeout .*sleep 9", "bg .*sleep 100 \\(cmd-7\\)"} {
		if !regexp.MustCompile(want).MatchString(rows[i+1]) {
			t.Errorf("row %d %q does not match %q", i+1, rows[i+1], want)
		}
	}
	f.last("GET", "/v1/sandboxes/sb-n1-a/commands")
	code, out, _ = f.run(t, "", "--json", "logs", "sb-n1-a")
	var h api.CommandHistory
	if code != 0 || json.Unmarshal([]byte(out), &h) != nil || len(h.Commands) != 4 || *h.Commands[1].ExitCode != 3 {
		t.Fatalf("logs --json: %d %q", code, out)
	}
}

func TestStats(t *testing.T) {
	f := newFakeAPI(t)
	code, out, errs := f.run(t, "", "stats", "sb-n1-a")
	if code != 0 || !strings.Contains(out, "1.25s") || !strings.Contains(out, "64.0MiB") || !strings.Contains(out, "256M") || !strings.Contains(out, "25.0%") {
		t.Fatalf("stats: %d %q\n%s", code, errs, out)
	}
	code, out, _ = f.run(t, "", "--json", "stats", "sb-n1-a")
	var st api.SandboxStats
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.MemoryBytes != 64<<20 || st.Commands != 4 {
		t.Fatalf("stats --json: %d %q", code, out)
	}
}

// TestCreateFlagsCoverFields: every field of the create request has a flag
// of warren create, so the CLI keeps up with the API (a new field fails
// here until it gets one, or is named below as not offered).
func TestCreateFlagsCoverFields(t *testing.T) {
	flagOf := map[string]string{
		"memory_mb": "memory", "disk_mb": "disk", "labels": "label", "layers": "layer",
		"idle_timeout_action": "idle-action", "audit": "audit-policy", "network_rules": "allow",
	}
	create := newCreateCmd(&globals{})
	rt := reflect.TypeOf(api.CreateSandboxRequest{})
	for i := 0; i < rt.NumField(); i++ {
		field, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
		flag, ok := flagOf[field]
		if !ok {
			flag = strings.ReplaceAll(field, "_", "-")
		}
		if create.Flags().Lookup(flag) == nil {
			t.Errorf("create field %q has no flag --%s of warren create", field, flag)
		}
	}
}

// TestDocumentedImageImportRuns: the `warren image import …` commands that
// scripts document parse and import (the debian script's did not).
func TestDocumentedImageImportRuns(t *testing.T) {
	f := newFakeAPI(t)
	old := importImage
	t.Cleanup(func() { importImage = old })
	var got []string
	importImage = func(ctx context.Context, dataDir, src, name string) error {
		got = []string{src, name}
		return nil
	}
	b, err := os.ReadFile("../../scripts/build-debian-image.sh")
	if err != nil {
		t.Fatal(err)
	}
	// Comment lines joined, the backquoted command taken out.
	var text strings.Builder
	for _, l := range strings.Split(string(b), "\n") {
		if c, ok := strings.CutPrefix(l, "#"); ok {
			text.WriteString(strings.TrimSpace(c) + " ")
		}
	}
	_, rest, ok := strings.Cut(text.String(), "`warren image import")
	cmdline, _, ok2 := strings.Cut(rest, "`")
	if !ok || !ok2 {
		t.Fatalf("no `warren image import …` in the script's comments")
	}
	args := append([]string{"image", "import"}, strings.Fields(cmdline)...)
	if code, _, errs := f.run(t, "", args...); code != 0 || len(got) != 2 || got[0] != "OUT.tar" || got[1] != "debian:12" {
		t.Fatalf("documented %q: %d %q, imported %v", args, code, errs, got)
	}
}

func TestAudit(t *testing.T) {
	f := newFakeAPI(t)
	code, out, errs := f.run(t, "", "audit", "sb-n1-a", "--step", "3", "--kind", "exec")
	if code != 0 || !strings.Contains(out, "/bin/ls  \"ls /\"") || !strings.Contains(out, "signal 15 to pid 1") || !strings.Contains(out, "2 older records dropped") {
		t.Fatalf("audit %d:\n%s%s", code, out, errs)
	}
	if q := f.last("GET", "/v1/sandboxes/sb-n1-a/audit").Query; q["step"][0] != "3" || q["kind"][0] != "exec" {
		t.Fatalf("audit asked %v", q)
	}
	code, out, _ = f.run(t, "", "audit", "sb-n1-a")
	if q := f.last("GET", "/v1/sandboxes/sb-n1-a/audit").Query; code != 0 || len(q["step"]) != 0 {
		t.Fatalf("audit without --step asked %v (%d: %s)", q, code, out)
	}
	code, out, _ = f.run(t, "", "audit", "-f", "sb-n1-a")
	if code != 0 || strings.Count(out, "\n") != 2 || !strings.Contains(out, "/bin/true") || !strings.Contains(out, "signal 15 to pid 1") {
		t.Fatalf("audit -f %d:\n%s", code, out)
	}
	code, out, _ = f.run(t, "", "--json", "audit", "sb-n1-a")
	var al api.AuditList
	if code != 0 || json.Unmarshal([]byte(out), &al) != nil || len(al.Records) != 2 || al.Records[0].Argv[1] != "/" {
		t.Fatalf("audit --json %d: %q", code, out)
	}
}

// TestImageImportDisk: `image import --disk` imports into a local store
// (with the format from the name or --format) or uploads with ?disk=.
func TestImageImportDisk(t *testing.T) {
	f := newFakeAPI(t)
	old := importDisk
	t.Cleanup(func() { importDisk = old })
	var got []string
	importDisk = func(ctx context.Context, store, src, name, format string) error {
		got = []string{store, src, name, format}
		return nil
	}
	code, out, errs := f.run(t, "", "image", "import", "--disk", "/tmp/d.qcow2", "--name", "deb:vm", "--data-dir", "/srv/w")
	if code != 0 || out != "deb:vm\n" || strings.Join(got, ",") != "/srv/w/images,/tmp/d.qcow2,deb:vm,qcow2" {
		t.Fatalf("local: %d %q %q %v", code, out, errs, got)
	}
	f.run(t, "", "image", "import", "--disk", "/tmp/d.bin", "--format", "raw", "--name", "n", "--store", "/s")
	if strings.Join(got, ",") != "/s,/tmp/d.bin,n,raw" {
		t.Fatalf("--format: %v", got)
	}
	for _, args := range [][]string{
		{"image", "import", "--disk", "/tmp/d.vmdk", "--name", "n", "--store", "/s"},
		{"image", "import", "--disk", "/tmp/d.qcow2", "--format", "vdi", "--name", "n", "--store", "/s"},
		{"image", "import", "x.tar", "--format", "raw", "--name", "n"},
		{"image", "import", "x.tar", "--disk", "/tmp/d.qcow2", "--name", "n"},
	} {
		got = nil
		if code, _, errs := f.run(t, "", args...); code == 0 || got != nil {
			t.Errorf("%v: exit %d (%s), imported %v", args, code, errs, got)
		}
	}
	// Without --data-dir or --store: uploaded with the format.
	disk := filepath.Join(t.TempDir(), "d.raw")
	os.WriteFile(disk, []byte("disk bytes"), 0o644)
	f.run(t, "", "image", "import", "--disk", disk, "--name", "up:1")
	r := f.last("POST", "/v1/images:import")
	if q := url.Values(r.Query); q.Get("name") != "up:1" || q.Get("disk") != "raw" || string(r.Body) != "disk bytes" {
		t.Fatalf("upload: query %v, body %q", r.Query, r.Body)
	}
}
