package e2e

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// envdClient speaks envd's wire as the official JS SDK does (e2b.md §1,
// §3, §4): every request to E2B_SANDBOX_URL with E2b-Sandbox-Id,
// E2b-Sandbox-Port and X-Access-Token; Connect unary calls with the JSON
// codec.
type envdClient struct {
	base, id, token string
}

func (c *envdClient) req(t *testing.T, method, path, ctype string, body io.Reader, hdr map[string]string) *e2bAnswer {
	t.Helper()
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", c.id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("User-Agent", "e2b-js-sdk/2.51.0")
	if c.token != "" {
		req.Header.Set("X-Access-Token", c.token)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
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

// rpc makes a Connect unary call and checks its status and, for an error,
// the Connect error body {"code":"<code>","message":...}.
func (c *envdClient) rpc(t *testing.T, method, body string, status int, code string) map[string]any {
	t.Helper()
	a := c.req(t, "POST", "/filesystem.Filesystem/"+method, "application/json", strings.NewReader(body), map[string]string{"Connect-Protocol-Version": "1"})
	if a.status != status {
		t.Fatalf("%s %s: status %d, want %d: %s", method, body, a.status, status, a.body)
	}
	if !strings.HasPrefix(a.header.Get("Content-Type"), "application/json") {
		t.Fatalf("%s: Content-Type %q", method, a.header.Get("Content-Type"))
	}
	var m map[string]any
	a.decode(t, &m)
	if code != "" && m["code"] != code {
		t.Fatalf("%s %s: error %s, want code %q", method, body, a.body, code)
	}
	return m
}

// upload posts files to /files as the SDK does: multipart, field "file",
// filename = the destination path as given.
func (c *envdClient) upload(t *testing.T, query string, files [][2]string) *e2bAnswer {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, f := range files {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename="%s"`, f[0]))
		h.Set("Content-Type", "application/octet-stream")
		pw, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = pw.Write([]byte(f[1]))
	}
	_ = mw.Close()
	return c.req(t, "POST", "/files"+query, mw.FormDataContentType(), &buf, nil)
}

func entryOfAnswer(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	e, ok := m["entry"].(map[string]any)
	if !ok {
		t.Fatalf("no entry in %v", m)
	}
	return e
}

// TestE2BEnvdFiles drives the filesystem part of envd (Connect RPC with
// the JSON codec, /files, /health) on the E2B origin as the SDK does, and
// checks that another project's key reaches nothing.
func TestE2BEnvdFiles(t *testing.T) {
	parallel(t)
	e2bAddr := freePort(t)
	s := startServer(t, "--e2b-listen", e2bAddr)
	ctx := context.Background()
	base := "http://" + e2bAddr
	for _, p := range []string{"fa", "fb"} {
		if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: p}); err != nil {
			t.Fatal(err)
		}
	}
	key := func(project string) string {
		tk, err := s.C.CreateToken(ctx, api.CreateTokenRequest{Principal: "envd-" + project, Project: project})
		if err != nil {
			t.Fatal(err)
		}
		return "e2b_" + hex.EncodeToString([]byte(tk.Secret))
	}
	keyA, keyB := key("fa"), key("fb")
	a := &e2bClient{base: base, key: keyA}
	e := a.createEnvd(t, "create", `{"templateID":"busybox"}`, s.C)
	// The access token is the sandbox's own (E2B's secure sandbox), not
	// the project's key handed back.
	if !strings.HasPrefix(e.token, "wsat_") || strings.Contains(e.token, keyA[4:]) {
		t.Fatalf("envdAccessToken %q: want a token of the sandbox's own, not the key", e.token)
	}

	if a := e.req(t, "GET", "/health", "", nil, nil); a.status != 204 {
		t.Fatalf("health: %d %s", a.status, a.body)
	}
	// MakeDir, then again: already_exists (the SDK returns false).
	d := entryOfAnswer(t, e.rpc(t, "MakeDir", `{"path":"/work/dir"}`, 200, ""))
	if d["type"] != "FILE_TYPE_DIRECTORY" || d["path"] != "/work/dir" || d["name"] != "dir" {
		t.Fatalf("MakeDir entry: %v", d)
	}
	e.rpc(t, "MakeDir", `{"path":"/work/dir"}`, 409, "already_exists")

	// Upload: one file (?path= wins), many (no path; filenames are the
	// destinations, parents made), octet-stream with gzip, relative path.
	up := e.upload(t, "?path=%2Fwork%2Fdir%2Fa.txt", [][2]string{{"/work/dir/a.txt", "hello"}})
	up.wantStatus(t, "upload one", 200)
	var infos []map[string]string
	up.decode(t, &infos)
	if len(infos) != 1 || infos[0]["name"] != "a.txt" || infos[0]["type"] != "file" || infos[0]["path"] != "/work/dir/a.txt" {
		t.Fatalf("upload answer: %s", up.body)
	}
	up = e.upload(t, "", [][2]string{{"/work/dir/b.txt", "bee"}, {"/work/sub/deep/c.txt", "sea"}})
	up.wantStatus(t, "upload many", 200)
	up.decode(t, &infos)
	if len(infos) != 2 || infos[1]["path"] != "/work/sub/deep/c.txt" {
		t.Fatalf("multi upload answer: %s", up.body)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte("zipped"))
	_ = zw.Close()
	e.req(t, "POST", "/files?path=%2Fwork%2Fz.txt", "application/octet-stream", &gz, map[string]string{"Content-Encoding": "gzip"}).wantStatus(t, "octet-stream gzip upload", 200)
	e.req(t, "POST", "/files", "application/octet-stream", strings.NewReader("x"), nil).wantStatus(t, "octet-stream without path", 400)
	up = e.upload(t, "", [][2]string{{"rel.txt", "relative"}})
	up.wantStatus(t, "relative upload", 200)
	up.decode(t, &infos)
	if infos[0]["path"] != "/root/rel.txt" {
		t.Fatalf("a relative path resolves against the home: %s", up.body)
	}

	// Download.
	for p, want := range map[string]string{"/work/dir/a.txt": "hello", "/work/sub/deep/c.txt": "sea", "/work/z.txt": "zipped", "rel.txt": "relative"} {
		r := e.req(t, "GET", "/files?path="+strings.ReplaceAll(p, "/", "%2F"), "", nil, nil)
		if r.status != 200 || string(r.body) != want || r.header.Get("Content-Type") != "application/octet-stream" {
			t.Fatalf("read %s: %d %q %q", p, r.status, r.body, r.header.Get("Content-Type"))
		}
	}
	e.req(t, "GET", "/files?path=%2Fwork%2Fnope", "", nil, nil).wantStatus(t, "read missing", 404)
	e.req(t, "GET", "/files?path=%2Fwork%2Fdir", "", nil, nil).wantStatus(t, "read a directory", 400)

	// Stat, ListDir (depth), Move, Remove.
	st := entryOfAnswer(t, e.rpc(t, "Stat", `{"path":"/work/dir/a.txt"}`, 200, ""))
	if st["type"] != "FILE_TYPE_FILE" || fmt.Sprint(st["size"]) != "5" || st["mode"] != float64(0o644) || st["permissions"] != "-rw-r--r--" || st["modifiedTime"] == nil {
		t.Fatalf("Stat entry: %v", st)
	}
	e.rpc(t, "Stat", `{"path":"/work/nope"}`, 404, "not_found")
	names := func(m map[string]any) []string {
		var out []string
		for _, x := range m["entries"].([]any) {
			out = append(out, x.(map[string]any)["path"].(string))
		}
		return out
	}
	if got := names(e.rpc(t, "ListDir", `{"path":"/work/dir","depth":1}`, 200, "")); strings.Join(got, ",") != "/work/dir/a.txt,/work/dir/b.txt" {
		t.Fatalf("ListDir depth 1: %v", got)
	}
	if got := strings.Join(names(e.rpc(t, "ListDir", `{"path":"/work","depth":3}`, 200, "")), ","); !strings.Contains(got, "/work/sub/deep/c.txt") || !strings.Contains(got, "/work/z.txt") {
		t.Fatalf("ListDir depth 3: %v", got)
	}
	mv := entryOfAnswer(t, e.rpc(t, "Move", `{"source":"/work/dir/a.txt","destination":"/work/dir/moved.txt"}`, 200, ""))
	if mv["path"] != "/work/dir/moved.txt" {
		t.Fatalf("Move entry: %v", mv)
	}
	e.rpc(t, "Stat", `{"path":"/work/dir/a.txt"}`, 404, "not_found")
	e.rpc(t, "Remove", `{"path":"/work/sub"}`, 200, "")
	e.rpc(t, "Stat", `{"path":"/work/sub/deep/c.txt"}`, 404, "not_found")

	// The token opens its own sandbox only, even in the same project; the
	// project's key works too; connect answers the same token.
	e2 := a.createEnvd(t, "create a second", `{"templateID":"busybox","secure":false}`, s.C)
	if e2.token == "" || e2.token == e.token {
		t.Fatalf("second sandbox's token %q (first %q): want one of its own, also when not secure", e2.token, e.token)
	}
	crossed := &envdClient{base: base, id: e2.id, token: e.token}
	crossed.rpc(t, "Stat", `{"path":"/"}`, 401, "unauthenticated")
	crossed.req(t, "GET", "/health", "", nil, nil).wantStatus(t, "another sandbox's token", 401)
	if r := crossed.req(t, "GET", "/files?path=%2Fetc%2Fpasswd", "", nil, nil); r.status != 401 {
		t.Fatalf("read with another sandbox's token: %d %s", r.status, r.body)
	}
	(&envdClient{base: base, id: e2.id, token: keyA}).req(t, "GET", "/health", "", nil, nil).wantStatus(t, "the project's key", 204)
	(&envdClient{base: base, id: e2.id, token: e2.token}).req(t, "GET", "/health", "", nil, nil).wantStatus(t, "its own token", 204)
	var conn struct {
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	a.do(t, "POST", "/sandboxes/"+e.id+"/connect", `{"timeout":300}`).decode(t, &conn)
	if conn.EnvdAccessToken != e.token {
		t.Fatalf("connect answered token %q, create %q", conn.EnvdAccessToken, e.token)
	}
	// A token forged in the token's shape is refused.
	(&envdClient{base: base, id: e.id, token: "wsat_" + strings.Repeat("A", 43)}).req(t, "GET", "/health", "", nil, nil).wantStatus(t, "a forged token", 401)

	// Another project's key, no key, an unknown sandbox; the process
	// service is not served yet.
	other := &envdClient{base: base, id: e.id, token: keyB}
	other.rpc(t, "Stat", `{"path":"/work/dir/moved.txt"}`, 404, "not_found")
	other.rpc(t, "Remove", `{"path":"/work"}`, 404, "not_found")
	if r := other.req(t, "GET", "/files?path=%2Fwork%2Fdir%2Fmoved.txt", "", nil, nil); r.status != 404 || strings.Contains(string(r.body), "hello") {
		t.Fatalf("another project read the file: %d %s", r.status, r.body)
	}
	other.upload(t, "?path=%2Fwork%2Fx", [][2]string{{"/work/x", "evil"}}).wantStatus(t, "another project's upload", 404)
	other.req(t, "GET", "/health", "", nil, nil).wantStatus(t, "another project's health", 502)
	anon := &envdClient{base: base, id: e.id}
	anon.rpc(t, "Stat", `{"path":"/work"}`, 401, "unauthenticated")
	anon.req(t, "GET", "/health", "", nil, nil).wantStatus(t, "health without token", 401)
	(&envdClient{base: base, id: "sb-e2e-nosuchsandbox00", token: keyA}).req(t, "GET", "/health", "", nil, nil).wantStatus(t, "unknown sandbox health", 502)
	if r := other.req(t, "POST", "/process.Process/List", "application/json", strings.NewReader(`{}`), map[string]string{"Connect-Protocol-Version": "1"}); r.status != 404 || !strings.Contains(string(r.body), `"not_found"`) {
		t.Fatalf("another project's process list: %d %s", r.status, r.body)
	}
	if b, err := s.C.ReadFileBytes(ctx, e.id, "/work/dir/moved.txt"); err != nil || string(b) != "hello" {
		t.Fatalf("after the other project's calls: %q %v", b, err)
	}
}

// createEnvd creates a sandbox through the E2B front (the test fails
// unless it answers 201), deleted through c at the test's end, and returns
// an envd client of it with its access token.
func (a *e2bClient) createEnvd(t *testing.T, what, body string, c *warren.Client) *envdClient {
	t.Helper()
	ans := a.do(t, "POST", "/v2/sandboxes", body)
	ans.wantStatus(t, what, 201)
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	ans.decode(t, &sb)
	t.Cleanup(func() { _, _ = c.Delete(context.Background(), sb.SandboxID) })
	return &envdClient{base: a.base, id: sb.SandboxID, token: sb.EnvdAccessToken}
}

// envdStream is one server-streaming Connect call (application/connect+json):
// the request is one enveloped message; frames are read as they come.
type envdStream struct {
	resp *http.Response
	rd   *bufio.Reader
}

func (c *envdClient) stream(t *testing.T, method, body string, hdr map[string]string) *envdStream {
	t.Helper()
	var env bytes.Buffer
	env.WriteByte(0)
	_ = binary.Write(&env, binary.BigEndian, uint32(len(body)))
	env.WriteString(body)
	req, err := http.NewRequest("POST", c.base+"/process.Process/"+method, &env)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", c.id)
	req.Header.Set("X-Access-Token", c.token)
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Keepalive-Ping-Interval", "50")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s: %d %q %s", method, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return &envdStream{resp: resp, rd: bufio.NewReader(resp.Body)}
}

// next reads one frame: its flags and JSON.
func (st *envdStream) next(t *testing.T) (byte, map[string]any) {
	t.Helper()
	var hdr [5]byte
	if _, err := io.ReadFull(st.rd, hdr[:]); err != nil {
		t.Fatalf("reading a frame: %v", err)
	}
	b := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
	if _, err := io.ReadFull(st.rd, b); err != nil {
		t.Fatalf("reading a frame: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("frame %q: %v", b, err)
	}
	return hdr[0], m
}

// event reads the next data frame's event, skipping keepalives.
func (st *envdStream) event(t *testing.T) map[string]any {
	t.Helper()
	for {
		flags, m := st.next(t)
		if flags != 0 {
			t.Fatalf("end of stream before an event: %v", m)
		}
		ev := m["event"].(map[string]any)
		if _, ok := ev["keepalive"]; !ok {
			return ev
		}
	}
}

// rest reads data events until the end-of-stream frame, which must be {}.
func (st *envdStream) rest(t *testing.T) (stdout, stderr string, end map[string]any) {
	t.Helper()
	for {
		flags, m := st.next(t)
		if flags == 2 {
			if len(m) != 0 {
				t.Fatalf("end of stream with an error: %v", m)
			}
			if end == nil {
				t.Fatal("the stream ended without an end event")
			}
			return stdout, stderr, end
		}
		ev := m["event"].(map[string]any)
		if d, ok := ev["data"].(map[string]any); ok {
			for k, v := range d {
				b, _ := base64.StdEncoding.DecodeString(v.(string))
				if k == "stdout" {
					stdout += string(b)
				} else {
					stderr += string(b)
				}
			}
		}
		if e, ok := ev["end"].(map[string]any); ok {
			end = e
		}
	}
}

// TestE2BEnvdProcess runs commands through envd's process service as the
// SDK does: commands.run (exit code, stdout, stderr, envs, cwd), a
// background command listed and killed by pid, Connect to it,
// Connect-Timeout-Ms killing a command, and live stdin (SendInput,
// CloseStdin, SIGTERM, bad input to Update and SendInput).
func TestE2BEnvdProcess(t *testing.T) {
	parallel(t)
	e2bAddr := freePort(t)
	s := startServer(t, "--e2b-listen", e2bAddr)
	base := "http://" + e2bAddr
	a := &e2bClient{base: base, key: s.Token}
	e := a.createEnvd(t, "create", `{"templateID":"busybox","envVars":{"SBX":"sandbox"}}`, s.C)

	st := e.stream(t, "Start", `{"process":{"cmd":"/bin/sh","args":["-c","echo hi $SBX $FOO; pwd; echo oops >&2; exit 3"],"envs":{"FOO":"bar"}},"stdin":false}`, map[string]string{"Connect-Timeout-Ms": "60000"})
	ev := st.event(t)
	start, ok := ev["start"].(map[string]any)
	if !ok || start["pid"] == nil || start["pid"].(float64) <= 0 {
		t.Fatalf("the first event is not start with a pid: %v", ev)
	}
	out, errOut, end := st.rest(t)
	if out != "hi sandbox bar\n/root\n" || errOut != "oops\n" {
		t.Fatalf("run: stdout %q stderr %q", out, errOut)
	}
	if end["exitCode"] != float64(3) || end["exited"] != true || end["status"] != "exit status 3" || end["error"] != "exit status 3" {
		t.Fatalf("end event: %v", end)
	}

	// A background command: listed, reachable by Connect, killed by pid;
	// its stream ends with "signal: killed".
	bg := e.stream(t, "Start", `{"process":{"cmd":"/bin/sh","args":["-c","sleep 600"]},"stdin":false}`, nil)
	pid := bg.event(t)["start"].(map[string]any)["pid"].(float64)
	list := e.req(t, "POST", "/process.Process/List", "application/json", strings.NewReader(`{}`), map[string]string{"Connect-Protocol-Version": "1"})
	if list.status != 200 || !strings.Contains(string(list.body), fmt.Sprintf(`"pid":%d`, int64(pid))) || !strings.Contains(string(list.body), "sleep 600") {
		t.Fatalf("List: %d %s", list.status, list.body)
	}
	cn := e.stream(t, "Connect", fmt.Sprintf(`{"process":{"pid":%d}}`, int64(pid)), nil)
	if got := cn.event(t)["start"].(map[string]any)["pid"].(float64); got != pid {
		t.Fatalf("Connect started with pid %v, want %v", got, pid)
	}
	sig := e.req(t, "POST", "/process.Process/SendSignal", "application/json", strings.NewReader(fmt.Sprintf(`{"process":{"pid":%d},"signal":"SIGNAL_SIGKILL"}`, int64(pid))), map[string]string{"Connect-Protocol-Version": "1"})
	if sig.status != 200 || string(bytes.TrimSpace(sig.body)) != "{}" {
		t.Fatalf("SendSignal: %d %s", sig.status, sig.body)
	}
	for _, stm := range []*envdStream{bg, cn} {
		if _, _, end := stm.rest(t); end["status"] != "signal: killed" || end["exited"] == true || end["exitCode"] != float64(-1) {
			t.Fatalf("killed command's end: %v", end)
		}
	}
	sig = e.req(t, "POST", "/process.Process/SendSignal", "application/json", strings.NewReader(fmt.Sprintf(`{"process":{"pid":%d},"signal":"SIGNAL_SIGKILL"}`, int64(pid))), map[string]string{"Connect-Protocol-Version": "1"})
	if sig.status != 404 || !strings.Contains(string(sig.body), `"not_found"`) {
		t.Fatalf("SendSignal to an ended process: %d %s", sig.status, sig.body)
	}

	// Connect-Timeout-Ms: the command is killed when the deadline passes.
	t0 := time.Now()
	dl := e.stream(t, "Start", `{"process":{"cmd":"/bin/sh","args":["-c","sleep 60; echo late"]},"stdin":false}`, map[string]string{"Connect-Timeout-Ms": "2000"})
	dl.event(t)
	for {
		flags, m := dl.next(t)
		if flags == 2 {
			if !strings.Contains(fmt.Sprint(m), "deadline_exceeded") && !strings.Contains(fmt.Sprint(m), "signal: killed") {
				t.Fatalf("end of a command past its deadline: %v", m)
			}
			break
		}
	}
	if el := time.Since(t0); el > 20*time.Second {
		t.Fatalf("the deadline took %v", el)
	}
	if l := e.req(t, "POST", "/process.Process/List", "application/json", strings.NewReader(`{}`), map[string]string{"Connect-Protocol-Version": "1"}); strings.Contains(string(l.body), "sleep 60") {
		t.Fatalf("the command past its deadline still runs: %s", l.body)
	}

	// stdin: true: live input (SendInput), its end (CloseStdin), SIGTERM
	// reaching the command itself; bad input to the live RPCs.
	rpc := func(method, body string) *e2bAnswer {
		return e.req(t, "POST", "/process.Process/"+method, "application/json", strings.NewReader(body), map[string]string{"Connect-Protocol-Version": "1"})
	}
	live := e.stream(t, "Start", `{"process":{"cmd":"/bin/sh","args":["-c","cat; echo done"]},"stdin":true}`, nil)
	lpid := int64(live.event(t)["start"].(map[string]any)["pid"].(float64))
	for _, c := range []struct{ method, body, code string }{
		{"Update", fmt.Sprintf(`{"process":{"pid":%d},"pty":{"size":{"cols":100,"rows":30}}}`, lpid), "failed_precondition"},
		{"Update", fmt.Sprintf(`{"process":{"pid":%d}}`, lpid), "invalid_argument"},
		{"SendInput", `{"process":{"pid":999999},"input":{"stdin":"aGkK"}}`, "not_found"},
	} {
		if r := rpc(c.method, c.body); r.status != 400 && r.status != 404 || !strings.Contains(string(r.body), `"`+c.code+`"`) {
			t.Fatalf("%s %s: %d %s, want %s", c.method, c.body, r.status, r.body, c.code)
		}
	}
	if r := rpc("SendInput", fmt.Sprintf(`{"process":{"pid":%d},"input":{"stdin":"aGkK"}}`, lpid)); r.status != 200 {
		t.Fatalf("SendInput: %d %s", r.status, r.body)
	}
	if r := rpc("CloseStdin", fmt.Sprintf(`{"process":{"pid":%d}}`, lpid)); r.status != 200 {
		t.Fatalf("CloseStdin: %d %s", r.status, r.body)
	}
	if out, _, end := live.rest(t); out != "hi\ndone\n" || end["status"] != "exit status 0" {
		t.Fatalf("live stdin: %q %v", out, end)
	}
	if r := rpc("SendInput", fmt.Sprintf(`{"process":{"pid":%d},"input":{"stdin":"aGkK"}}`, lpid)); r.status != 404 {
		t.Fatalf("SendInput to an ended process: %d %s", r.status, r.body)
	}
	bad := e.stream(t, "Start", `{"process":{"cmd":"/bin/sh"},"pty":{"size":{"cols":0,"rows":24}}}`, nil)
	if flags, m := bad.next(t); flags != 2 || !strings.Contains(fmt.Sprint(m), "invalid_argument") {
		t.Fatalf("Start with a 0-column PTY: %d %v", flags, m)
	}
	term := e.stream(t, "Start", `{"process":{"cmd":"/bin/sh","args":["-c","exec sleep 600"]},"stdin":true}`, nil)
	tpid := int64(term.event(t)["start"].(map[string]any)["pid"].(float64))
	if r := rpc("SendSignal", fmt.Sprintf(`{"process":{"pid":%d},"signal":"SIGNAL_SIGTERM"}`, tpid)); r.status != 200 {
		t.Fatalf("SendSignal SIGTERM: %d %s", r.status, r.body)
	}
	if _, _, end := term.rest(t); end["status"] != "signal: terminated" || end["exitCode"] != float64(-1) {
		t.Fatalf("end of a SIGTERMed live command: %v", end)
	}
}
