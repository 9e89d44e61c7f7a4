package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

var portsrv struct {
	once sync.Once
	path string
	err  error
}

// portsrvBinary builds test/e2e/portsrv (static) once per run.
func portsrvBinary(t *testing.T) []byte {
	t.Helper()
	portsrv.once.Do(func() {
		portsrv.path = filepath.Join(bins.dir, "portsrv")
		cmd := exec.Command("go", "build", "-o", portsrv.path, "./portsrv")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := cmd.CombinedOutput(); err != nil {
			portsrv.err = fmt.Errorf("build portsrv: %v\n%s", err, b)
		}
	})
	if portsrv.err != nil {
		t.Fatal(portsrv.err)
	}
	b, err := os.ReadFile(portsrv.path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// startPortsrv copies portsrv into sandbox id and starts "portsrv MODE
// PORT" for each of modes ("http:8000"), in the background.
func startPortsrv(t *testing.T, c *warren.Client, id string, modes ...string) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.WriteFileBytes(ctx, id, "/tmp/portsrv", portsrvBinary(t), 0o755); err != nil {
		t.Fatalf("upload portsrv: %v", err)
	}
	for _, m := range modes {
		mode, port, _ := strings.Cut(m, ":")
		if _, err := c.Exec(ctx, id, api.ExecRequest{Argv: []string{"/tmp/portsrv", mode, port}, Background: true}); err != nil {
			t.Fatalf("start portsrv %s: %v", m, err)
		}
	}
}

// portGet is an HTTP request through the API with token (none for "-").
func portReq(t *testing.T, method, url, token string, body io.Reader, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "-" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	return string(b)
}

// waitPort waits until url answers 200 (the server inside has started).
func waitPort(t *testing.T, url, token string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp := portReq(t, "GET", url, token, nil, nil)
		body := readAll(t, resp)
		if resp.StatusCode == 200 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered: %d %s", url, resp.StatusCode, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// pattern is what portsrv's /big sends: byte i is 'a'+(i%65536)%26.
func bigDigest(n int64) string {
	buf := make([]byte, 64<<10)
	for i := range buf {
		buf[i] = byte('a' + i%26)
	}
	h := sha256.New()
	for n > 0 {
		k := min(n, int64(len(buf)))
		h.Write(buf[:k])
		n -= k
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestPorts: a server listening inside a sandbox without a network is
// reached through the API with the caller's token (which it never sees),
// with streaming bodies both ways, a WebSocket echo, a public URL that
// works without a token until revoked, and raw TCP (warren port-forward).
// Bad ports are 400, a port nobody listens on 502, no token 401, another
// project's token 404.
func TestPorts(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{})
	startPortsrv(t, s.C, sb.ID, "http:8000", "echo:9000")
	base := s.URL + "/v1/sandboxes/" + sb.ID + "/ports/8000"
	waitPort(t, base+"/info", s.Token)

	// The request as the server inside saw it: path rewritten, the token
	// gone, other headers kept.
	resp := portReq(t, "GET", base+"/info?q=1&r=%2F", s.Token, nil, map[string]string{"X-Test": "kept"})
	body := readAll(t, resp)
	var info map[string]string
	if err := json.Unmarshal([]byte(body), &info); err != nil || resp.StatusCode != 200 {
		t.Fatalf("info: %d %s", resp.StatusCode, body)
	}
	if info["uri"] != "/info?q=1&r=%2F" || info["authorization"] != "" || info["x"] != "kept" ||
		info["prefix"] != "/v1/sandboxes/"+sb.ID+"/ports/8000" || info["method"] != "GET" {
		t.Errorf("the server inside saw %v", info)
	}
	if c, b := s.rawRequest(t, "GET", "/v1/sandboxes/"+sb.ID+"/ports/8000/info", "-", nil, nil); c != 401 {
		t.Errorf("without a token: %d %s", c, b)
	}
	if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: "other"}); err != nil {
		t.Fatal(err)
	}
	tk, err := s.C.CreateToken(ctx, api.CreateTokenRequest{Principal: "o", Project: "other", Role: api.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/ports/8000/info", "/ports/8000?raw=1"} {
		if c, b := s.rawRequest(t, "GET", "/v1/sandboxes/"+sb.ID+path, tk.Secret, nil, map[string]string{"Connection": "Upgrade", "Upgrade": "tcp"}); c != 404 || strings.Contains(b, "sandbox saw") {
			t.Errorf("another project's token, %s: %d %s", path, c, b)
		}
	}
	if c, b := s.rawRequest(t, "POST", "/v1/sandboxes/"+sb.ID+"/ports/8000", tk.Secret, []byte(`{"public":true}`), nil); c != 404 {
		t.Errorf("another project makes the port public: %d %s", c, b)
	}
	for _, p := range []string{"0", "70000", "http", "-1"} {
		if c, b := s.rawRequest(t, "GET", "/v1/sandboxes/"+sb.ID+"/ports/"+p+"/info", "", nil, nil); c != 400 || !strings.Contains(b, p) {
			t.Errorf("port %s: %d %s, want 400 naming it", p, c, b)
		}
	}
	if c, b := s.rawRequest(t, "GET", "/v1/sandboxes/"+sb.ID+"/ports/8001/", "", nil, nil); c != 502 || !strings.Contains(b, "nothing listens on port 8001") {
		t.Errorf("a port nobody listens on: %d %s, want 502 with a message", c, b)
	}

	t.Run("paused", func(t *testing.T) {
		// A request to a paused sandbox's port resumes it.
		if _, err := s.C.Pause(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		resp := portReq(t, "GET", base+"/info", s.Token, nil, nil)
		if body := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("a paused sandbox's port: %d %s", resp.StatusCode, body)
		}
		if got, err := s.C.Get(ctx, sb.ID); err != nil || got.State != api.StateRunning {
			t.Fatalf("after a port request: %+v %v", got, err)
		}
	})
	t.Run("client-leaves", func(t *testing.T) {
		// A client that leaves mid-download closes the connection inside
		// the sandbox too (every hop ends): no established connection to
		// port 8000 is left.
		resp := portReq(t, "GET", base+"/big?n=100000000000", s.Token, nil, nil)
		if _, err := io.CopyN(io.Discard, resp.Body, 4<<20); err != nil {
			t.Fatal(err)
		}
		if r := s.sh(t, sb.ID, "grep -c ':1F40 [0-9A-F:]* 01 ' /proc/net/tcp /proc/net/tcp6 | awk -F: '{n+=$2} END {print n}'"); strings.TrimSpace(r.Stdout) == "0" {
			t.Fatalf("no established connection to 8000 during the download: %q %q", r.Stdout, r.Stderr)
		}
		resp.Body.Close()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			r := s.sh(t, sb.ID, "grep -c ':1F40 [0-9A-F:]* 01 ' /proc/net/tcp /proc/net/tcp6 | awk -F: '{n+=$2} END {print n}'")
			if strings.TrimSpace(r.Stdout) == "0" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the connection inside outlived its client by 10 s: %q", r.Stdout)
			}
		}
	})
	t.Run("download", func(t *testing.T) {
		// 64 MiB, chunked, read slowly at first: whole, byte for byte.
		const n = 64 << 20
		resp := portReq(t, "GET", base+fmt.Sprintf("/big?n=%d", n), s.Token, nil, nil)
		defer resp.Body.Close()
		if resp.StatusCode != 200 || resp.ContentLength != -1 {
			t.Fatalf("big: %d, length %d", resp.StatusCode, resp.ContentLength)
		}
		h := sha256.New()
		buf := make([]byte, 16<<10)
		var got int64
		for i := 0; ; i++ {
			if i < 100 {
				time.Sleep(10 * time.Millisecond) // a slow reader: the sender waits
			}
			k, err := resp.Body.Read(buf)
			h.Write(buf[:k])
			got += int64(k)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("after %d bytes: %v", got, err)
			}
		}
		if got != n || hex.EncodeToString(h.Sum(nil)) != bigDigest(n) {
			t.Fatalf("downloaded %d bytes (want %d), digest ok: %v", got, n, hex.EncodeToString(h.Sum(nil)) == bigDigest(n))
		}
	})
	t.Run("upload", func(t *testing.T) {
		// 48 MiB of random bytes, chunked (no length), streamed.
		data := make([]byte, 48<<20)
		_, _ = rand.Read(data)
		pr, pw := io.Pipe()
		go func() {
			for b := data; len(b) > 0; b = b[min(len(b), 1<<20):] {
				if _, err := pw.Write(b[:min(len(b), 1<<20)]); err != nil {
					return
				}
			}
			pw.Close()
		}()
		resp := portReq(t, "POST", base+"/sum", s.Token, pr, nil)
		body := readAll(t, resp)
		sum := sha256.Sum256(data)
		if want := fmt.Sprintf("%d %s", len(data), hex.EncodeToString(sum[:])); resp.StatusCode != 200 || body != want {
			t.Fatalf("upload: %d %q, want %q", resp.StatusCode, body, want)
		}
	})
	t.Run("websocket", func(t *testing.T) {
		cfg, err := websocket.NewConfig("ws"+strings.TrimPrefix(base, "http")+"/ws", s.URL)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Header = http.Header{"Authorization": {"Bearer " + s.Token}}
		ws, err := websocket.DialConfig(cfg)
		if err != nil {
			t.Fatalf("websocket through the API: %v", err)
		}
		defer ws.Close()
		for i, msg := range []string{"hello", strings.Repeat("x", 1<<20), "bye"} {
			if err := websocket.Message.Send(ws, msg); err != nil {
				t.Fatalf("send %d: %v", i, err)
			}
			// The echo server sends a long message back in several frames.
			got := make([]byte, len(msg))
			if _, err := io.ReadFull(ws, got); err != nil || string(got) != msg {
				t.Fatalf("echo %d: %v", i, err)
			}
		}
		// Without the token the upgrade is refused.
		cfg.Header = nil
		if _, err := websocket.DialConfig(cfg); err == nil {
			t.Error("a WebSocket without a token was let through")
		}
	})
	t.Run("public", func(t *testing.T) {
		p, err := s.C.ExposePort(ctx, sb.ID, 8000)
		if err != nil || !p.Public || !strings.HasPrefix(p.URL, s.URL+"/p/") || len(p.Path) < 40 {
			t.Fatalf("expose: %+v %v", p, err)
		}
		resp := portReq(t, "GET", p.URL+"info", "-", nil, nil)
		body := readAll(t, resp)
		if resp.StatusCode != 200 || !strings.Contains(body, `"path":"/info"`) {
			t.Fatalf("public URL without a token: %d %s", resp.StatusCode, body)
		}
		// The CLI makes a second URL, which revokes the first.
		out := strings.TrimSpace(s.cliOK(t, "expose", sb.ID, "8000"))
		if !strings.HasPrefix(out, s.URL+"/p/") || out == p.URL {
			t.Fatalf("warren expose: %q", out)
		}
		if resp := portReq(t, "GET", p.URL+"info", "-", nil, nil); resp.StatusCode != 404 {
			t.Errorf("the first URL after a second: %d %s", resp.StatusCode, readAll(t, resp))
		}
		if resp := portReq(t, "GET", out+"info", "-", nil, nil); resp.StatusCode != 200 {
			t.Errorf("the second URL: %d %s", resp.StatusCode, readAll(t, resp))
		}
		s.cliOK(t, "expose", "--revoke", sb.ID, "8000")
		resp = portReq(t, "GET", out+"info", "-", nil, nil)
		if body := readAll(t, resp); resp.StatusCode != 404 || strings.Contains(body, "/info") {
			t.Errorf("public URL after revoke: %d %s", resp.StatusCode, body)
		}
		if resp := portReq(t, "GET", s.URL+"/p/"+strings.Repeat("A", 43)+"/info", "-", nil, nil); resp.StatusCode != 404 {
			t.Errorf("a made-up secret: %d", resp.StatusCode)
		}
		// A sandbox's end ends its public URLs.
		other := s.create(t, api.CreateSandboxRequest{})
		op, err := s.C.ExposePort(ctx, other.ID, 8000)
		if err != nil {
			t.Fatal(err)
		}
		if resp := portReq(t, "GET", op.URL, "-", nil, nil); resp.StatusCode != 502 {
			t.Errorf("public URL of a port nobody listens on: %d %s", resp.StatusCode, readAll(t, resp))
		}
		if _, err := s.C.Delete(ctx, other.ID); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ { // the first use drops the record, the second finds none
			if resp := portReq(t, "GET", op.URL, "-", nil, nil); resp.StatusCode != 404 {
				t.Errorf("public URL of a deleted sandbox: %d %s", resp.StatusCode, readAll(t, resp))
			}
		}
	})
	t.Run("python", func(t *testing.T) {
		script := `
import asyncio, json, socket, sys, urllib.request, urllib.error
import warren
c = warren.Client()
sb = c.sandbox(sys.argv[1])
req = urllib.request.Request(sb.url(8000) + "info?a=b", headers={"Authorization": "Bearer " + c._cfg.token})
info = json.load(urllib.request.urlopen(req))
assert info["uri"] == "/info?a=b" and info["authorization"] == "", info
p = sb.expose(8000)
assert json.load(urllib.request.urlopen(p["url"] + "info"))["path"] == "/info"
sb.unexpose(8000)
try:
    urllib.request.urlopen(p["url"] + "info")
    raise SystemExit("a revoked public URL still answers")
except urllib.error.HTTPError as e:
    assert e.code == 404, e.code
s = sb.connect_port(9000)
s.sendall(b"x" * 100000)
s.shutdown(socket.SHUT_WR)
got = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    got += b
assert got == b"x" * 100000, len(got)
try:
    sb.connect_port(9001)
    raise SystemExit("connect to a port nobody listens on")
except warren.BadGateway as e:
    assert "nothing listens" in str(e), e
async def main():
    async with warren.AsyncClient() as ac:
        asb = await ac.get(sys.argv[1])
        r, w = await asb.connect_port(9000)
        w.write(b"async")
        w.write_eof()
        assert await r.read() == b"async"
        w.close()
asyncio.run(main())
print("ok")
`
		cmd := exec.Command("python3", "-c", script, sb.ID)
		cmd.Env = append(os.Environ(), "PYTHONPATH=../../sdk/python", "WARREN_URL="+s.URL, "WARREN_TOKEN="+s.Token)
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Fatalf("python SDK: %v\n%s", err, out)
		}
	})
	t.Run("raw", func(t *testing.T) {
		// The SDK's raw stream, with a half close: the echo server sends
		// everything back and then closes its side.
		pc, err := s.C.DialPort(ctx, sb.ID, 9000)
		if err != nil {
			t.Fatalf("dial port: %v", err)
		}
		data := make([]byte, 8<<20)
		_, _ = rand.Read(data)
		go func() {
			_, _ = pc.Write(data)
			_ = pc.CloseWrite()
		}()
		got, err := io.ReadAll(pc)
		pc.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Logf("server log:\n%s", tail(s.logs.String(), 30))
			t.Fatalf("raw echo: %d of %d bytes, equal %v, %v", len(got), len(data), bytes.Equal(got, data), err)
		}
		if _, err := s.C.DialPort(ctx, sb.ID, 9001); warren.StatusOf(err) != 502 {
			t.Errorf("raw to a port nobody listens on: %v", err)
		}
		// warren port-forward LOCAL:9000, used by a plain TCP client.
		local := freePort(t)
		_, lport, _ := net.SplitHostPort(local)
		cmd := exec.Command(bins.warren, "--url", s.URL, "--token", s.Token, "port-forward", sb.ID, lport+":9000")
		stdout, _ := cmd.StdoutPipe()
		var stderr syncBuffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil || !strings.Contains(line, "forwarding 127.0.0.1:"+lport) {
			t.Fatalf("port-forward said %q %v %s", line, err, stderr.String())
		}
		for i := 0; i < 3; i++ {
			c, err := net.Dial("tcp", local)
			if err != nil {
				t.Fatal(err)
			}
			msg := []byte(fmt.Sprintf("round trip %d", i))
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			_ = c.(*net.TCPConn).CloseWrite()
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			got, err := io.ReadAll(c)
			c.Close()
			if err != nil || !bytes.Equal(got, msg) {
				t.Fatalf("port-forward round trip %d: %q %v (stderr %s)", i, got, err, stderr.String())
			}
		}
	})
}

