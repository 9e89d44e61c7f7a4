package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// One server serves most tests; tests that restart or kill it start their own.
var (
	sharedOnce sync.Once
	shared     *server
)

func sharedServer(t *testing.T) *server {
	if inParallelPhase() { // it stopped with the sequential tests (TestZZSharedServerStopsClean)
		t.Fatal("a test of the parallel phase (parallel) cannot use the shared server: start its own")
	}
	sharedOnce.Do(func() {
		// The shared server outlives single tests; TestMain's exit stops it
		// through the cleanup of the test that started it, so start it from
		// a dedicated top-level test context instead.
		shared = startServerNoCleanup(t)
	})
	if shared == nil {
		t.Fatal("shared server failed to start")
	}
	return shared
}

func startServerNoCleanup(t *testing.T) *server {
	dataDir, err := os.MkdirTemp("", "wtest-data-")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, dataDir: dataDir, listen: freePort(t)}
	s.start()
	sharedStops = append(sharedStops, func() { s.stop(); os.RemoveAll(dataDir) })
	return s
}

var sharedStops []func()

func TestLifecycle(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{Labels: map[string]string{"job": "lifecycle"}, CPU: 0.5, MemoryMB: 128})
	if sb.State != api.StateRunning || !strings.HasPrefix(sb.ID, "sb-e2e-") || sb.Node != "e2e" {
		t.Fatalf("unexpected sandbox %+v", sb)
	}
	got, err := s.C.Get(ctx, sb.ID)
	if err != nil || got.ID != sb.ID || got.Labels["job"] != "lifecycle" || got.CPU != 0.5 || got.MemoryMB != 128 {
		t.Fatalf("get: %+v %v", got, err)
	}
	l, err := s.C.List(ctx, warren.ListOptions{Labels: map[string]string{"job": "lifecycle"}, State: "running"})
	if err != nil || len(l) != 1 || l[0].ID != sb.ID {
		t.Fatalf("list: %+v %v", l, err)
	}
	r := s.sh(t, sb.ID, "echo hello; echo oops >&2; exit 3")
	if r.Stdout != "hello\n" || r.Stderr != "oops\n" || r.ExitCode != 3 {
		t.Fatalf("exec: %+v", r)
	}
	r, err = s.C.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"cat"}, Stdin: "from stdin"})
	if err != nil || r.Stdout != "from stdin" {
		t.Fatalf("argv+stdin: %+v %v", r, err)
	}
	r, err = s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo $FOO; pwd; hostname", Env: map[string]string{"FOO": "bar"}, Cwd: "/tmp"})
	if err != nil || r.Stdout != "bar\n/tmp\nsandbox\n" {
		t.Fatalf("env/cwd: %+v %v", r, err)
	}
	// Processes see only the sandbox.
	r = s.sh(t, sb.ID, "ps -o pid,comm | wc -l; cat /proc/1/comm")
	if !strings.Contains(r.Stdout, "warren-agent") {
		t.Fatalf("pid 1 is not the agent: %q", r.Stdout)
	}
	del, err := s.C.Delete(ctx, sb.ID)
	if err != nil || del.State != api.StateStopped {
		t.Fatalf("delete: %+v %v", del, err)
	}
	if _, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "true"}); !warren.IsConflict(err) {
		t.Fatalf("exec on stopped sandbox: want 409, got %v", err)
	}
	got, err = s.C.Get(ctx, sb.ID)
	if err != nil || got.State != api.StateStopped {
		t.Fatalf("get stopped: %+v %v", got, err)
	}
}

