package warren

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

const testToken = "tok-123"

// newServer starts an httptest server whose handler first checks the bearer
// token (except on /healthz) and returns a client with fast retries.
func newServer(t *testing.T, h http.HandlerFunc) (*Client, *httptest.Server) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" && r.Header.Get("Authorization") != "Bearer "+testToken {
			writeErr(w, 401, api.CodeUnauthorized, "bad token")
			return
		}
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return New(srv.URL, testToken, WithRetry(4, time.Millisecond, 5*time.Millisecond)), srv
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, api.ErrorBody{Error: api.Error{Code: code, Message: msg}})
}

func TestCreateRetriesWithSameIdempotencyKey(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/sandboxes" {
			t.Errorf("unexpected %s %s", r.Method, r.URL.Path)
		}
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("content-type %q", ct)
		}
		var req api.CreateSandboxRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Image != "busybox" || req.CPU != 2 || req.Labels["a"] != "b" {
			t.Errorf("body %+v err %v", req, err)
		}
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		n := len(keys)
		mu.Unlock()
		switch n {
		case 1:
			writeErr(w, 503, api.CodeUnavailable, "edge busy")
		case 2:
			w.Header().Set("Retry-After", "0")
			writeErr(w, 429, api.CodeTooManyRequests, "slow down")
		default:
			writeJSON(w, 201, api.Sandbox{ID: "sb-n1-abc", State: api.StateRunning, Image: req.Image})
		}
	})
	sb, err := c.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox", CPU: 2, Labels: map[string]string{"a": "b"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != "sb-n1-abc" || sb.State != api.StateRunning {
		t.Fatalf("sandbox %+v", sb)
	}
	if len(keys) != 3 || keys[0] == "" || keys[0] != keys[1] || keys[1] != keys[2] {
		t.Fatalf("idempotency keys %q", keys)
	}
	// A second Create uses a different key.
	if _, err := c.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox", CPU: 2, Labels: map[string]string{"a": "b"}}); err != nil {
		t.Fatal(err)
	}
	if keys[3] == keys[0] {
		t.Fatal("key reused across calls")
	}
}

func TestRetriesGiveUp(t *testing.T) {
	var n atomic.Int32
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		writeErr(w, 503, api.CodeUnavailable, "down")
	})
	_, err := c.Get(context.Background(), "sb-x")
	if !IsUnavailable(err) || StatusOf(err) != 503 {
		t.Fatalf("err %v", err)
	}
	if n.Load() != 4 {
		t.Fatalf("attempts %d, want 4", n.Load())
	}
}

// TestUnavailableReason: a 503's reason reaches the caller, on the SDK's
// error and on the wire error it unwraps to.
func TestUnavailableReason(t *testing.T) {
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 503, api.ErrorBody{Error: api.Error{Code: api.CodeUnavailable, Reason: api.ReasonCPU,
			Message: "no node can take this sandbox now: not enough cpu"}})
	})
	_, err := c.Create(context.Background(), api.CreateSandboxRequest{Image: "busybox"})
	var ae *APIError
	var we *api.Error
	if !errors.As(err, &ae) || ae.Reason != api.ReasonCPU || !errors.As(err, &we) || we.Reason != api.ReasonCPU {
		t.Fatalf("err %v (%+v, %+v)", err, ae, we)
	}
}

func TestExecNotRetried(t *testing.T) {
	var n atomic.Int32
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		writeErr(w, 503, api.CodeUnavailable, "down")
	})
	if _, err := c.Exec(context.Background(), "sb-x", api.ExecRequest{Cmd: "true"}); !IsUnavailable(err) {
		t.Fatalf("err %v", err)
	}
	if n.Load() != 1 {
		t.Fatalf("exec attempted %d times", n.Load())
	}
}

func TestRetryOnConnectionRefused(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens now: connection refused

	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, api.Sandbox{ID: "sb-n1-up"})
	})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(30 * time.Millisecond)
		l2, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("relisten: %v", err)
			return
		}
		_ = srv.Serve(l2)
	}()
	t.Cleanup(func() { srv.Close(); <-done })

	c := New("http://"+addr, testToken, WithRetry(40, 5*time.Millisecond, 10*time.Millisecond))
	sb, err := c.Get(context.Background(), "sb-n1-up")
	if err != nil {
		t.Fatal(err)
	}
	if sb.ID != "sb-n1-up" {
		t.Fatalf("got %+v", sb)
	}
}