// TestPortActivity: an open port connection is activity. While it is open
// (even silent) the sandbox's CPU gate stays at its full level and its
// idle timer does not stop it; once it closes the sandbox gets its idle
// budget again and the idle timer runs.
func TestPortActivity(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	idle := 0.02
	sb := s.create(t, api.CreateSandboxRequest{CPU: 1, IdleCPU: &idle, IdleTimeout: 2, Priority: api.PriorityLatency})
	startPortsrv(t, s.C, sb.ID, "echo:9000")
	pid := agentPid(t, s, sb.ID)
	spin(t, s, sb.ID)
	var pc *warren.PortConn
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var err error
		if pc, err = s.C.DialPort(ctx, sb.ID, 9000); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("dial the echo port: %v", err)
		}
	}
	if _, err := pc.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(pc, b); err != nil || string(b) != "ping" {
		t.Fatalf("echo: %q %v", b, err)
	}
	// Silent but open, for longer than the idle timeout.
	time.Sleep(time.Second)
	open := cpuRateOf(t, pid, 3*time.Second)
	if got, err := s.C.Get(ctx, sb.ID); err != nil || got.State != api.StateRunning {
		t.Fatalf("with a port connection open past its idle timeout: %+v %v", got, err)
	}
	pc.Close()
	time.Sleep(500 * time.Millisecond)
	closed := cpuRateOf(t, pid, time.Second)
	t.Logf("spinner with a port connection open: %.3f cores; after it closed: %.3f", open, closed)
	if open < 0.1 {
		t.Errorf("with a port connection open the sandbox got %.3f cores, not its full CPU", open)
	}
	if closed > 0.05 {
		t.Errorf("after the port connection closed the sandbox still got %.3f cores (idle budget 0.02)", closed)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		got, err := s.C.Get(ctx, sb.ID)
		if err != nil || got.State != api.StateRunning {
			break // stopped by its idle timer (or gone)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the idle timer never stopped the sandbox after its port connection closed")
		}
	}
}