func TestAuthAndBadInput(t *testing.T) {
	s := sharedServer(t)
	cases := []struct {
		name, method, path, token string
		body                      string
		hdr                       map[string]string
		want                      int
	}{
		{"no token", "GET", "/v1/sandboxes", "-", "", nil, 401},
		{"bad token", "GET", "/v1/sandboxes", "wrn_nope", "", nil, 401},
		{"malformed json", "POST", "/v1/sandboxes", "", "{", nil, 400},
		{"unknown field", "POST", "/v1/sandboxes", "", `{"image":"busybox","cpus":3}`, nil, 400},
		{"trailing data", "POST", "/v1/sandboxes", "", `{"image":"busybox"} {}`, nil, 400},
		{"empty body", "POST", "/v1/sandboxes", "", ``, nil, 400},
		{"no image", "POST", "/v1/sandboxes", "", `{}`, nil, 422},
		{"unknown image", "POST", "/v1/sandboxes", "", `{"image":"nope:1"}`, nil, 404},
		{"negative cpu", "POST", "/v1/sandboxes", "", `{"image":"busybox","cpu":-1}`, nil, 422},
		{"absurd memory", "POST", "/v1/sandboxes", "", `{"image":"busybox","memory_mb":99999999999}`, nil, 422},
		{"bad tier", "POST", "/v1/sandboxes", "", `{"image":"busybox","tier":"quantum"}`, nil, 400},
		{"bad env", "POST", "/v1/sandboxes", "", `{"image":"busybox","env":{"A=B":"x"}}`, nil, 422},
		{"image traversal", "POST", "/v1/sandboxes", "", `{"image":"../../etc"}`, nil, 422},
		{"huge body", "POST", "/v1/sandboxes", "", `{"image":"` + strings.Repeat("a", 2<<20) + `"}`, nil, 413},
		{"missing sandbox", "GET", "/v1/sandboxes/sb-e2e-aaaaaaaaaaaaaaaa", "", "", nil, 404},
		{"malformed id", "GET", "/v1/sandboxes/..%2f..%2fetc", "", "", nil, 404},
		{"unknown node", "GET", "/v1/sandboxes/sb-elsewhere-abc", "", "", nil, 404},
		{"exec missing", "POST", "/v1/sandboxes/sb-e2e-zzzz/exec", "", `{"cmd":"true"}`, nil, 404},
		{"bad state filter", "GET", "/v1/sandboxes?state=sleepy", "", "", nil, 422},
		{"no route", "GET", "/v2/nothing", "", "", nil, 404},
		{"bad follow", "GET", "/v1/events?follow=yes", "", "", nil, 422},
		{"bad follow after", "GET", "/v1/events?follow=1&after=-1", "", "", nil, 422},
		{"follow no token", "GET", "/v1/events?follow=1", "-", "", nil, 401},
	}
	for _, c := range cases {
		code, body := s.rawRequest(t, c.method, c.path, c.token, []byte(c.body), c.hdr)
		if code != c.want {
			t.Errorf("%s: got %d want %d: %s", c.name, code, c.want, body)
			continue
		}
		var eb api.ErrorBody
		if err := json.Unmarshal([]byte(body), &eb); err != nil || eb.Error.Code == "" || eb.Error.Message == "" {
			t.Errorf("%s: error body not {error:{code,message}}: %s", c.name, body)
		}
	}
	// Bad exec input against a live sandbox.
	sb := s.create(t, api.CreateSandboxRequest{})
	for _, body := range []string{`{}`, `{"cmd":"true","argv":["true"]}`, `{"cmd":"true","timeout":-1}`, `{"cmd":"true","env":{"":"x"}}`} {
		code, resp := s.rawRequest(t, "POST", "/v1/sandboxes/"+sb.ID+"/exec", "", []byte(body), nil)
		if code != 422 && code != 400 {
			t.Errorf("exec %s: got %d %s", body, code, resp)
		}
	}
	for _, p := range []string{"", "relative/x", "/a\x00b"} {
		code, resp := s.rawRequest(t, "GET", "/v1/sandboxes/"+sb.ID+"/files?path="+urlEscape(p), "", nil, nil)
		if code != 400 {
			t.Errorf("file path %q: got %d %s", p, code, resp)
		}
	}
}

func urlEscape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '/' || c == '.' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