func TestErrors(t *testing.T) {
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/sandboxes/missing":
			writeErr(w, 404, api.CodeNotFound, "no such sandbox")
		case "/v1/sandboxes/proxy":
			w.WriteHeader(502)
			fmt.Fprint(w, "bad gateway\n")
		}
	})
	_, err := c.Get(context.Background(), "missing")
	var ae *APIError
	if !errors.As(err, &ae) || ae.Status != 404 || ae.Code != api.CodeNotFound || ae.Message != "no such sandbox" || !IsNotFound(err) {
		t.Fatalf("err %#v", err)
	}
	var we *api.Error
	if !errors.As(err, &we) || we.Code != api.CodeNotFound {
		t.Fatalf("errors.As api.Error: %v", err)
	}
	_, err = New(c.URL(), "wrong").Get(context.Background(), "missing")
	if !IsUnauthorized(err) {
		t.Fatalf("want unauthorized, got %v", err)
	}
	c2 := New(c.URL(), testToken, WithRetry(1, 0, 0))
	_, err = c2.Get(context.Background(), "proxy")
	if !errors.As(err, &ae) || ae.Status != 502 || ae.Code != api.CodeUnavailable || ae.Message != "bad gateway" {
		t.Fatalf("err %#v", err)
	}
}

func TestListGetDelete(t *testing.T) {
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == "GET" && r.URL.Path == "/v1/sandboxes":
			q := r.URL.Query()
			if got := q["label"]; len(got) != 2 || got[0] != "a=1" || got[1] != "b=2" || q.Get("state") != "running" {
				t.Errorf("query %v", q)
			}
			writeJSON(w, 200, api.SandboxList{Sandboxes: []api.Sandbox{{ID: "sb-1"}, {ID: "sb-2"}}})
		case r.Method == "GET" && r.URL.Path == "/v1/sandboxes/sb-1":
			writeJSON(w, 200, api.Sandbox{ID: "sb-1", State: "running"})
		case r.Method == "DELETE" && r.URL.Path == "/v1/sandboxes/sb-1":
			writeJSON(w, 200, api.Sandbox{ID: "sb-1", State: "stopped"})
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL)
		}
	})
	ctx := context.Background()
	l, err := c.List(ctx, ListOptions{Labels: map[string]string{"b": "2", "a": "1"}, State: "running"})
	if err != nil || len(l) != 2 || l[1].ID != "sb-2" {
		t.Fatalf("list %v %v", l, err)
	}
	sb, err := c.Get(ctx, "sb-1")
	if err != nil || sb.State != "running" {
		t.Fatalf("get %v %v", sb, err)
	}
	sb, err = c.Delete(ctx, "sb-1")
	if err != nil || sb.State != "stopped" {
		t.Fatalf("delete %v %v", sb, err)
	}
}

func ndjson(w http.ResponseWriter, lines ...string) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(200)
	for _, l := range lines {
		io.WriteString(w, l+"\n")
		w.(http.Flusher).Flush()
	}
}

