package e2e

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// rawStream posts raw bytes to a streaming Connect method and returns the
// status, Content-Type and whole body (the test bounds how long it takes).
func (c *envdClient) rawStream(t *testing.T, method string, body []byte) (int, string, []byte) {
	t.Helper()
	req, err := http.NewRequest("POST", c.base+"/process.Process/"+method, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", c.id)
	req.Header.Set("X-Access-Token", c.token)
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	hc := &http.Client{Timeout: 30 * time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), b
}

func envelope(flags byte, size uint32, payload string) []byte {
	var b bytes.Buffer
	b.WriteByte(flags)
	_ = binary.Write(&b, binary.BigEndian, size)
	b.WriteString(payload)
	return b.Bytes()
}

// TestE2BEnvdBadInput sends envd what no SDK sends: malformed and huge
// Connect messages and frames, unknown methods, wrong content types, and
// paths that try to leave the sandbox. Every answer is a Connect error
// (or E2B's JSON error) with a 4xx status or an error end-of-stream
// frame; none is a 500, none hangs, and nothing outside the sandbox is
// reached.
func TestE2BEnvdBadInput(t *testing.T) {
	parallel(t)
	e2bAddr := freePort(t)
	s := startServer(t, "--e2b-listen", e2bAddr)
	base := "http://" + e2bAddr
	a := &e2bClient{base: base, key: s.Token}
	e := a.createEnvd(t, "create", `{"templateID":"busybox"}`, s.C)
	connectErr := func(what string, r *e2bAnswer, status int, code string) {
		t.Helper()
		if r.status != status || !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") || !strings.Contains(string(r.body), `"code":"`+code+`"`) {
			t.Fatalf("%s: %d %q %s, want %d %s", what, r.status, r.header.Get("Content-Type"), r.body, status, code)
		}
	}
	unary := func(method, ctype string, body []byte) *e2bAnswer {
		return e.req(t, "POST", method, ctype, bytes.NewReader(body), map[string]string{"Connect-Protocol-Version": "1"})
	}

	// Unary: malformed JSON, a wrong field type, a huge message.
	connectErr("malformed JSON", unary("/filesystem.Filesystem/Stat", "application/json", []byte(`{"path":`)), 400, "invalid_argument")
	connectErr("wrong field type", unary("/filesystem.Filesystem/ListDir", "application/json", []byte(`{"path":"/","depth":"deep"}`)), 400, "invalid_argument")
	huge := []byte(`{"path":"` + strings.Repeat("a", 8<<20) + `"}`)
	if r := unary("/filesystem.Filesystem/Stat", "application/json", huge); r.status >= 500 || r.status < 400 {
		t.Fatalf("a huge unary message: %d %s", r.status, r.body[:min(len(r.body), 200)])
	}
	// An unknown method, a wrong content type.
	if r := unary("/process.Process/Nope", "application/json", []byte(`{}`)); (r.status != 404 && r.status != 501) || !strings.Contains(string(r.body), `"code":"unimplemented"`) {
		t.Fatalf("unknown method: %d %q %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	if r := unary("/filesystem.Filesystem/Stat", "text/plain", []byte(`{"path":"/"}`)); r.status != 415 && (r.status < 400 || r.status >= 500) {
		t.Fatalf("a wrong content type: %d %s", r.status, r.body)
	}

	// Streams: a frame claiming 4 GiB, a truncated frame, a compressed
	// frame, garbage. Each ends with an error, as a 4xx or as HTTP 200 and
	// an error end-of-stream frame, promptly.
	for name, body := range map[string][]byte{
		"frame claiming 4 GiB": envelope(0, 0xffffffff, `{"process":{"cmd":"/bin/sh"}}`),
		"truncated frame":      envelope(0, 100, `{"process":`),
		"compressed frame":     envelope(1, 2, `{}`),
		"garbage":              []byte("not a connect envelope at all"),
		"malformed message":    envelope(0, 9, `{"proc":[`),
		"no cmd":               envelope(0, 2, `{}`),
	} {
		t0 := time.Now()
		status, ctype, b := e.rawStream(t, "Start", body)
		if time.Since(t0) > 20*time.Second {
			t.Fatalf("%s: took %v", name, time.Since(t0))
		}
		switch {
		case status == 200 && ctype == "application/connect+json" && len(b) >= 5 && b[0] == 2 && strings.Contains(string(b), `"error"`):
		case status >= 400 && status < 500:
		default:
			t.Fatalf("%s: %d %q %q", name, status, ctype, b[:min(len(b), 300)])
		}
	}
	if r := e.req(t, "POST", "/process.Process/Start", "application/connect+json", bytes.NewReader(envelope(0, 1<<24, strings.Repeat("x", 1<<24))), map[string]string{"Connect-Protocol-Version": "1"}); r.status >= 500 || (r.status == 200 && !strings.Contains(string(r.body), `"error"`)) {
		t.Fatalf("a 16 MiB frame: %d %s", r.status, r.body[:min(len(r.body), 300)])
	}

	// Paths that climb out resolve inside the sandbox: its /etc has no
	// debian_version (the host's has), a symlink to it dangles.
	e.req(t, "GET", "/files?path=..%2F..%2F..%2F..%2F..%2Fetc%2Fdebian_version", "", nil, nil).wantStatus(t, "read climbing out", 404)
	e.req(t, "GET", "/files?path=%2F..%2F..%2Fetc%2Fdebian_version", "", nil, nil).wantStatus(t, "read /../..", 404)
	s.sh(t, e.id, "ln -s /etc/debian_version /tmp/out; ln -s ../../../../../etc /tmp/up")
	e.req(t, "GET", "/files?path=%2Ftmp%2Fout", "", nil, nil).wantStatus(t, "read a symlink out", 404)
	e.req(t, "GET", "/files?path=%2Ftmp%2Fup%2Fdebian_version", "", nil, nil).wantStatus(t, "read through a symlink out", 404)
	connectErr("stat climbing out", unary("/filesystem.Filesystem/Stat", "application/json", []byte(`{"path":"../../../../etc/debian_version"}`)), 404, "not_found")
	up := e.upload(t, "?path=..%2F..%2F..%2F..%2Ftmp%2Fescaped.txt", [][2]string{{"x", "inside"}})
	up.wantStatus(t, "upload climbing out", 200)
	if b, err := s.C.ReadFileBytes(t.Context(), e.id, "/tmp/escaped.txt"); err != nil || string(b) != "inside" {
		t.Fatalf("an upload climbing out landed elsewhere: %q %v", b, err)
	}
	// A path with a NUL byte, an empty path.
	if r := e.req(t, "GET", "/files?path=%2Ftmp%2Fa%00b", "", nil, nil); r.status >= 500 || r.status < 400 {
		t.Fatalf("a NUL in the path: %d %s", r.status, r.body)
	}
	if r := unary("/filesystem.Filesystem/Remove", "application/json", []byte(`{"path":""}`)); r.status >= 500 || r.status < 400 {
		t.Fatalf("Remove of an empty path: %d %s", r.status, r.body)
	}
	if r := unary("/filesystem.Filesystem/Remove", "application/json", []byte(`{"path":"/"}`)); r.status >= 500 {
		t.Fatalf("Remove /: %d %s", r.status, r.body)
	}
}