func TestSessions(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{})
	run := func(session, cmd string) string {
		r, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: cmd, Session: session})
		if err != nil {
			t.Fatalf("exec: %v", err)
		}
		return r.Stdout
	}
	run("", "mkdir -p /work/repo && cd /work/repo && export GREETING='hello world' && export MULTI='a\nb'")
	if got := run("", "pwd; echo \"$GREETING\""); got != "/work/repo\nhello world\n" {
		t.Fatalf("default session lost state: %q", got)
	}
	if got := run("", "printf '%s' \"$MULTI\""); got != "a\nb" {
		t.Fatalf("multi-line variable: %q", got)
	}
	// A new session starts like a login shell: in the user's home, without the other's exports.
	if got := run("other", "pwd; echo \"[$GREETING]\""); got != "/root\n[]\n" {
		t.Fatalf("sessions are not independent: %q", got)
	}
	run("other", "cd /tmp")
	if got := run("", "pwd"); got != "/work/repo\n" {
		t.Fatalf("default session changed by another: %q", got)
	}
	// A session's commands run in one live shell, like a terminal: plain
	// variables and functions persist, and the shell's pid stays. Only the
	// running command's two output FIFOs and its script exist (with . and ..).
	pid := run("", "plain=1; greet() { echo \"hi $1\"; }; echo $$")
	if got := run("", "echo $$ $plain; greet x; ls -a /dev/.warren | wc -l"); got != pid[:len(pid)-1]+" 1\nhi x\n5\n" {
		t.Fatalf("live shell: %q (pid %q)", got, pid)
	}
	// Concurrent commands in several sessions.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			r, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: fmt.Sprintf("echo %d", i), Session: fmt.Sprintf("s%d", i%4)})
			if err != nil || r.Stdout != fmt.Sprintf("%d\n", i) {
				errs <- fmt.Errorf("concurrent %d: %+v %v", i, r, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestStreamingCapsAndTimeouts(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{})
	// Streaming: events arrive before the command ends.
	var events []api.ExecEvent
	start := time.Now()
	var firstAt time.Duration
	res, err := s.C.ExecStreamFunc(ctx, sb.ID, api.ExecRequest{Cmd: "echo one; sleep 1; echo two >&2; exit 4"}, func(ev api.ExecEvent) error {
		if len(events) == 0 {
			firstAt = time.Since(start)
		}
		events = append(events, ev)
		return nil
	})
	if err != nil || res.ExitCode != 4 {
		t.Fatalf("stream: %+v %v", res, err)
	}
	if firstAt > 900*time.Millisecond {
		t.Errorf("first event came after %v: output is not streamed", firstAt)
	}
	var out, errOut string
	for _, ev := range events {
		if ev.Stdout != nil {
			out += *ev.Stdout
		}
		if ev.Stderr != nil {
			errOut += *ev.Stderr
		}
	}
	if out != "one\n" || errOut != "two\n" {
		t.Fatalf("stream content: %q %q", out, errOut)
	}
	// Output cap: yes must not grow memory; output stops at the cap.
	r, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "yes | head -c 200000000", OutputCap: 1 << 20})
	if err != nil {
		t.Fatalf("cap: %v", err)
	}
	if !r.Truncated || len(r.Stdout) != 1<<20 || r.ExitCode != 0 {
		t.Fatalf("cap: truncated=%v len=%d exit=%d", r.Truncated, len(r.Stdout), r.ExitCode)
	}
	// Timeout kills the whole process group, children included.
	start = time.Now()
	r, err = s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "sleep 100 & sleep 100; echo never", Timeout: 1})
	if err != nil || !r.TimedOut || strings.Contains(r.Stdout, "never") || time.Since(start) > 10*time.Second {
		t.Fatalf("timeout: %+v %v after %v", r, err, time.Since(start))
	}
	time.Sleep(200 * time.Millisecond)
	r = s.sh(t, sb.ID, "ps -o comm | grep -c sleep || true")
	if strings.TrimSpace(r.Stdout) != "0" {
		t.Fatalf("timed-out command left processes: %q", r.Stdout)
	}
	// Background commands.
	bg, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo started; sleep 0.5; echo done", Background: true})
	if err != nil || bg.CommandID == "" {
		t.Fatalf("background: %+v %v", bg, err)
	}
	c, err := s.C.Command(ctx, sb.ID, bg.CommandID, true)
	if err != nil || c.Running || c.ExitCode == nil || *c.ExitCode != 0 || c.Stdout != "started\ndone\n" {
		t.Fatalf("background wait: %+v %v", c, err)
	}
	bg, err = s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "sleep 100", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err = s.C.KillCommand(ctx, sb.ID, bg.CommandID, 9)
	if err != nil {
		t.Fatalf("kill: %v", err)
	}
	c, err = s.C.Command(ctx, sb.ID, bg.CommandID, true)
	if err != nil || c.Running || c.Signal == "" {
		t.Fatalf("killed command: %+v %v", c, err)
	}
	if _, err := s.C.Command(ctx, sb.ID, "nope", false); !warren.IsNotFound(err) {
		t.Fatalf("unknown command: want 404, got %v", err)
	}
}

