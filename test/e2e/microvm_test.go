package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// vmKernelDir is the microvm tier's guest kernel: $WARREN_VM_KERNEL, else
// where `make vm-kernel` puts it (fetched here when it is missing).
func vmKernelDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("WARREN_VM_KERNEL")
	if dir == "" {
		dir = "/var/lib/warren/cache/vm-kernel/current"
	}
	if _, err := os.Stat(filepath.Join(dir, "vmlinux")); err != nil {
		out, err := exec.Command("bash", "../../scripts/vm-kernel.sh", filepath.Dir(dir)).CombinedOutput()
		if err != nil {
			t.Fatalf("scripts/vm-kernel.sh: %v: %s", err, out)
		}
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		t.Fatal("qemu-system-x86_64 is missing: scripts/install-deps.sh installs it")
	}
	return dir
}

// qemusOf lists the QEMU processes of sandboxes whose command line names
// dataDir.
func qemusOf(dataDir string) string {
	out, _ := exec.Command("pgrep", "-af", "qemu-system.*"+dataDir).Output()
	var vms []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		// A memory template's VM (the node builds the default shape's
		// at start) is no sandbox's.
		if line != "" && !strings.Contains(line, "/.template-") {
			vms = append(vms, line)
		}
	}
	return strings.Join(vms, "\n")
}

// fromTemplate reports whether the QEMU of sandbox id (of the server on
// dataDir) maps a memory template's RAM file: the VM was restored from the
// template of its shape, not booted.
func fromTemplate(t *testing.T, dataDir, id string) bool {
	t.Helper()
	for _, line := range strings.Split(qemusOf(dataDir), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || !strings.Contains(line, "/"+id+" ") {
			continue
		}
		maps, err := os.ReadFile("/proc/" + f[0] + "/maps")
		if err != nil {
			t.Fatalf("QEMU of %s: %v", id, err)
		}
		return strings.Contains(string(maps), "/memfd:warren-template-ram")
	}
	t.Fatalf("no QEMU runs for %s: %q", id, qemusOf(dataDir))
	return false
}