func TestExecStream(t *testing.T) {
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/sandboxes/sb-1/exec" || r.Header.Get("Accept") != "application/x-ndjson" {
			t.Errorf("unexpected %s accept %q", r.URL.Path, r.Header.Get("Accept"))
		}
		var req api.ExecRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		switch req.Cmd {
		case "ok":
			ndjson(w, `{"stdout":"hel"}`, `{"stderr":"warn\n"}`, `{"stdout":"lo\n"}`, `{"exit_code":3,"truncated":true,"duration_ms":12.5}`)
		case "fail":
			ndjson(w, `{"stdout":"x"}`, `{"error":{"code":"timeout","message":"agent gone"}}`)
		case "cut":
			ndjson(w, `{"stdout":"x"}`)
		case "json":
			writeJSON(w, 200, api.ExecResult{ExitCode: 0, Stdout: "plain\n", DurationMs: 1})
		}
	})
	ctx := context.Background()
	var out, errb bytes.Buffer
	res, err := c.ExecStream(ctx, "sb-1", api.ExecRequest{Cmd: "ok"}, &out, &errb)
	if err != nil {
		t.Fatal(err)
	}
	if out.String() != "hello\n" || errb.String() != "warn\n" || res.ExitCode != 3 || !res.Truncated || res.DurationMs != 12.5 {
		t.Fatalf("out %q err %q res %+v", out.String(), errb.String(), res)
	}
	_, err = c.ExecStream(ctx, "sb-1", api.ExecRequest{Cmd: "fail"}, nil, nil)
	if !IsTimeout(err) || StatusOf(err) != 504 {
		t.Fatalf("err %v", err)
	}
	_, err = c.ExecStream(ctx, "sb-1", api.ExecRequest{Cmd: "cut"}, nil, nil)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("err %v", err)
	}
	out.Reset()
	res, err = c.ExecStream(ctx, "sb-1", api.ExecRequest{Cmd: "json"}, &out, nil)
	if err != nil || out.String() != "plain\n" || res.Stdout != "" {
		t.Fatalf("json fallback: %q %+v %v", out.String(), res, err)
	}
	// The callback can stop the stream.
	stop := errors.New("stop")
	_, err = c.ExecStreamFunc(ctx, "sb-1", api.ExecRequest{Cmd: "ok"}, func(api.ExecEvent) error { return stop })
	if !errors.Is(err, stop) {
		t.Fatalf("err %v", err)
	}
}

func TestExecAndCommands(t *testing.T) {
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/sandboxes/sb-1/exec":
			var req api.ExecRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			if !req.Background || len(req.Argv) != 2 || req.Env["K"] != "V" {
				t.Errorf("req %+v", req)
			}
			writeJSON(w, 202, api.ExecResult{CommandID: "c1"})
		case "/v1/sandboxes/sb-1/commands/c1":
			if r.URL.Query().Get("wait") != "1" {
				t.Errorf("wait missing: %v", r.URL)
			}
			code := 0
			writeJSON(w, 200, api.Command{ID: "c1", ExitCode: &code, Stdout: "done"})
		case "/v1/sandboxes/sb-1/commands/c1/kill":
			var body map[string]int
			_ = json.NewDecoder(r.Body).Decode(&body)
			if body["signal"] != 9 {
				t.Errorf("kill body %v", body)
			}
			writeJSON(w, 200, api.Command{ID: "c1", Running: true})
		}
	})
	ctx := context.Background()
	res, err := c.Exec(ctx, "sb-1", api.ExecRequest{Argv: []string{"sleep", "1"}, Env: map[string]string{"K": "V"}, Background: true})
	if err != nil || res.CommandID != "c1" {
		t.Fatalf("%+v %v", res, err)
	}
	cmd, err := c.Command(ctx, "sb-1", "c1", true)
	if err != nil || cmd.ExitCode == nil || *cmd.ExitCode != 0 || cmd.Stdout != "done" {
		t.Fatalf("%+v %v", cmd, err)
	}
	cmd, err = c.KillCommand(ctx, "sb-1", "c1", 9)
	if err != nil || !cmd.Running {
		t.Fatalf("%+v %v", cmd, err)
	}
}