func TestFiles(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{})
	if _, err := s.C.WriteFileBytes(ctx, sb.ID, "/work/dir/a.txt", []byte("alpha"), 0o600); err != nil {
		t.Fatalf("write: %v", err)
	}
	b, err := s.C.ReadFileBytes(ctx, sb.ID, "/work/dir/a.txt")
	if err != nil || string(b) != "alpha" {
		t.Fatalf("read: %q %v", b, err)
	}
	fi, err := s.C.Stat(ctx, sb.ID, "/work/dir/a.txt")
	if err != nil || fi.Size != 5 || fi.Mode&0o777 != 0o600 || fi.Type != "file" {
		t.Fatalf("stat: %+v %v", fi, err)
	}
	if r := s.sh(t, sb.ID, "cat /work/dir/a.txt"); r.Stdout != "alpha" {
		t.Fatalf("file not visible to commands: %q", r.Stdout)
	}
	if _, err := s.C.Mkdir(ctx, sb.ID, api.MkdirRequest{Path: "/work/dir/sub/deep", Parents: true}); err != nil {
		t.Fatalf("mkdir: %v", err)
	}
	if err := s.C.Rename(ctx, sb.ID, "/work/dir/a.txt", "/work/dir/sub/b.txt"); err != nil {
		t.Fatalf("rename: %v", err)
	}
	l, err := s.C.ListFiles(ctx, sb.ID, "/work/dir/sub")
	if err != nil || len(l) != 2 || l[0].Name != "b.txt" || l[1].Name != "deep" || l[1].Type != "dir" {
		t.Fatalf("list: %+v %v", l, err)
	}
	// A large file goes through the chunked path.
	big := bytes.Repeat([]byte("0123456789abcdef"), (9<<20)/16)
	if _, err := s.C.WriteFileBytes(ctx, sb.ID, "/work/big.bin", big, 0o644); err != nil {
		t.Fatalf("write big: %v", err)
	}
	got, err := s.C.ReadFileBytes(ctx, sb.ID, "/work/big.bin")
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("read big: %d bytes, %v", len(got), err)
	}
	if r := s.sh(t, sb.ID, "ls -a /work | grep -c warren-upload || true"); strings.TrimSpace(r.Stdout) != "0" {
		t.Fatalf("upload left a temporary file: %q", r.Stdout)
	}
	// Paths cannot leave the sandbox: .. and symlinks resolve inside it.
	s.sh(t, sb.ID, "echo sandbox-passwd > /etc/passwd.probe; ln -s / /tmp/rootlink; ln -s ../../../../../../etc /tmp/etclink")
	for _, p := range []string{"/../../../../etc/passwd.probe", "/tmp/rootlink/etc/passwd.probe", "/tmp/etclink/passwd.probe"} {
		b, err := s.C.ReadFileBytes(ctx, sb.ID, p)
		if err != nil || string(b) != "sandbox-passwd\n" {
			t.Errorf("read %s: %q %v", p, b, err)
		}
	}
	hostMarker := s.dataDir + "/admin-token"
	if _, err := s.C.ReadFileBytes(ctx, sb.ID, hostMarker); !warren.IsNotFound(err) {
		t.Errorf("host file readable through the files API: %v", err)
	}
	if _, err := s.C.WriteFileBytes(ctx, sb.ID, "/tmp/rootlink"+s.dataDir+"/escape", []byte("x"), 0o644); err != nil {
		t.Fatalf("write through symlink: %v", err)
	}
	if _, err := os.Stat(s.dataDir + "/escape"); err == nil {
		t.Fatal("a write through a symlink escaped to the host")
	}
	// Errors.
	if _, err := s.C.ReadFileBytes(ctx, sb.ID, "/nope"); !warren.IsNotFound(err) {
		t.Errorf("missing file: want 404, got %v", err)
	}
	if _, err := s.C.ReadFileBytes(ctx, sb.ID, "/work"); err == nil {
		t.Errorf("reading a directory should fail")
	}
	if err := s.C.Remove(ctx, sb.ID, "/work/dir", false); err == nil {
		t.Errorf("non-recursive remove of a non-empty dir should fail")
	}
	if err := s.C.Remove(ctx, sb.ID, "/work/dir", true); err != nil {
		t.Errorf("recursive remove: %v", err)
	}
	// Archive round trip.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for name, body := range map[string]string{"x/one.txt": "1", "x/y/two.txt": "22"} {
		_ = tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
		_, _ = tw.Write([]byte(body))
	}
	tw.Close()
	n, err := s.C.UploadArchive(ctx, sb.ID, "/up", &buf)
	if err != nil || n < 2 {
		t.Fatalf("upload archive: %d %v", n, err)
	}
	if r := s.sh(t, sb.ID, "cat /up/x/one.txt /up/x/y/two.txt"); r.Stdout != "122" {
		t.Fatalf("archive content: %q", r.Stdout)
	}
	rc, err := s.C.DownloadArchive(ctx, sb.ID, "/up")
	if err != nil {
		t.Fatalf("download archive: %v", err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	names := map[string]string{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("tar: %v", err)
		}
		b, _ := io.ReadAll(tr)
		names[strings.TrimPrefix(h.Name, "./")] = string(b)
	}
	found := false
	for n, b := range names {
		if strings.HasSuffix(n, "y/two.txt") && b == "22" {
			found = true
		}
	}
	if !found {
		t.Fatalf("downloaded archive lacks y/two.txt: %v", names)
	}
	// A hostile archive is refused and writes nothing outside.
	buf.Reset()
	tw = tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Name: "../../escape.txt", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	_, _ = tw.Write([]byte("x"))
	tw.Close()
	if _, err := s.C.UploadArchive(ctx, sb.ID, "/up/in", &buf); err == nil {
		t.Errorf("archive with ../ entries was accepted")
	}
	if r := s.sh(t, sb.ID, "ls /escape.txt /up/escape.txt 2>/dev/null | wc -l"); strings.TrimSpace(r.Stdout) != "0" {
		t.Errorf("hostile archive wrote outside its directory")
	}
}

