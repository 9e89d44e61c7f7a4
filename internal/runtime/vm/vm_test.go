package vm

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/confine/confinetest"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/runtime/microvm"
	"github.com/warrenhq/warren/internal/runtime/runtimetest"
)

// fixture builds the agent and a one-binary busybox layer and makes the
// tier under a cgroup parent of the test's own.
func fixture(t *testing.T) (*Runtime, *runtime.Spec) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root")
	}
	if _, err := os.Stat(confinetest.BusyboxPath); err != nil {
		t.Skip("SKIP: " + confinetest.ErrNoBusybox.Error())
	}
	kdir := os.Getenv("WARREN_VM_KERNEL")
	if kdir == "" {
		kdir = "/var/lib/warren/cache/vm-kernel/current"
	}
	if out, err := exec.Command("bash", "../../../scripts/vm-kernel.sh", filepath.Dir(kdir)).CombinedOutput(); err != nil {
		t.Fatalf("scripts/vm-kernel.sh: %v: %s", err, out)
	}
	k, err := microvm.OpenKernel(kdir)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	agentBin := filepath.Join(dir, "warren-agent")
	if err := confinetest.GoStatic("../../..", "build", "-trimpath", "-o", agentBin, "./cmd/warren-agent"); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(dir, "root")
	for _, d := range []string{"bin", "tmp", "root", "etc"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("cp", confinetest.BusyboxPath, filepath.Join(root, "bin", "busybox")).CombinedOutput(); err != nil {
		t.Fatalf("cp busybox: %v: %s", err, out)
	}
	for _, a := range []string{"sh", "cat", "grep", "echo", "sleep"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
	layer := filepath.Join(dir, "layer.erofs")
	if out, err := exec.Command("mkfs.erofs", "--quiet", layer, root).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.erofs: %v: %s", err, out)
	}
	parent := fmt.Sprintf("warren-vmtier-test-%d", os.Getpid())
	rt, err := New(microvm.Config{Kernel: k, AgentPath: agentBin, CacheDir: filepath.Join(dir, "cache"),
		CgroupParent: parent, Logger: slog.New(slog.DiscardHandler),
		LayerFile: func(string) (string, error) { return layer, nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	for _, d := range []string{"state", "lower", "work"} {
		if err := os.MkdirAll(filepath.Join(dir, "sb", d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	spec := &runtime.Spec{ID: "screen", Hostname: "vmbox", StateDir: filepath.Join(dir, "sb", "state"),
		Lowers: []string{filepath.Join(dir, "sb", "lower")}, Work: filepath.Join(dir, "sb", "work"),
		CPU: 1, MemoryMB: 256, DiskMB: 256, Tier: Tier, Display: true}
	return rt, spec
}

// colours counts the distinct colours of a PNG (and checks it decodes).
func colours(t *testing.T, b []byte) (int, image.Image) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("screenshot is not a PNG: %v", err)
	}
	seen := map[[4]uint32]bool{}
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y++ {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x++ {
			r, g, b, a := img.At(x, y).RGBA()
			seen[[4]uint32{r, g, b, a}] = true
		}
	}
	return len(seen), img
}

// TestScreen boots a q35 VM with a display: the guest sees a q35 machine,
// the screenshot shows text, text typed through the input reaches a
// reader of tty1 (and shows on the screen), and Destroy leaves nothing.
func TestScreen(t *testing.T) {
	rt, spec := fixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t0 := time.Now()
	inst, err := rt.Start(ctx, spec)
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(spec.StateDir, microvm.ConsoleName))
		t.Fatalf("Start: %v\nconsole:\n%s", err, b)
	}
	t.Logf("start: %v", time.Since(t0))
	destroyed := false
	defer func() {
		if !destroyed {
			inst.Agent.Close()
			_ = rt.Destroy(context.Background(), inst.Handle)
		}
	}()
	if inst.Handle.Tier != Tier {
		t.Errorf("handle tier %q", inst.Handle.Tier)
	}
	r, err := runtimetest.Exec(ctx, inst.Agent, "cat /sys/class/dmi/id/product_name")
	if err != nil || !strings.Contains(r.Stdout, "Q35") {
		t.Fatalf("product_name: %q %q %v", r.Stdout, r.Stderr, err)
	}
	// The q35 QEMU is confined as the microvm tier's is (microvm/spawn.go).
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", inst.Handle.Pid)); err != nil ||
		strings.Contains(string(st), "\nUid:\t0\t") || !strings.Contains(string(st), "\nCapEff:\t0000000000000000\n") {
		t.Errorf("the q35 QEMU runs privileged: %v\n%s", err, st)
	}
	shot, err := rt.Screenshot(ctx, inst.Handle)
	if err != nil {
		t.Fatalf("Screenshot: %v", err)
	}
	n, img := colours(t, shot)
	t.Logf("screenshot %v, %d colours, %d bytes", img.Bounds().Size(), n, len(shot))
	if n < 2 {
		t.Fatalf("screenshot is blank (%d colour)", n)
	}
	// A reader on tty1 gets the typed line.
	r, err = runtimetest.Exec(ctx, inst.Agent, "(read -r line </dev/tty1; echo \"$line\" >/tmp/typed) >/dev/null 2>&1 & echo started")
	if err != nil || r.Stdout != "started\n" {
		t.Fatalf("reader: %q %q %v", r.Stdout, r.Stderr, err)
	}
	time.Sleep(500 * time.Millisecond) // the reader opens tty1
	if err := rt.SendInput(ctx, inst.Handle, runtime.DisplayInput{Type: "text", Text: "Hello, VM! 42\n"}); err != nil {
		t.Fatalf("SendInput: %v", err)
	}
	var got string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		r, _ = runtimetest.Exec(ctx, inst.Agent, "cat /tmp/typed 2>/dev/null")
		if got = r.Stdout; got != "" {
			break
		}
	}
	if got != "Hello, VM! 42\n" {
		t.Errorf("typed on tty1: got %q", got)
	}
	shot2, err := rt.Screenshot(ctx, inst.Handle)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(shot, shot2) {
		t.Errorf("the screen did not change after typing")
	}
	for _, in := range []runtime.DisplayInput{{Type: "key", Key: "ctrl-alt-f2"}, {Type: "click", X: 10, Y: 10}} {
		if err := rt.SendInput(ctx, inst.Handle, in); err != nil {
			t.Errorf("SendInput %+v: %v", in, err)
		}
	}
	for _, in := range []runtime.DisplayInput{{Type: "key", Key: "nosuchkey"}, {Type: "click", X: 99999}, {Type: "text", Text: "é"}, {Type: "scroll"}} {
		if err := rt.SendInput(ctx, inst.Handle, in); err == nil || !strings.Contains(err.Error(), "bad display input") {
			t.Errorf("SendInput %+v: %v, want a bad input error", in, err)
		}
	}
	c, err := rt.DialDisplay(ctx, inst.Handle)
	if err != nil {
		t.Fatalf("DialDisplay: %v", err)
	}
	banner := make([]byte, 12)
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(banner)
	c.Close()
	if err != nil || string(banner) != "RFB 003.008\n" {
		t.Errorf("VNC banner %q: %v", banner, err)
	}
	inst.Agent.Close()
	destroyed = true
	if err := rt.Destroy(ctx, inst.Handle); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	for _, n := range []string{VNCName, microvm.QMPName, microvm.SocketName, microvm.DiskLink} {
		if _, err := os.Lstat(filepath.Join(spec.StateDir, n)); err == nil {
			t.Errorf("%s left after Destroy", n)
		}
	}
	if _, err := os.Stat(filepath.Join(spec.Work, microvm.DiskName)); err == nil {
		t.Errorf("disk left after Destroy")
	}
	if hs, err := rt.Leftovers(ctx); err != nil || len(hs) != 0 {
		t.Errorf("leftovers after Destroy: %v %v", hs, err)
	}
}