func TestFiles(t *testing.T) {
	var puts atomic.Int32
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		switch {
		case r.Method == "PUT" && r.URL.Path == "/v1/sandboxes/sb-1/files":
			b, _ := io.ReadAll(r.Body)
			if q.Get("path") != "/w/a b.txt" || q.Get("mode") != "0755" || string(b) != "payload" || r.ContentLength != 7 {
				t.Errorf("put %v %q len %d", q, b, r.ContentLength)
			}
			if puts.Add(1) == 1 { // the first attempt fails: the body must be replayed
				writeErr(w, 503, api.CodeUnavailable, "x")
				return
			}
			writeJSON(w, 200, api.FileInfo{Path: q.Get("path"), Size: int64(len(b)), Mode: 0o755, Type: "file"})
		case r.Method == "GET" && r.URL.Path == "/v1/sandboxes/sb-1/files" && q.Get("list") == "1":
			writeJSON(w, 200, api.FileList{Files: []api.FileInfo{{Name: "a"}, {Name: "b"}}})
		case r.Method == "GET" && r.URL.Path == "/v1/sandboxes/sb-1/files" && q.Get("stat") == "1":
			writeJSON(w, 200, api.FileInfo{Path: q.Get("path"), Type: "dir"})
		case r.Method == "GET" && r.URL.Path == "/v1/sandboxes/sb-1/files":
			w.Header().Set("Content-Type", "application/octet-stream")
			io.WriteString(w, "contents of "+q.Get("path"))
		case r.Method == "DELETE" && r.URL.Path == "/v1/sandboxes/sb-1/files":
			if q.Get("recursive") != "1" {
				t.Errorf("delete %v", q)
			}
			w.WriteHeader(204)
		case r.Method == "POST" && r.URL.Path == "/v1/sandboxes/sb-1/files/mkdir":
			var req api.MkdirRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			writeJSON(w, 200, api.FileInfo{Path: req.Path, Mode: req.Mode, Type: "dir"})
		case r.Method == "POST" && r.URL.Path == "/v1/sandboxes/sb-1/files/rename":
			var req api.RenameRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			if req.From != "/a" || req.To != "/b" {
				t.Errorf("rename %+v", req)
			}
			w.WriteHeader(204)
		case r.Method == "PUT" && r.URL.Path == "/v1/sandboxes/sb-1/archive":
			b, _ := io.ReadAll(r.Body)
			if r.Header.Get("Content-Type") != "application/x-tar" || q.Get("path") != "/w" || string(b) != "TAR" {
				t.Errorf("archive put %v %q", q, b)
			}
			writeJSON(w, 200, map[string]int{"files": 5})
		case r.Method == "GET" && r.URL.Path == "/v1/sandboxes/sb-1/archive":
			w.Header().Set("Content-Type", "application/x-tar")
			io.WriteString(w, "TAR of "+q.Get("path"))
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL)
		}
	})
	ctx := context.Background()
	fi, err := c.WriteFileBytes(ctx, "sb-1", "/w/a b.txt", []byte("payload"), 0o755)
	if err != nil || fi.Size != 7 || puts.Load() != 2 {
		t.Fatalf("write %+v %v puts %d", fi, err, puts.Load())
	}
	b, err := c.ReadFileBytes(ctx, "sb-1", "/etc/hosts")
	if err != nil || string(b) != "contents of /etc/hosts" {
		t.Fatalf("read %q %v", b, err)
	}
	l, err := c.ListFiles(ctx, "sb-1", "/")
	if err != nil || len(l) != 2 {
		t.Fatalf("list %v %v", l, err)
	}
	fi, err = c.Stat(ctx, "sb-1", "/w")
	if err != nil || fi.Type != "dir" {
		t.Fatalf("stat %+v %v", fi, err)
	}
	if err := c.Remove(ctx, "sb-1", "/w", true); err != nil {
		t.Fatal(err)
	}
	fi, err = c.Mkdir(ctx, "sb-1", api.MkdirRequest{Path: "/x/y", Mode: 0o700, Parents: true})
	if err != nil || fi.Path != "/x/y" || fi.Mode != 0o700 {
		t.Fatalf("mkdir %+v %v", fi, err)
	}
	if err := c.Rename(ctx, "sb-1", "/a", "/b"); err != nil {
		t.Fatal(err)
	}
	n, err := c.UploadArchive(ctx, "sb-1", "/w", strings.NewReader("TAR"))
	if err != nil || n != 5 {
		t.Fatalf("upload %d %v", n, err)
	}
	rc, err := c.DownloadArchive(ctx, "sb-1", "/w")
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(rc)
	rc.Close()
	if string(b) != "TAR of /w" {
		t.Fatalf("download %q", b)
	}
}

func TestNonSeekableBodyNotRetried(t *testing.T) {
	var n atomic.Int32
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		writeErr(w, 503, api.CodeUnavailable, "x")
	})
	pr, pw := io.Pipe()
	go func() { pw.Write([]byte("stream")); pw.Close() }()
	if _, err := c.WriteFile(context.Background(), "sb-1", "/f", pr, 0); !IsUnavailable(err) {
		t.Fatalf("err %v", err)
	}
	if n.Load() != 1 {
		t.Fatalf("attempts %d", n.Load())
	}
}