func TestContainment(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{})
	probe := s.checkContainment(t, sb.ID)
	// Overwriting /bin/sh affects only this sandbox.
	s.sh(t, sb.ID, "rm -f /bin/sh.bak; cp /bin/busybox /bin/busybox.bak; echo owned > /etc/motd")
	other := s.create(t, api.CreateSandboxRequest{})
	if r := s.sh(t, other.ID, "cat /etc/motd 2>/dev/null; ls /bin/busybox.bak 2>/dev/null | wc -l"); strings.TrimSpace(r.Stdout) != "0" {
		t.Fatalf("one sandbox's writes are visible in another: %q", r.Stdout)
	}
	// Memory limit is enforced (OOM kill, not host pressure).
	lim := s.create(t, api.CreateSandboxRequest{MemoryMB: 32})
	if _, err := s.C.WriteFileBytes(ctx, lim.ID, "/probe", probe, 0o755); err != nil {
		t.Fatalf("upload probe: %v", err)
	}
	r, err := s.C.Exec(ctx, lim.ID, api.ExecRequest{Argv: []string{"/probe", "alloc", "200"}, Timeout: 60})
	if err != nil {
		t.Fatalf("oom exec: %v", err)
	}
	if strings.Contains(r.Stdout, "held") || r.ExitCode != 137 {
		t.Errorf("a 200 MiB allocation under a 32 MiB limit was not OOM-killed: %+v", r)
	}
	if r := s.sh(t, lim.ID, "echo still-here"); r.Stdout != "still-here\n" {
		t.Errorf("the sandbox did not survive its command's OOM kill: %+v", r)
	}
	// pids limit.
	pl := s.create(t, api.CreateSandboxRequest{Pids: 16})
	r, _ = s.C.Exec(ctx, pl.ID, api.ExecRequest{Cmd: "for i in $(seq 40); do sleep 5 & done 2>&1 | head -1; echo spawned", Timeout: 30})
	if !strings.Contains(r.Stdout+r.Stderr, "can't fork") && !strings.Contains(r.Stdout+r.Stderr, "Resource temporarily unavailable") {
		t.Errorf("pids limit not enforced: %+v", r)
	}
}

