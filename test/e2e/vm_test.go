package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// TestVMTier: `tier: "vm"` boots a q35 machine (the same kernel, agent and
// layers as microvm); with display: true it has a screen that the API
// shows (a PNG with text on it), drives (text typed reaches a reader of
// the guest's tty1) and streams (a WebSocket carrying RFB); a sibling
// project sees none of it; delete leaves no QEMU, disk, socket or cgroup.
func TestVMTier(t *testing.T) {
	parallel(t)
	kdir := vmKernelDir(t)
	s := startServer(t, "--vm-kernel", kdir)
	ctx := context.Background()
	nodes, err := s.C.Nodes(ctx)
	if err != nil || len(nodes) != 1 || !strings.Contains(","+strings.Join(nodes[0].Tiers, ",")+",", ",vm,") {
		t.Fatalf("nodes: %v %+v", err, nodes)
	}
	accel := nodes[0].Accelerator
	// A display elsewhere than on the vm tier is refused.
	for _, body := range []string{`{"image":"busybox","tier":"microvm","display":true}`, `{"image":"busybox","display":true}`} {
		if code, out := s.rawRequest(t, "POST", "/v1/sandboxes", s.Token, []byte(body), nil); code != 422 || !strings.Contains(out, "display") {
			t.Errorf("%s: %d %s", body, code, out)
		}
	}
	js := func(v any) []byte { b, _ := json.Marshal(v); return b }
	tokens := map[string]string{}
	for _, p := range []string{"vmown", "vmsib"} {
		if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: p}); err != nil {
			t.Fatal(err)
		}
		tk, err := s.C.CreateToken(ctx, api.CreateTokenRequest{Principal: "u-" + p, Project: p, Role: api.RoleAdmin})
		if err != nil {
			t.Fatal(err)
		}
		tokens[p] = tk.Secret
	}

	t0 := time.Now()
	sb := s.create(t, api.CreateSandboxRequest{Tier: api.TierVM, Project: "vmown", MemoryMB: 256, Display: true})
	r := s.sh(t, sb.ID, "cat /sys/class/dmi/id/product_name")
	t.Logf("tier vm (%s): create→first exec %v", accel, time.Since(t0))
	if sb.Tier != api.TierVM || !sb.Display || !strings.Contains(r.Stdout, "Q35") {
		t.Fatalf("tier %q display %v, product_name %q %q", sb.Tier, sb.Display, r.Stdout, r.Stderr)
	}
	if _, err := s.C.WriteFile(ctx, sb.ID, "/root/f", strings.NewReader("through the API\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := s.sh(t, sb.ID, "cat /root/f"); r.Stdout != "through the API\n" {
		t.Errorf("file: %q", r.Stdout)
	}
	checkTerminal(t, s.C, sb.ID)

	own := tokens["vmown"]
	oc := warren.New(s.URL, own)
	path := "/v1/sandboxes/" + sb.ID
	shot := func() string {
		t.Helper()
		b, err := oc.Screenshot(ctx, sb.ID) // the Go SDK
		if err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		body := string(b)
		img, err := png.Decode(strings.NewReader(body))
		if err != nil {
			t.Fatalf("screenshot is not a PNG: %v", err)
		}
		seen := map[uint32]bool{}
		bounds := img.Bounds()
		for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
			for x := bounds.Min.X; x < bounds.Max.X; x++ {
				r, g, bl, _ := img.At(x, y).RGBA()
				seen[r<<16^g<<8^bl] = true
			}
		}
		if len(seen) < 2 {
			t.Fatalf("the screenshot (%v) is blank", bounds.Size())
		}
		return body
	}
	before := shot()

	// Text typed through the input API reaches a reader of tty1.
	if r := s.sh(t, sb.ID, "(read -r line </dev/tty1; echo \"$line\" >/tmp/typed) >/dev/null 2>&1 & echo started"); r.Stdout != "started\n" {
		t.Fatalf("reader: %q", r.Stdout)
	}
	time.Sleep(500 * time.Millisecond)
	input := func(tok string, in api.DisplayInput) (int, string) {
		return s.rawRequest(t, "POST", path+"/display/input", tok, js(in), map[string]string{"Content-Type": "application/json"})
	}
	if err := oc.DisplayInput(ctx, sb.ID, api.DisplayInput{Type: "text", Text: "typed: Warren 1\n"}); err != nil {
		t.Fatalf("input: %v", err)
	}
	var typed string
	for deadline := time.Now().Add(30 * time.Second); typed == "" && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		typed = s.sh(t, sb.ID, "cat /tmp/typed 2>/dev/null").Stdout
	}
	if typed != "typed: Warren 1\n" {
		t.Errorf("typed on tty1: %q", typed)
	}
	if shot() == before {
		t.Errorf("the screen did not change after typing")
	}
	// The Python SDK, sync and asyncio.
	script := fmt.Sprintf(`import asyncio, warren, warren.aio
sb = warren.Client(%[1]q, %[2]q).get(%[3]q)
png = sb.screenshot()
sb.display_input("key", key="shift")
async def main():
    async with warren.aio.AsyncClient(%[1]q, %[2]q) as c:
        sb = await c.get(%[3]q)
        await sb.display_input("click", x=1, y=1)
        return await sb.screenshot()
apng = asyncio.run(main())
print(png[:8] == b"\x89PNG\r\n\x1a\n", apng[:8] == png[:8], len(png) > 100)`, s.URL, own, sb.ID)
	cmd := exec.Command("python3", "-c", script)
	cmd.Env = append(os.Environ(), "PYTHONPATH=../../sdk/python")
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "True True True" {
		t.Errorf("python SDK: %v\n%s", err, out)
	}
	for _, in := range []api.DisplayInput{{Type: "key", Key: "shift-a"}, {Type: "click", X: 5, Y: 5}} {
		if code, body := input(own, in); code != 204 {
			t.Errorf("input %+v: %d %s", in, code, body)
		}
	}
	for _, in := range []api.DisplayInput{{Type: "key", Key: "nokey"}, {Type: "wave"}, {Type: "click", X: -1}} {
		if code, body := input(own, in); code != 422 {
			t.Errorf("bad input %+v: %d %s", in, code, body)
		}
	}

	// The display WebSocket carries RFB: the server's version first.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(wctx, "ws"+strings.TrimPrefix(s.URL, "http")+path+"/display",
		&websocket.DialOptions{Subprotocols: []string{"binary"}, HTTPHeader: http.Header{"Authorization": {"Bearer " + own}}})
	if err != nil {
		t.Fatalf("display websocket: %v", err)
	}
	typ, banner, err := ws.Read(wctx)
	if err != nil || typ != websocket.MessageBinary || string(banner) != "RFB 003.008\n" {
		t.Errorf("display: %v %q %v", typ, banner, err)
	}
	if ws.Subprotocol() != "binary" {
		t.Errorf("subprotocol %q", ws.Subprotocol())
	}
	// The handshake a VNC client makes, through the same WebSocket: no
	// authentication (the API's token is the gate), then ServerInit with
	// the screen's size.
	nc := websocket.NetConn(wctx, ws, websocket.MessageBinary)
	if _, err := nc.Write([]byte("RFB 003.008\n")); err != nil {
		t.Fatal(err)
	}
	rd := func(n int) []byte {
		t.Helper()
		b := make([]byte, n)
		if _, err := io.ReadFull(nc, b); err != nil {
			t.Fatalf("RFB handshake: %v", err)
		}
		return b
	}
	types := rd(int(rd(1)[0]))
	if !bytes.Contains(types, []byte{1}) {
		t.Fatalf("security types %v offer no None", types)
	}
	_, _ = nc.Write([]byte{1})
	if res := rd(4); binary.BigEndian.Uint32(res) != 0 {
		t.Fatalf("security result %v", res)
	}
	_, _ = nc.Write([]byte{1}) // ClientInit, shared
	init := rd(24)
	w, h := binary.BigEndian.Uint16(init[0:2]), binary.BigEndian.Uint16(init[2:4])
	name := rd(int(binary.BigEndian.Uint32(init[20:24])))
	t.Logf("RFB ServerInit: %dx%d %q", w, h, name)
	if w == 0 || h == 0 {
		t.Errorf("ServerInit %dx%d", w, h)
	}
	nc.Close()

	// A sibling project's token finds none of it.
	sib := tokens["vmsib"]
	for _, c := range []struct{ method, path string }{{"GET", path + "/screenshot"}, {"GET", path + "/display"}, {"POST", path + "/display/input"}} {
		if code, body := s.rawRequest(t, c.method, c.path, sib, js(api.DisplayInput{Type: "text", Text: "x"}), nil); code != 404 {
			t.Errorf("sibling %s %s: %d %s", c.method, c.path, code, body)
		}
	}
	// A sandbox without a screen says so.
	ct := s.create(t, api.CreateSandboxRequest{})
	if code, body := s.rawRequest(t, "GET", "/v1/sandboxes/"+ct.ID+"/screenshot", s.Token, nil, nil); code != 409 || !strings.Contains(body, "no display") {
		t.Errorf("screenshot of a container: %d %s", code, body)
	}
	// A node with the VM tiers still forwards its containers' ports (the
	// tiers dispatcher passes DialPort on).
	s.sh(t, ct.ID, "mkdir -p /www && echo hello > /www/index.html")
	if _, err := s.C.Exec(ctx, ct.ID, api.ExecRequest{Cmd: "busybox httpd -f -p 8000 -h /www", Background: true}); err != nil {
		t.Fatal(err)
	}
	var code int
	var body string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if code, body = s.rawRequest(t, "GET", "/v1/sandboxes/"+ct.ID+"/ports/8000/index.html", s.Token, nil, nil); code == 200 {
			break
		}
	}
	if code != 200 || body != "hello\n" {
		t.Errorf("a container's port on a node with VM tiers: %d %s", code, body)
	}

	// Pause is a memory snapshot here too; a screenshot resumes the VM,
	// its processes (the shell's state) intact.
	if r := s.sh(t, sb.ID, "echo kept > /dev/shm/mark; echo ok"); r.Stdout != "ok\n" {
		t.Fatalf("before pause: %q", r.Stdout)
	}
	if _, err := s.C.Pause(ctx, sb.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if q := qemusOf(s.dataDir); strings.Contains(q, sb.ID) {
		t.Errorf("QEMU still runs while paused: %s", q)
	}
	shot()
	if r := s.sh(t, sb.ID, "cat /dev/shm/mark"); r.Stdout != "kept\n" {
		t.Errorf("after the resume: %q", r.Stdout)
	}

	// kill -9 of warren leaves the VM running; the next warren adopts it,
	// screen included.
	s.kill9()
	if q := qemusOf(s.dataDir); !strings.Contains(q, sb.ID) {
		t.Fatalf("after kill -9, QEMUs: %q", q)
	}
	s.start()
	if r := s.sh(t, sb.ID, "cat /dev/shm/mark"); r.Stdout != "kept\n" {
		t.Errorf("after the restart: %q %q", r.Stdout, r.Stderr)
	}
	shot()

	// Delete: no QEMU, disk, socket or cgroup left.
	if _, err := s.C.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if q := qemusOf(s.dataDir); q != "" {
		t.Errorf("QEMU left after delete: %s", q)
	}
	var left []string
	_ = filepath.Walk(s.dataDir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && (strings.HasSuffix(p, ".ext4") || strings.HasSuffix(p, ".ppm") || strings.HasSuffix(p, ".sock") && strings.Contains(p, sb.ID)) {
			left = append(left, p)
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("left after delete: %v", left)
	}
	if _, err := s.C.Delete(ctx, ct.ID); err != nil {
		t.Fatal(err)
	}
	s.stop()
	assertNoLeaks(t, s)
}
