package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
)

// vmDiskFile is the vm tier's Debian 12 test disk (scripts/vm-disk.sh,
// cached where `make vm-disk` puts it) with an agent built as the Makefile
// builds it (so that the cache `make` filled serves).
func vmDiskFile(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"qemu-img", "debootstrap", "sfdisk"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing: scripts/install-deps.sh installs it", tool)
		}
	}
	agent := filepath.Join(t.TempDir(), "warren-agent")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", agent, "../../cmd/warren-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, out)
	}
	cache := os.Getenv("WARREN_VM_DISK_CACHE")
	if cache == "" {
		cache = "/var/lib/warren/cache/vm-disk"
	}
	t0 := time.Now()
	cmd = exec.Command("bash", "../../scripts/vm-disk.sh", cache, agent)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/vm-disk.sh: %v\n%s", err, stderr.String())
	}
	t.Logf("scripts/vm-disk.sh: %v", time.Since(t0))
	return strings.TrimSpace(string(out))
}

// TestVMDiskImage: `warren image import --disk` uploads a VM disk image
// (a corrupt one, or one with a backing file, is a 400 that says why); a
// `tier: "vm"` sandbox of it boots the image's own GRUB, kernel and systemd,
// whose warren-agent service serves exec and files (its port node gone),
// which runs systemd services and loads kernel modules;
// pause and resume keep its processes, and so does kill -9 of warren (the
// next one adopts the VM); its network (the agent service configures it)
// reaches what its list allows and nothing else, before and after those; a
// disk snapshot is a 409; other tiers and layers are refused;
// delete leaves no QEMU and no overlay, and the stored disk never changed.
// (The one test that boots the disk: a boot costs a minute or more under
// TCG.)
func TestVMDiskImage(t *testing.T) {
	parallel(t)
	kdir := vmKernelDir(t)
	raw := vmDiskFile(t)
	nettest.FakeInternet(t)
	pool := fmt.Sprintf("10.213.%d.0/24", 20+(os.Getpid()+17)%100)
	s := startServer(t, "--vm-kernel", kdir, "--net-pool", pool)
	ctx := context.Background()
	dir := t.TempDir()
	qimg := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("qemu-img", args...).CombinedOutput(); err != nil {
			t.Fatalf("qemu-img %v: %v: %s", args, err, out)
		}
	}

	// Refused at import, through the API: a 400 with the reason.
	corrupt := filepath.Join(dir, "corrupt.qcow2")
	qimg("create", "-q", "-f", "qcow2", corrupt, "16M")
	f, err := os.OpenFile(corrupt, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteAt([]byte{0, 0, 0, 0, 0, 0, 0x12, 0x34}, 40) // l1_table_offset, unaligned
	f.Close()
	backed := filepath.Join(dir, "backed.qcow2")
	qimg("create", "-q", "-f", "qcow2", "-b", "/etc/shadow", "-F", "raw", backed)
	for _, c := range []struct{ file, query, want string }{
		{corrupt, "disk=qcow2", "cannot read it as qcow2"},
		{backed, "disk=qcow2", "backing file"},
		{backed, "disk=vmdk", "disk must be qcow2 or raw"},
	} {
		body, _ := os.ReadFile(c.file)
		code, out := s.rawRequest(t, "POST", "/v1/images:import?name=bad:1&"+c.query, "", body, nil)
		if code != 400 || !strings.Contains(out, c.want) || strings.Contains(out, s.dataDir) {
			t.Errorf("import %s?%s: %d %s, want a 400 saying %q", filepath.Base(c.file), c.query, code, out, c.want)
		}
	}
	if _, errs, code := s.cli(t, "image", "import", "--disk", corrupt, "--name", "bad:1"); code == 0 || !strings.Contains(errs, "bad disk image") {
		t.Errorf("CLI import of a corrupt disk: exit %d, %s", code, errs)
	}
	py := exec.Command("python3", "-c", fmt.Sprintf(`import warren
try:
    warren.Client(%q, %q).import_disk("bad:1", %q)
    print("imported")
except warren.BadRequest as e:
    print("refused", e.status, "backing file" in str(e))`, s.URL, s.Token, backed))
	py.Env = append(os.Environ(), "PYTHONPATH=../../sdk/python")
	if out, err := py.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "refused 400 True" {
		t.Errorf("python SDK import_disk of a backed qcow2: %v %s", err, out)
	}

	// The test disk, as qcow2 (a smaller upload), through the CLI.
	q := filepath.Join(dir, "debian-12.qcow2")
	qimg("convert", "-f", "raw", "-O", "qcow2", raw, q)
	t0 := time.Now()
	s.cliOK(t, "image", "import", "--disk", q, "--name", "debian:12-vm")
	t.Logf("import --disk through the API: %v", time.Since(t0))
	var img api.Image
	out := s.cliOK(t, "--json", "image", "ls")
	var list api.ImageList
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("image ls: %v %s", err, out)
	}
	for _, im := range list.Images {
		if im.Name == "debian:12-vm" {
			img = im
		}
	}
	if img.Disk == nil || img.Disk.Format != "qcow2" || img.Disk.VirtualSize != 2<<30 || len(img.Layers) != 0 {
		t.Fatalf("debian:12-vm in the list: %+v (disk %+v)", img, img.Disk)
	}
	stored, _ := filepath.Glob(filepath.Join(s.dataDir, "images", "blobs", "sha256", "*.qcow2"))
	if len(stored) != 1 {
		t.Fatalf("stored disks: %v", stored)
	}
	before, err := os.Stat(stored[0])
	if err != nil {
		t.Fatal(err)
	}

	// Not on other tiers, not with layers.
	for _, body := range []string{
		`{"image":"debian:12-vm"}`, `{"image":"debian:12-vm","tier":"microvm"}`,
		`{"image":"debian:12-vm","tier":"vm","layers":[{"layer":"nosuch"}]}`,
	} {
		if code, out := s.rawRequest(t, "POST", "/v1/sandboxes", "", []byte(body), nil); code/100 != 4 || !strings.Contains(out, "disk image") {
			t.Errorf("create %s: %d %s", body, code, out)
		}
	}

	t0 = time.Now()
	sb := s.create(t, api.CreateSandboxRequest{Image: "debian:12-vm", Tier: api.TierVM, MemoryMB: 512, Hostname: "vmdisk",
		Network: &api.NetworkSpec{Egress: []string{nettest.Mirror + "/32:443/tcp"}}})
	t.Logf("create (boot to the agent service): %v", time.Since(t0))
	// Its network: the agent service configured the interface udev
	// named; the list holds as for any sandbox (bash's /dev/tcp: the
	// image has no nc).
	dial := func(addr, port string) *api.ExecResult {
		return s.sh(t, sb.ID, "timeout 8 bash -c 'exec 3<>/dev/tcp/"+addr+"/"+port+"; head -c 5 <&3'")
	}
	if r := dial(nettest.Mirror, "443"); r.Stdout != "hello" {
		t.Errorf("disk-image VM, allowed %s:443: exit %d %q %q", nettest.Mirror, r.ExitCode, r.Stdout, r.Stderr)
	}
	for _, dst := range [][2]string{{nettest.Elsewhere, "443"}, {nettest.Metadata, "80"}} {
		if r := dial(dst[0], dst[1]); r.ExitCode == 0 || strings.Contains(r.Stdout, "hello") {
			t.Errorf("disk-image VM, %s:%s reachable: %q", dst[0], dst[1], r.Stdout)
		}
	}
	if r := s.sh(t, sb.ID, "hostname"); r.Stdout != "vmdisk\n" {
		t.Errorf("hostname: %q", r.Stdout)
	}
	if r := s.sh(t, sb.ID, "ps -p 1 -o comm="); r.Stdout != "systemd\n" {
		t.Errorf("PID 1: %q %q", r.Stdout, r.Stderr)
	}
	t0 = time.Now()
	if r := s.sh(t, sb.ID, "systemctl is-system-running --wait"); r.Stdout != "running\n" {
		failed := s.sh(t, sb.ID, "systemctl --failed --no-legend")
		t.Errorf("systemctl is-system-running: %q (exit %d); failed: %s", r.Stdout, r.ExitCode, failed.Stdout)
	}
	t.Logf("systemd running %v after the create", time.Since(t0))
	checkTerminal(t, s.C, sb.ID)
	if _, err := s.C.WriteFile(ctx, sb.ID, "/root/f", strings.NewReader("on the overlay\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// The image's GRUB booted its kernel; the agent is its systemd
	// service, and no process of the guest finds its port.
	if r := s.sh(t, sb.ID, "cat /root/f; grep -o 'BOOT_IMAGE=/boot/vmlinuz-[^ ]*' /proc/cmdline | wc -l; systemctl is-active warren-agent.service; ls /dev | grep -c '^vport'"); r.Stdout != "on the overlay\n1\nactive\n0\n" {
		t.Errorf("file, cmdline, service, port node: %q %q", r.Stdout, r.Stderr)
	}

	// What a container never could: a systemd service of its own, a
	// kernel module loaded into its own kernel.
	if r := s.sh(t, sb.ID, "systemd-run --unit=warren-hello sleep 600 >/dev/null 2>&1; systemctl is-active warren-hello; modprobe dummy && grep -c '^dummy ' /proc/modules"); r.Stdout != "active\n1\n" {
		t.Errorf("a systemd service and a kernel module: %q %q", r.Stdout, r.Stderr)
	}

	// Pause (a memory snapshot) and resume: the processes stay.
	if r := s.sh(t, sb.ID, "echo kept > /dev/shm/mark; echo ok"); r.Stdout != "ok\n" {
		t.Fatalf("before pause: %q", r.Stdout)
	}
	if _, err := s.C.Pause(ctx, sb.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if q := qemusOf(s.dataDir); strings.Contains(q, sb.ID) {
		t.Errorf("QEMU still runs while paused: %s", q)
	}
	if r := s.sh(t, sb.ID, "cat /dev/shm/mark /root/f; ps -p 1 -o comm=; systemctl is-active warren-hello"); r.Stdout != "kept\non the overlay\nsystemd\nactive\n" {
		t.Errorf("after the resume: %q %q", r.Stdout, r.Stderr)
	}

	// kill -9 of warren leaves the VM running; the next warren adopts it.
	s.kill9()
	if q := qemusOf(s.dataDir); !strings.Contains(q, sb.ID) {
		t.Fatalf("after kill -9, QEMUs: %q", q)
	}
	s.start()
	if r := s.sh(t, sb.ID, "cat /dev/shm/mark; systemctl is-active warren-hello"); r.Stdout != "kept\nactive\n" {
		t.Errorf("after the restart: %q %q", r.Stdout, r.Stderr)
	}
	if r := dial(nettest.Mirror, "443"); r.Stdout != "hello" {
		t.Errorf("disk-image VM's network after pause, resume and a restart: exit %d %q %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	// No disk snapshots of a disk image's VM yet: a 409 that says so.
	if _, err := s.C.Snapshot(ctx, sb.ID, api.CreateSnapshotRequest{}); err == nil || !strings.Contains(err.Error(), "no VM writable disk") {
		t.Errorf("snapshot of a disk-image VM: %v", err)
	}

	if _, err := s.C.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if q := qemusOf(s.dataDir); q != "" {
		t.Errorf("QEMU left after delete: %s", q)
	}
	var left []string
	_ = filepath.Walk(s.dataDir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && strings.HasSuffix(p, ".qcow2") && !strings.Contains(p, "/blobs/") {
			left = append(left, p)
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("left after delete: %v", left)
	}
	if after, err := os.Stat(stored[0]); err != nil || !after.ModTime().Equal(before.ModTime()) || after.Size() != before.Size() {
		t.Errorf("the stored disk changed: %v %v", after, err)
	}
	s.stop()
	assertNoLeaks(t, s)
}