// checkContainment uploads the probe to /probe in sandbox id, runs it and
// fails the test for every escape or abuse it was allowed. It returns the
// probe binary.
func (s *server) checkContainment(t *testing.T, id string) []byte {
	t.Helper()
	ctx := context.Background()
	probe, err := os.ReadFile(bins.probe)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.C.WriteFileBytes(ctx, id, "/probe", probe, 0o755); err != nil {
		t.Fatalf("upload probe: %v", err)
	}
	r, err := s.C.Exec(ctx, id, api.ExecRequest{Argv: []string{"/probe", s.dataDir}, Timeout: 60})
	if err != nil {
		t.Fatalf("probe: %v", err)
	}
	t.Logf("probe output:\n%s%s", r.Stdout, r.Stderr)
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) < 35 {
		t.Fatalf("probe ran only %d checks", len(lines))
	}
	for _, l := range lines {
		if !strings.Contains(l, ": blocked") {
			t.Errorf("containment check failed: %s", l)
		}
	}
	return probe
}

func TestExpiry(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	ttl := s.create(t, api.CreateSandboxRequest{TTL: 2})
	idle := s.create(t, api.CreateSandboxRequest{IdleTimeout: 2, TTL: 600})
	busy := s.create(t, api.CreateSandboxRequest{IdleTimeout: 2, TTL: 600})
	deadline := time.Now().Add(6 * time.Second)
	for time.Now().Before(deadline) {
		s.sh(t, busy.ID, "true")
		time.Sleep(500 * time.Millisecond)
	}
	for _, c := range []struct {
		id, want, reason string
	}{{ttl.ID, api.StateStopped, "ttl"}, {idle.ID, api.StateStopped, "idle"}, {busy.ID, api.StateRunning, ""}} {
		got, err := s.C.Get(ctx, c.id)
		if err != nil || got.State != c.want || !strings.Contains(got.Reason, c.reason) {
			t.Errorf("%s: %+v %v (want %s)", c.id, got, err, c.want)
		}
	}
}

func TestIdempotentCreate(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	a, err := s.C.CreateWithKey(ctx, api.CreateSandboxRequest{Image: "busybox"}, "key-1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = s.C.Delete(ctx, a.ID) })
	b, err := s.C.CreateWithKey(ctx, api.CreateSandboxRequest{Image: "busybox"}, "key-1")
	if err != nil || b.ID != a.ID {
		t.Fatalf("retried create made another sandbox: %s vs %v %v", a.ID, b, err)
	}
}