// TestMicroVM: `tier: "microvm"` boots a VM whose PID 1 is the agent; exec
// and files work as for containers; the guest sees none of the host and
// cannot reach the agent's port; delete leaves nothing behind.
func TestMicroVM(t *testing.T) {
	parallel(t)
	kdir := vmKernelDir(t)
	s := startServer(t, "--vm-kernel", kdir)
	ctx := context.Background()

	nodes, err := s.C.Nodes(ctx)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("nodes: %v %+v", err, nodes)
	}
	n := nodes[0]
	if !strings.Contains(strings.Join(n.Tiers, ","), api.TierMicroVM) || (n.Accelerator != "tcg" && n.Accelerator != "kvm") || n.VMKernel == "" {
		t.Fatalf("node view: tiers %v accelerator %q vm_kernel %q", n.Tiers, n.Accelerator, n.VMKernel)
	}

	t0 := time.Now()
	sb := s.create(t, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256, Hostname: "vmbox"})
	created := time.Since(t0)
	if !fromTemplate(t, s.dataDir, sb.ID) {
		t.Errorf("the microVM was booted, not restored from its shape's memory template")
	}
	r := s.sh(t, sb.ID, "uname -r")
	t.Logf("tier %s (%s): create %v, create→first exec %v", sb.Tier, n.Accelerator, created, time.Since(t0))
	if sb.Tier != api.TierMicroVM {
		t.Errorf("sandbox tier %q", sb.Tier)
	}
	guestKernel := strings.TrimSpace(r.Stdout)
	modules, _ := os.ReadDir(filepath.Join(kdir, "modules"))
	hostKernel, _ := exec.Command("uname", "-r").Output()
	if r.ExitCode != 0 || guestKernel == "" || guestKernel == strings.TrimSpace(string(hostKernel)) {
		t.Errorf("uname -r in the guest: %q (exit %d), host %q", guestKernel, r.ExitCode, hostKernel)
	}
	if len(modules) > 0 && !strings.Contains(n.VMKernel, strings.TrimSuffix(guestKernel, "")) && !strings.Contains(n.VMKernel, guestKernel) {
		t.Errorf("guest kernel %q is not the node's %q", guestKernel, n.VMKernel)
	}
	if r := s.sh(t, sb.ID, "grep -qw hypervisor /proc/cpuinfo && echo vm; hostname; echo $$"); r.Stdout != "vm\nvmbox\n"+strings.Fields(r.Stdout + " x x x")[2]+"\n" || r.ExitCode != 0 {
		t.Errorf("hypervisor flag / hostname: %q exit %d", r.Stdout, r.ExitCode)
	}

	// A terminal (issue 18: a PTY session works in every tier).
	checkTerminal(t, s.C, sb.ID)

	// The agent's exec features, unchanged: a session keeps its state, a
	// user, a timeout, an output cap, a background command.
	for _, c := range []struct {
		req  api.ExecRequest
		want func(*api.ExecResult) bool
	}{
		{api.ExecRequest{Cmd: "cd /tmp && export X=kept", Session: "s1"}, func(r *api.ExecResult) bool { return r.ExitCode == 0 }},
		{api.ExecRequest{Cmd: "echo $PWD $X", Session: "s1"}, func(r *api.ExecResult) bool { return r.Stdout == "/tmp kept\n" }},
		// (Cwd: the default session is in root's home, closed to nobody.)
		{api.ExecRequest{Cmd: "id -u", User: "nobody", Cwd: "/"}, func(r *api.ExecResult) bool { return r.Stdout == "65534\n" }},
		{api.ExecRequest{Cmd: "sleep 30", Timeout: 1}, func(r *api.ExecResult) bool { return r.TimedOut }},
		{api.ExecRequest{Cmd: "yes | head -c 100000", OutputCap: 1000}, func(r *api.ExecResult) bool { return r.Truncated && len(r.Stdout) == 1000 }},
		{api.ExecRequest{Cmd: "sleep 1; echo done > /tmp/bg", Background: true}, func(r *api.ExecResult) bool { return r.ExitCode == 0 }},
	} {
		r, err := s.C.Exec(ctx, sb.ID, c.req)
		if err != nil || !c.want(r) {
			t.Errorf("exec %+v: %v %+v", c.req, err, r)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.sh(t, sb.ID, "cat /tmp/bg 2>/dev/null").Stdout != "done\n" {
		if time.Now().After(deadline) {
			t.Fatal("the background command did not finish")
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Files through the API, seen by commands, and the other way round.
	if _, err := s.C.WriteFile(ctx, sb.ID, "/root/hello.txt", strings.NewReader("hello from the host\n"), 0o644); err != nil {
		t.Fatalf("write file: %v", err)
	}
	if r := s.sh(t, sb.ID, "cat /root/hello.txt && echo made in the guest > /tmp/out.txt"); r.Stdout != "hello from the host\n" {
		t.Errorf("cat of a written file: %q exit %d %q", r.Stdout, r.ExitCode, r.Stderr)
	}
	rc, err := s.C.ReadFile(ctx, sb.ID, "/tmp/out.txt")
	if err != nil {
		t.Fatalf("read file: %v", err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "made in the guest\n" {
		t.Errorf("read back %q", b)
	}

	// Containment: the host's files and processes are not in the guest.
	marker := filepath.Join(s.dataDir, "host-marker")
	if err := os.WriteFile(marker, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	r = s.sh(t, sb.ID, "test -e "+marker+" && echo visible; ls "+s.dataDir+" 2>/dev/null | head -1; ps -o args | grep -c -e '[q]emu' -e '[w]arren serve'; ls /proc | grep -c '^[0-9]'")
	lines := strings.Fields(r.Stdout)
	if len(lines) != 2 || lines[0] != "0" {
		t.Errorf("host state visible in the guest: %q", r.Stdout)
	}
	t.Logf("processes in the guest: %s", lines[1])
	// No network device (the tier gives none): no host address to reach.
	if r := s.sh(t, sb.ID, "ls /sys/class/net | tr '\\n' ' '"); r.Stdout != "lo " {
		t.Errorf("network devices in the guest: %q", r.Stdout)
	}
	// The agent's port: its node is gone, and a node made again for its
	// device number cannot be opened (the agent holds it exclusively).
	r = s.sh(t, sb.ID, `ls /dev | grep -c '^vport'; `+
		`for p in /sys/class/virtio-ports/*; do d=$(cat $p/dev); mknod /root/port c ${d%:*} ${d#*:} || exit 9; `+
		`cat /root/port 2>&1 </dev/null | head -c 200; echo; sh -c 'echo forged >/root/port' 2>&1 | head -c 200; rm -f /root/port; done`)
	if !strings.HasPrefix(r.Stdout, "0\n") || strings.Count(r.Stdout, "busy") < 2 {
		t.Errorf("the agent's port from a guest process: %q exit %d", r.Stdout, r.ExitCode)
	}
	// The agent still answers after the attempt.
	if r := s.sh(t, sb.ID, "echo still here"); r.Stdout != "still here\n" {
		t.Errorf("after the forging attempt: %q", r.Stdout)
	}

	// A VM of a memory template reports no free pages (its RAM is shared)
	// until a pause gives it RAM of its own.
	balloons := func() string {
		return strings.TrimSpace(s.sh(t, sb.ID, "ls /sys/bus/virtio/drivers/virtio_balloon/ 2>/dev/null | grep -c '^virtio'").Stdout)
	}
	if b := balloons(); b != "0" {
		t.Errorf("balloon devices bound before the pause: %q", b)
	}

	// Pause writes the VM's memory to a file and ends QEMU; the next
	// request restores it, processes and memory-only files intact.
	if r := s.sh(t, sb.ID, "echo in-memory > /dev/shm/mark; (sleep 1000 &); echo ok"); r.Stdout != "ok\n" {
		t.Fatalf("before pause: %q", r.Stdout)
	}
	if _, err := s.C.Pause(ctx, sb.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if got, err := s.C.Get(ctx, sb.ID); err != nil || got.State != api.StatePaused {
		t.Errorf("after pause: %+v %v", got, err)
	}
	if q := qemusOf(s.dataDir); strings.Contains(q, sb.ID) {
		t.Errorf("QEMU still runs while paused: %s", q)
	}
	// Paused long enough that a clock left standing would show it.
	time.Sleep(4 * time.Second)
	t1 := time.Now()
	r = s.sh(t, sb.ID, "cat /dev/shm/mark; ps | grep -c '[s]leep 1000'; date +%s")
	if !strings.HasPrefix(r.Stdout, "in-memory\n1\n") {
		t.Errorf("after the transparent resume: %q exit %d %q", r.Stdout, r.ExitCode, r.Stderr)
	}
	t.Logf("resume from the memory snapshot to first exec: %v", time.Since(t1))
	fields := strings.Fields(r.Stdout)
	if guest, err := strconv.ParseInt(fields[len(fields)-1], 10, 64); err != nil || guest < time.Now().Unix()-2 {
		t.Errorf("the resumed guest's clock: %q (host %d): it stood still while paused", r.Stdout, time.Now().Unix())
	}
	if b := balloons(); b != "1" {
		t.Errorf("balloon devices bound after the resume: %q (free page reporting stays off)", b)
	}

	// Delete: QEMU gone, disk and sockets freed.
	stateDir := filepath.Join(s.dataDir, "edge", "run", sb.ID)
	if qemusOf(s.dataDir) == "" {
		t.Fatal("no QEMU process runs for the sandbox")
	}
	if _, err := s.C.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if q := qemusOf(s.dataDir); q != "" {
		t.Errorf("QEMU left after delete: %s", q)
	}
	var disks []string
	_ = filepath.Walk(s.dataDir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && (strings.HasSuffix(p, ".ext4") || strings.HasSuffix(p, ".sock") && strings.Contains(p, sb.ID)) {
			disks = append(disks, p)
		}
		return nil
	})
	if len(disks) > 0 {
		t.Errorf("left after delete: %v", disks)
	}
	if _, err := os.Stat(filepath.Join(stateDir, "agent.sock")); err == nil {
		t.Errorf("agent socket left in %s", stateDir)
	}
	s.stop()
	assertNoLeaks(t, s)
	if q := qemusOf(s.dataDir); q != "" {
		t.Errorf("QEMU left after shutdown: %s", q)
	}
}

// TestMicroVMTierErrors: an unknown tier is refused listing the tiers; a
// tier no node offers is a 503 that says so.
func TestMicroVMTierErrors(t *testing.T) {
	s := sharedServer(t) // its data dir has no guest kernel: no microvm tier
	code, body := s.rawRequest(t, "POST", "/v1/sandboxes", s.Token, []byte(`{"image":"busybox","tier":"quantum"}`), nil)
	if code != 400 || !strings.Contains(body, "container, microvm, vm") {
		t.Errorf("unknown tier: %d %s", code, body)
	}
	nodes, err := s.C.Nodes(context.Background())
	if err != nil || len(nodes) == 0 {
		t.Fatal(err)
	}
	tiers := append([]string(nil), nodes[0].Tiers...)
	sort.Strings(tiers)
	if strings.Join(tiers, ",") != "container" {
		t.Fatalf("the shared server offers %v", tiers)
	}
	code, body = s.rawRequest(t, "POST", "/v1/sandboxes", s.Token, []byte(`{"image":"busybox","tier":"microvm"}`), nil)
	var e struct{ Error api.Error }
	_ = json.Unmarshal(bytes.TrimSpace([]byte(body)), &e)
	if code != 503 || !strings.Contains(e.Error.Message, `no node offers tier "microvm"`) || e.Error.Reason != api.ReasonTier {
		t.Errorf("tier no node offers: %d %s", code, body)
	}
}

// TestMicroVMRestart: kill -9 of warren leaves the VM running; the next
// warren adopts it (its processes and files intact) and deletes it cleanly.
func TestMicroVMRestart(t *testing.T) {
	parallel(t)
	kdir := vmKernelDir(t)
	s := startServer(t, "--vm-kernel", kdir)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256})
	if r := s.sh(t, sb.ID, "echo kept > /root/state; (sleep 1000 &) ; echo ok"); r.Stdout != "ok\n" {
		t.Fatalf("setup: %q %q", r.Stdout, r.Stderr)
	}
	// A second VM whose record is lost in the crash: a leftover that the
	// next warren must remove (QEMU, disk, cgroup).
	lost := s.create(t, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256})
	// A third, paused (its memory in a file, no QEMU) when warren dies.
	paused := s.create(t, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256})
	s.sh(t, paused.ID, "echo still > /dev/shm/mark")
	if _, err := s.C.Pause(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}
	s.kill9()
	if q := qemusOf(s.dataDir); !strings.Contains(q, sb.ID) || !strings.Contains(q, lost.ID) || strings.Contains(q, paused.ID) {
		t.Fatalf("after kill -9, QEMUs: %q", q)
	}
	if err := os.Remove(filepath.Join(s.dataDir, "edge", "sandboxes", lost.ID+".json")); err != nil {
		t.Fatal(err)
	}
	s.start()
	if q := qemusOf(s.dataDir); strings.Contains(q, lost.ID) || !strings.Contains(q, sb.ID) {
		t.Errorf("after reconcile, QEMUs: %q (leftover %s must be gone, %s adopted)", q, lost.ID, sb.ID)
	}
	got, err := s.C.Get(ctx, sb.ID)
	if err != nil || got.State != api.StateRunning || got.Tier != api.TierMicroVM {
		t.Fatalf("VM not adopted: %+v %v\n%s", got, err, tail(s.logs.String(), 30))
	}
	if r := s.sh(t, sb.ID, "cat /root/state; pgrep -c 'sleep 1000' || ps | grep -c '[s]leep 1000'"); r.Stdout != "kept\n1\n" {
		t.Errorf("after adoption: %q exit %d %q", r.Stdout, r.ExitCode, r.Stderr)
	}
	if got, err := s.C.Get(ctx, paused.ID); err != nil || got.State != api.StatePaused {
		t.Errorf("paused VM after the restart: %+v %v", got, err)
	}
	if r := s.sh(t, paused.ID, "cat /dev/shm/mark"); r.Stdout != "still\n" {
		t.Errorf("paused VM resumed after the restart: %q %q", r.Stdout, r.Stderr)
	}
	for _, id := range []string{sb.ID, paused.ID} {
		if _, err := s.C.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	s.stop()
	assertNoLeaks(t, s)
}

// TestMicroVMLayerAtPath: a named layer attached at a path of a microVM
// (its own read-only disk, mounted there by the agent in the guest) shows
// its files there, read-only, beside the image's root, also after a pause
// to a memory snapshot and a resume; a protected layer is refused on the
// VM tiers (root in the guest could replace it) with a 422 that says so.
func TestMicroVMLayerAtPath(t *testing.T) {
	parallel(t)
	kdir := vmKernelDir(t)
	s := startServer(t, "--vm-kernel", kdir)
	ctx := context.Background()
	if _, err := s.C.CreateLayerFromTar(ctx, "tk/tools", 0, bytes.NewReader(tarOf(t,
		[2]string{"bin/", "<dir>"}, [2]string{"bin/hello.txt", "from the toolkit"}))); err != nil {
		t.Fatal(err)
	}
	code, body := s.rawRequest(t, "POST", "/v1/sandboxes", s.Token,
		[]byte(`{"image":"busybox","tier":"microvm","layers":[{"layer":"tk/tools","mount":"/opt/tk","protected":true}]}`), nil)
	if code != 422 || !strings.Contains(body, "protected") {
		t.Errorf("a protected layer on a microVM: %d %s, want 422", code, body)
	}
	sb := s.create(t, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256,
		Layers: []api.LayerAttachment{{Layer: "tk/tools", Mount: "/opt/tk"}}})
	check := func(when string) {
		t.Helper()
		r := s.sh(t, sb.ID, "cat /opt/tk/bin/hello.txt; echo; ls /bin/busybox; echo x > /opt/tk/bin/new 2>/dev/null && echo writable; grep ' /opt/tk ' /proc/mounts | cut -d' ' -f3,4 | cut -d, -f1")
		if r.Stdout != "from the toolkit\n/bin/busybox\nerofs ro\n" {
			t.Errorf("%s: %q %q", when, r.Stdout, r.Stderr)
		}
	}
	check("the layer at /opt/tk")
	if _, err := s.C.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	check("after pause and resume")
	if _, err := s.C.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s.stop()
	assertNoLeaks(t, s)
}