func TestImagesNodesHealth(t *testing.T) {
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			if r.Header.Get("Authorization") != "" {
				t.Errorf("healthz got a token")
			}
			writeJSON(w, 200, map[string]string{"status": "ok"})
		case "/v1/images":
			writeJSON(w, 200, api.ImageList{Images: []api.Image{{Name: "busybox", Digest: "sha256:ab"}}})
		case "/v1/nodes":
			writeJSON(w, 200, api.NodeList{Nodes: []api.Node{{Name: "n1", State: "up"}}})
		}
	})
	ctx := context.Background()
	if err := c.Health(ctx); err != nil {
		t.Fatal(err)
	}
	im, err := c.Images(ctx)
	if err != nil || len(im) != 1 || im[0].Name != "busybox" {
		t.Fatalf("%v %v", im, err)
	}
	nodes, err := c.Nodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].State != "up" {
		t.Fatalf("%v %v", nodes, err)
	}
}

func TestFromEnvAndTransport(t *testing.T) {
	t.Setenv(EnvURL, "http://example.invalid:1/")
	t.Setenv(EnvToken, "envtok")
	c := FromEnv()
	if c.URL() != "http://example.invalid:1" || c.token != "envtok" {
		t.Fatalf("%q %q", c.URL(), c.token)
	}
	u, tok := ResolveEnv("http://flag", "flagtok")
	if u != "http://flag" || tok != "flagtok" {
		t.Fatalf("flags must win: %q %q", u, tok)
	}
	t.Setenv(EnvURL, "")
	if u, _ := ResolveEnv("", ""); u != DefaultURL {
		t.Fatalf("default url %q", u)
	}
	tr, ok := c.hc.Transport.(*http.Transport)
	if !ok || tr.MaxIdleConnsPerHost < 256 {
		t.Fatalf("transport %#v", c.hc.Transport)
	}
}

func TestContextCancelStopsRetries(t *testing.T) {
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "5")
		writeErr(w, 429, api.CodeTooManyRequests, "x")
	})
	c.maxDelay = time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Get(ctx, "sb-1")
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
		t.Fatalf("err %v after %v", err, time.Since(start))
	}
}

// TestFollowEventsResumes: a broken stream and a 503 are resumed after the
// last event seen; each event reaches fn once and in order; a 401 ends it.
func TestFollowEventsResumes(t *testing.T) {
	var calls atomic.Int32
	var afters []string
	var mu sync.Mutex
	c, _ := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/events" || r.URL.Query().Get("follow") != "1" || r.Header.Get("Accept") != "application/x-ndjson" {
			writeErr(w, 400, api.CodeBadRequest, "unexpected "+r.URL.String())
			return
		}
		mu.Lock()
		afters = append(afters, r.URL.Query().Get("after"))
		mu.Unlock()
		line := func(seq int) string {
			return fmt.Sprintf(`{"seq":%d,"type":"node.down","node":"n%d","time":"2026-01-01T00:00:00Z"}`+"\n", seq, seq)
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		switch calls.Add(1) {
		case 1:
			io.WriteString(w, line(1)+"\n"+line(2)) // then the connection ends
		case 2:
			writeErr(w, 503, api.CodeUnavailable, "restarting")
		default:
			io.WriteString(w, line(2)+line(3)+line(4))
		}
	})
	var got []uint64
	stop := errors.New("stop")
	err := c.FollowEvents(context.Background(), 0, func(ev api.Event) error {
		got = append(got, ev.Seq)
		if ev.Seq == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || fmt.Sprint(got) != "[1 2 3]" {
		t.Fatalf("got %v, err %v", got, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if afters[0] != "" || afters[len(afters)-1] != "2" {
		t.Fatalf("after params %q", afters)
	}

	bad := New(c.URL(), "wrong", WithRetry(2, time.Millisecond, time.Millisecond))
	if err := bad.FollowEvents(context.Background(), 0, func(api.Event) error { return nil }); CodeOf(err) != api.CodeUnauthorized {
		t.Fatalf("bad token: %v", err)
	}
}
