package vm

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/confine/confinetest"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/runtime/microvm"
	"github.com/warrenhq/warren/internal/runtime/runtimetest"
)

// diskCache is where scripts/vm-disk.sh keeps the test disk (`make`
// builds it there before the tests; WARREN_VM_DISK_CACHE overrides it).
func diskCache() string {
	if d := os.Getenv("WARREN_VM_DISK_CACHE"); d != "" {
		return d
	}
	return "/var/lib/warren/cache/vm-disk"
}

// TestDiskImage boots the Debian 12 test disk (scripts/vm-disk.sh: its own
// GRUB, kernel, initramfs and systemd, warren-agent as a systemd service),
// imported into an image store, as a vm sandbox: PID 1 is systemd, the
// system reaches "running", commands run and write to the sandbox's
// overlay (the stored image stays unchanged), the agent's port node is
// gone, and Destroy leaves nothing.
func TestDiskImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root")
	}
	for _, tool := range []string{"qemu-img", "debootstrap", "sfdisk"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("SKIP: %s missing (scripts/install-deps.sh installs it)", tool)
		}
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
	if err := confinetest.GoStatic("../../..", "build", "-trimpath", "-ldflags=-s -w", "-o", agentBin, "./cmd/warren-agent"); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	out, err := exec.Command("bash", "../../../scripts/vm-disk.sh", diskCache(), agentBin).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("scripts/vm-disk.sh: %v: %s", err, stderr)
	}
	diskFile := strings.TrimSpace(string(out))
	t.Logf("vm-disk.sh: %v", time.Since(t0))

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	store, err := image.Open(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	t0 = time.Now()
	img, err := store.ImportDisk(ctx, diskFile, "debian:12-vm", "")
	if err != nil {
		t.Fatalf("ImportDisk: %v", err)
	}
	t.Logf("import: %v (virtual %d MiB, stored %d MiB)", time.Since(t0), img.Disk.VirtualSize>>20, img.Disk.StoredSize>>20)
	base, _, err := store.ResolveDisk(ctx, "debian:12-vm")
	if err != nil {
		t.Fatal(err)
	}
	baseStat, _ := os.Stat(base)

	parent := fmt.Sprintf("warren-vmdisk-test-%d", os.Getpid())
	rt, err := New(microvm.Config{Kernel: k, AgentPath: agentBin, CacheDir: filepath.Join(dir, "cache"),
		CgroupParent: parent, Logger: slog.New(slog.DiscardHandler),
		LayerFile: func(string) (string, error) { return "", fmt.Errorf("no layers here") }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	for _, d := range []string{"state", "work"} {
		if err := os.MkdirAll(filepath.Join(dir, "sb", d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	spec := &runtime.Spec{ID: "diskvm", Hostname: "diskvm", StateDir: filepath.Join(dir, "sb", "state"),
		Work: filepath.Join(dir, "sb", "work"), CPU: 1, MemoryMB: 512, Tier: Tier, Disk: base}

	t0 = time.Now()
	inst, err := rt.Start(ctx, spec)
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(spec.StateDir, microvm.ConsoleName))
		t.Fatalf("Start: %v\nconsole:\n%s", err, b)
	}
	t.Logf("start (QEMU to the agent's answer): %v", time.Since(t0))
	destroyed := false
	defer func() {
		if !destroyed {
			inst.Agent.Close()
			_ = rt.Destroy(context.Background(), inst.Handle)
		}
	}()
	run := func(cmd string) string {
		t.Helper()
		r, err := runtimetest.Exec(ctx, inst.Agent, cmd)
		if err != nil {
			t.Fatalf("%s: %v", cmd, err)
		}
		if r.ExitCode != 0 {
			t.Errorf("%s: exit %d, stdout %q, stderr %q", cmd, r.ExitCode, r.Stdout, r.Stderr)
		}
		return strings.TrimSpace(r.Stdout)
	}
	if got := run("ps -p 1 -o comm="); got != "systemd" {
		t.Errorf("PID 1 is %q, want systemd", got)
	}
	if got := run("cat /proc/cmdline"); !strings.Contains(got, "BOOT_IMAGE=/boot/vmlinuz-") || !strings.Contains(got, "root=/dev/vda1") {
		t.Errorf("the kernel was not booted by the image's GRUB: cmdline %q", got)
	}
	t0 = time.Now()
	r, err := runtimetest.Exec(ctx, inst.Agent, "systemctl is-system-running --wait")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("systemctl is-system-running: %q after %v more", strings.TrimSpace(r.Stdout), time.Since(t0))
	if strings.TrimSpace(r.Stdout) != "running" {
		failed, _ := runtimetest.Exec(ctx, inst.Agent, "systemctl --failed --no-legend")
		t.Errorf("system state %q (exit %d); failed units: %s", r.Stdout, r.ExitCode, failed.Stdout)
	}
	if got := run("hostname"); got != "diskvm" {
		t.Errorf("hostname %q, want the spec's", got)
	}
	if got := run("systemctl is-active warren-agent.service"); got != "active" {
		t.Errorf("warren-agent.service: %q", got)
	}
	if got := run("echo written >/root/f && sync && cat /root/f && uname -r"); !strings.HasPrefix(got, "written\n") || !strings.HasSuffix(got, "-amd64") {
		t.Errorf("write and uname: %q", got)
	}
	if got := run("ls /dev | grep -c '^vport' || true"); got != "0" {
		t.Errorf("the agent's port node is still in /dev (%s)", got)
	}

	inst.Agent.Close()
	destroyed = true
	if err := rt.Destroy(ctx, inst.Handle); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if _, err := os.Stat(filepath.Join(spec.Work, microvm.OverlayName)); err == nil {
		t.Errorf("overlay left after Destroy")
	}
	for _, n := range []string{microvm.QMPName, microvm.SocketName, microvm.DiskLink} {
		if _, err := os.Lstat(filepath.Join(spec.StateDir, n)); err == nil {
			t.Errorf("%s left after Destroy", n)
		}
	}
	if st, err := os.Stat(base); err != nil || !st.ModTime().Equal(baseStat.ModTime()) || st.Size() != baseStat.Size() {
		t.Errorf("the stored disk changed: %v %v", st, err)
	}
	if hs, err := rt.Leftovers(ctx); err != nil || len(hs) != 0 {
		t.Errorf("leftovers after Destroy: %v %v", hs, err)
	}
}