// TestClusterPorts: in cluster mode (separate apiserver and edge
// processes) a port is reached through every apiserver replica, over the
// edge's data listener: HTTP, a WebSocket, raw TCP, and a public URL made
// on one replica and used on another; and a replica's E2B front.
func TestClusterPorts(t *testing.T) {
	t.Cleanup(func() { assertNoLeaks(t) })
	c := startCluster(t, "pa")
	ctx := context.Background()
	sb, err := c.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.2, MemoryMB: 128})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = c.C.Delete(context.Background(), sb.ID) }()
	startPortsrv(t, c.C, sb.ID, "http:8000", "echo:9000")
	for _, u := range c.apiURL {
		waitPort(t, u+"/v1/sandboxes/"+sb.ID+"/ports/8000/info", c.token)
	}
	cfg, err := websocket.NewConfig("ws"+strings.TrimPrefix(c.apiURL[1], "http")+"/v1/sandboxes/"+sb.ID+"/ports/8000/ws", c.apiURL[1])
	if err != nil {
		t.Fatal(err)
	}
	cfg.Header = http.Header{"Authorization": {"Bearer " + c.token}}
	ws, err := websocket.DialConfig(cfg)
	if err != nil {
		t.Fatalf("websocket through apiserver 1: %v", err)
	}
	if err := websocket.Message.Send(ws, "over the cluster"); err != nil {
		t.Fatal(err)
	}
	var got string
	if err := websocket.Message.Receive(ws, &got); err != nil || got != "over the cluster" {
		t.Fatalf("websocket echo: %q %v", got, err)
	}
	ws.Close()
	pc, err := warren.New(c.apiURL[0], c.token).DialPort(ctx, sb.ID, 9000)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = pc.Write([]byte("raw")); _ = pc.CloseWrite() }()
	if b, err := io.ReadAll(pc); err != nil || string(b) != "raw" {
		t.Fatalf("raw echo through apiserver 0: %q %v", b, err)
	}
	pc.Close()
	p, err := warren.New(c.apiURL[0], c.token).ExposePort(ctx, sb.ID, 8000)
	if err != nil {
		t.Fatal(err)
	}
	resp := portReq(t, "GET", c.apiURL[1]+p.Path+"info", "-", nil, nil)
	if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, `"path":"/info"`) {
		t.Fatalf("public URL made on replica 0, used on replica 1: %d %s", resp.StatusCode, body)
	}
	if _, err := warren.New(c.apiURL[1], c.token).UnexposePort(ctx, sb.ID, 8000); err != nil {
		t.Fatal(err)
	}
	if resp := portReq(t, "GET", c.apiURL[0]+p.Path+"info", "-", nil, nil); resp.StatusCode != 404 {
		t.Fatalf("public URL revoked on replica 1, used on replica 0: %d %s", resp.StatusCode, readAll(t, resp))
	}

	// warren apiserver --e2b-listen: the E2B front of a replica creates a
	// sandbox on the edge, runs a command in it through envd and kills it.
	e := &e2bClient{base: c.e2bURL, key: c.token}
	ee := e.createEnvd(t, "E2B create through the apiserver", `{"templateID":"busybox"}`, c.C)
	st := ee.stream(t, "Start",
		`{"process":{"cmd":"/bin/sh","args":["-c","echo from $(hostname)"]},"stdin":false}`, nil)
	st.event(t)
	if out, _, end := st.rest(t); !strings.HasPrefix(out, "from ") || (end["exitCode"] != nil && end["exitCode"] != float64(0)) {
		t.Fatalf("E2B command through the apiserver: %q %v", out, end)
	}
	e.do(t, "DELETE", "/sandboxes/"+ee.id, "").wantStatus(t, "E2B kill through the apiserver", 204)
}
