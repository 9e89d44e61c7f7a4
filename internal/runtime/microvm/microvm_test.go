package microvm

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/confine/confinetest"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/runtime/runtimetest"
)

var (
	agentBin string
	buildDir string
)

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "microvm-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		buildDir = dir
		agentBin = filepath.Join(dir, "warren-agent")
		if err := confinetest.GoStatic("../../..", "build", "-trimpath", "-ldflags=-s -w", "-o", agentBin, "./cmd/warren-agent"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// KernelDir is where the tests find the guest kernel: $WARREN_VM_KERNEL,
// else the cache `make vm-kernel` fills.
func kernelDir() string {
	if d := os.Getenv("WARREN_VM_KERNEL"); d != "" {
		return d
	}
	return "/var/lib/warren/cache/vm-kernel/current"
}

var (
	kernelOnce sync.Once
	kernelErr  error
)

// testKernel opens the guest kernel, fetching it (scripts/vm-kernel.sh)
// when it is not cached yet.
func testKernel(t testing.TB) Kernel {
	t.Helper()
	kernelOnce.Do(func() {
		if _, err := os.Stat(filepath.Join(kernelDir(), "vmlinux")); err == nil {
			return
		}
		out, err := exec.Command("bash", "../../../scripts/vm-kernel.sh", filepath.Dir(kernelDir())).CombinedOutput()
		if err != nil {
			kernelErr = fmt.Errorf("scripts/vm-kernel.sh: %v: %s", err, out)
		}
	})
	if kernelErr != nil {
		t.Fatal(kernelErr)
	}
	k, err := OpenKernel(kernelDir())
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var (
	layerOnce sync.Once
	layerFile string
	layerErr  error
)

// busyboxLayer is an EROFS image with busybox and its applets, made once.
func busyboxLayer(t testing.TB) string {
	t.Helper()
	layerOnce.Do(func() {
		dir := filepath.Join(buildDir, "layer")
		for _, d := range []string{"bin", "etc", "tmp", "root"} {
			if layerErr = os.MkdirAll(filepath.Join(dir, d), 0o755); layerErr != nil {
				return
			}
		}
		if layerErr = exec.Command("cp", confinetest.BusyboxPath, filepath.Join(dir, "bin", "busybox")).Run(); layerErr != nil {
			return
		}
		out, err := exec.Command(confinetest.BusyboxPath, "--list").Output()
		if layerErr = err; err != nil {
			return
		}
		for _, a := range strings.Fields(string(out)) {
			if a != "busybox" {
				_ = os.Symlink("busybox", filepath.Join(dir, "bin", a))
			}
		}
		_ = os.WriteFile(filepath.Join(dir, "etc", "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n"), 0o644)
		_ = os.WriteFile(filepath.Join(dir, "etc", "group"), []byte("root:x:0:\nnogroup:x:65534:\n"), 0o644)
		layerFile = filepath.Join(buildDir, "busybox.erofs")
		if out, err := exec.Command("mkfs.erofs", "--quiet", layerFile, dir).CombinedOutput(); err != nil {
			layerErr = fmt.Errorf("mkfs.erofs: %v: %s", err, out)
		}
	})
	if layerErr != nil {
		t.Fatal(layerErr)
	}
	return layerFile
}

type fixture struct {
	rt     *Runtime
	parent string
	base   string
	layer  string
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root")
	}
	if _, err := os.Stat(confinetest.BusyboxPath); err != nil {
		t.Skip("SKIP: " + confinetest.ErrNoBusybox.Error())
	}
	k := testKernel(t)
	f := &fixture{parent: fmt.Sprintf("warren-vm-test-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6), base: t.TempDir(), layer: busyboxLayer(t)}
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("WARREN_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	rt, err := New(Config{Kernel: k, AgentPath: agentBin, CacheDir: filepath.Join(buildDir, "cache"),
		CgroupParent: f.parent, Logger: logger,
		LayerFile: func(dir string) (string, error) { return f.layer, nil }})
	if err != nil {
		t.Fatal(err)
	}
	f.rt = rt
	t.Cleanup(func() {
		_ = rt.Close() // ends template builds under way
		for _, d := range rt.cg.dirs(f.parent) {
			if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
				t.Errorf("remove cgroup parent: %v", err)
			}
		}
	})
	return f
}

// boot starts spec's VM; the test's end closes its agent and destroys it.
func (f *fixture) boot(t *testing.T, ctx context.Context, spec *runtime.Spec) *runtime.Instance {
	t.Helper()
	inst, err := f.rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		inst.Agent.Close()
		if err := f.rt.Destroy(context.Background(), inst.Handle); err != nil {
			t.Error(err)
		}
	})
	return inst
}

func (f *fixture) spec(t testing.TB, id string) *runtime.Spec {
	t.Helper()
	dir := filepath.Join(f.base, id)
	for _, d := range []string{"state", "lower", "work"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return &runtime.Spec{
		ID: id, Hostname: "vm-" + id, StateDir: filepath.Join(dir, "state"),
		Lowers: []string{filepath.Join(dir, "lower")}, Work: filepath.Join(dir, "work"),
		CPU: 1, MemoryMB: 256, DiskMB: 256,
	}
}

// TestConformance: the microvm tier passes the suite every tier runs.
func TestConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtimetest.Tier {
		f := newFixture(t)
		return runtimetest.Tier{Runtime: f.rt, Spec: func(t *testing.T, id string) *runtime.Spec { return f.spec(t, id) }}
	})
}

// TestBootExec boots one VM, runs commands in the guest and destroys it:
// the guest's kernel is the tier's, not the host's, and nothing is left.
func TestBootExec(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "boot")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t0 := time.Now()
	inst, err := f.rt.Start(ctx, spec)
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(spec.StateDir, ConsoleName))
		t.Fatalf("Start: %v\nconsole:\n%s", err, b)
	}
	t.Logf("start: %v", time.Since(t0))
	r, err := runtimetest.Exec(ctx, inst.Agent, "uname -r; grep -c hypervisor /proc/cpuinfo; hostname")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guest: %q", r.Stdout)
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", inst.Handle.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(st), "\nSeccomp:\t2") {
		t.Errorf("QEMU runs without its seccomp filter:\n%s", st)
	}
	// QEMU is in the VM's cgroup, limited to the guest's memory + QEMU's
	// own and, after boot, to the sandbox's CPU.
	if !f.rt.cg.v2 {
		procs, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", inst.Handle.Cgroup, "cgroup.procs"))
		limit, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", inst.Handle.Cgroup, "memory.limit_in_bytes"))
		quota, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", inst.Handle.Cgroup, "cpu.cfs_quota_us"))
		if !slices.Contains(strings.Fields(string(procs)), strconv.Itoa(inst.Handle.Pid)) ||
			strings.TrimSpace(string(limit)) != strconv.FormatInt((spec.MemoryMB+overheadMB)<<20, 10) ||
			strings.TrimSpace(string(quota)) != strconv.Itoa(int(spec.CPU*100000)) {
			t.Errorf("cgroup: procs %q, memory limit %q, cpu quota %q", procs, limit, quota)
		}
	}
	if b, err := os.ReadFile(filepath.Join(spec.StateDir, ConsoleName)); err == nil {
		t.Logf("console:\n%s", b)
	}
	r, _ = runtimetest.Exec(ctx, inst.Agent, "dmesg | tail -15")
	t.Logf("dmesg:\n%s", r.Stdout)
	if err := inst.Agent.Close(); err != nil {
		t.Log(err)
	}
	if err := f.rt.Destroy(ctx, inst.Handle); err != nil {
		t.Fatal(err)
	}
}

// TestIdleMemory reports where an idle VM's host memory goes (largest
// mappings of its QEMU by RSS) and checks the guest's memory limit holds.
func TestIdleMemory(t *testing.T) {
	f := newFixture(t)
	// A booted VM: it reports free pages (a template's VMs share their RAM
	// and do not: ramfile.go).
	f.rt.cfg.NoTemplates = true
	spec := f.spec(t, "mem")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	inst := f.boot(t, ctx, spec)
	time.Sleep(10 * time.Second)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", inst.Handle.Pid))
	if err != nil {
		t.Fatal(err)
	}
	type m struct {
		name string
		rss  int64
	}
	var ms []m
	var cur string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 5 && strings.Contains(f[0], "-") {
			cur = f[0] + " " + strings.Join(f[5:], " ")
		} else if len(f) >= 2 && f[0] == "Rss:" {
			var v int64
			fmt.Sscan(f[1], &v)
			if v > 1024 {
				ms = append(ms, m{cur, v})
			}
		}
	}
	var total int64
	for _, x := range ms {
		t.Logf("%8d KiB %s", x.rss, x.name)
		total += x.rss
	}
	if limit := int64(spec.MemoryMB+overheadMB) << 10; total > limit {
		t.Errorf("QEMU's RSS %d KiB is above its cgroup's limit %d KiB", total, limit)
	}
	r, err := runtimetest.Exec(ctx, inst.Agent, "free -m | awk '/^Mem:/ {print $2}'; cat /sys/bus/virtio/drivers/virtio_balloon/*/features /sys/module/page_reporting/parameters/page_reporting_order")
	if err != nil {
		t.Fatal(err)
	}
	f2 := strings.Fields(r.Stdout)
	var guestMB int64
	if len(f2) == 3 {
		fmt.Sscan(f2[0], &guestMB)
	}
	// The balloon's feature bit 5 is free page reporting; the agent has
	// it report free blocks of any order (not only 2 MiB ones).
	if len(f2) != 3 || guestMB <= 128 || guestMB > spec.MemoryMB || len(f2[1]) < 6 || f2[1][5] != '1' || f2[2] != "0" {
		t.Errorf("guest memory %d MiB (spec %d), balloon features, page reporting order: %q", guestMB, spec.MemoryMB, r.Stdout)
	}
}

// TestStripModuleSignature: the kernel package's modules are signed; the
// initramfs gets them without the signature, ELF otherwise intact.
func TestStripModuleSignature(t *testing.T) {
	k := testKernel(t)
	mods, err := k.modules()
	if err != nil || len(mods) == 0 {
		t.Skipf("SKIP: the kernel %s has no modules (%v)", k.Dir, err)
	}
	b, err := os.ReadFile(filepath.Join(k.Dir, "modules", mods[0]))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(string(b), moduleSigMagic) {
		t.Skipf("SKIP: %s is not signed", mods[0])
	}
	s := stripModuleSignature(b)
	if len(s) >= len(b) || strings.HasSuffix(string(s), moduleSigMagic) || string(s[:4]) != "\x7fELF" || string(b[:len(s)]) != string(s) {
		t.Errorf("stripped %d → %d bytes, ends %q", len(b), len(s), s[max(0, len(s)-30):])
	}
	if got := stripModuleSignature([]byte("\x7fELF unsigned")); string(got) != "\x7fELF unsigned" {
		t.Errorf("an unsigned module changed: %q", got)
	}
}

// counter starts a guest process that counts in /dev/shm/count, 10 a
// second. Each value is written aside and renamed into place, so that a
// reader never sees the file empty between truncate and write.
const counter = "(i=0; while :; do i=$((i+1)); echo $i > /dev/shm/count.new; mv /dev/shm/count.new /dev/shm/count; sleep 0.1; done) >/dev/null 2>&1 &"

// TestMemorySnapshot: pause writes the VM's memory to a file and ends
// QEMU; resume restores it through the same agent connection, processes
// and memory-only files intact; destroy removes the snapshot.
func TestMemorySnapshot(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "snap")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	inst, err := f.rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		inst.Agent.Close()
		if err := f.rt.Destroy(context.Background(), inst.Handle); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(filepath.Join(spec.Work, MemoryName)); err == nil {
			t.Error("the memory snapshot outlived Destroy")
		}
	}()
	// A file on tmpfs (memory only) and a process counting.
	r, err := runtimetest.Exec(ctx, inst.Agent, "echo in-memory > /dev/shm/mark; "+counter+" sleep 0.5; cat /dev/shm/count")
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("setup: %v %+v", err, r)
	}
	h := inst.Handle
	if err := f.rt.Freeze(ctx, h); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	before, after, err := f.rt.Reclaim(ctx, h)
	if err != nil {
		t.Fatalf("Reclaim: %v", err)
	}
	tPause := time.Since(t0)
	fi, err := os.Stat(filepath.Join(spec.Work, MemoryName))
	if err != nil {
		t.Fatalf("no memory snapshot: %v", err)
	}
	if f.rt.pidOf(h) != 0 || after != 0 || before == 0 {
		t.Errorf("after Reclaim: qemu pid %d, memory %d → %d", f.rt.pidOf(h), before, after)
	}
	t0 = time.Now()
	if err := f.rt.Restore(ctx, h, spec.MemoryMB); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	if err := f.rt.Thaw(ctx, h); err != nil {
		t.Fatal(err)
	}
	assertUnprivileged(t, f.rt.pidOf(h)) // the restored QEMU too
	r, err = runtimetest.Exec(ctx, inst.Agent, "cat /dev/shm/mark; a=$(cat /dev/shm/count); sleep 0.5; b=$(cat /dev/shm/count); [ $b -gt $a ] && echo counting")
	tResume := time.Since(t0)
	if err != nil || r.Stdout != "in-memory\ncounting\n" {
		t.Errorf("after restore: %v %q %q", err, r.Stdout, r.Stderr)
	}
	if _, err := os.Stat(filepath.Join(spec.Work, MemoryName)); err == nil {
		t.Error("the memory snapshot outlived the restore")
	}
	t.Logf("pause (snapshot %d MiB, QEMU RSS %d MiB freed) %v; resume to first exec %v",
		fi.Size()>>20, before>>20, tPause, tResume)
	// A second round through the same connection.
	if err := f.rt.Freeze(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.rt.Reclaim(ctx, h); err != nil {
		t.Fatal(err)
	}
	if err := f.rt.Restore(ctx, h, spec.MemoryMB); err != nil {
		t.Fatal(err)
	}
	if err := f.rt.Thaw(ctx, h); err != nil {
		t.Fatal(err)
	}
	if r, err := runtimetest.Exec(ctx, inst.Agent, "cat /dev/shm/mark"); err != nil || r.Stdout != "in-memory\n" {
		t.Errorf("after a second restore: %v %q", err, r.Stdout)
	}
}

// TestForkFromMemory: three VMs restored from one memory snapshot of a
// running VM each continue its processes (a counting shell) and keep its
// memory-only files; each has its own disk and hostname; the parent goes on.
func TestForkFromMemory(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "parent")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	parent, err := f.rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		parent.Agent.Close()
		if err := f.rt.Destroy(context.Background(), parent.Handle); err != nil {
			t.Error(err)
		}
	}()
	r, err := runtimetest.Exec(ctx, parent.Agent, "echo in-memory > /dev/shm/mark; echo parent > /root/disk; "+counter+" sleep 1; cat /dev/shm/count")
	if err != nil || r.ExitCode != 0 {
		t.Fatalf("setup: %v %+v", err, r)
	}
	var before int
	fmt.Sscan(r.Stdout, &before)
	var specs []*runtime.Spec
	for i := range 3 {
		specs = append(specs, f.spec(t, fmt.Sprintf("child%d", i)))
	}
	t0 := time.Now()
	kids, err := f.rt.Fork(ctx, parent.Handle, specs)
	if err != nil {
		t.Fatalf("Fork: %v", err)
	}
	t.Logf("fork of 3 from memory: %v", time.Since(t0))
	for i, k := range kids {
		assertUnprivileged(t, k.Handle.Pid)
		defer func() {
			k.Agent.Close()
			if err := f.rt.Destroy(context.Background(), k.Handle); err != nil {
				t.Error(err)
			}
		}()
		r, err := runtimetest.Exec(ctx, k.Agent, "cat /dev/shm/mark; a=$(cat /dev/shm/count); sleep 0.5; b=$(cat /dev/shm/count); echo $a; [ $b -gt $a ] && echo counting; hostname; cat /root/disk; echo child > /root/disk")
		if err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
		lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
		var got int
		if len(lines) == 5 {
			fmt.Sscan(lines[1], &got)
		}
		if len(lines) != 5 || lines[0] != "in-memory" || got < before || lines[2] != "counting" || lines[3] != specs[i].Hostname || lines[4] != "parent" {
			t.Errorf("child %d: %q (parent's count was %d)", i, r.Stdout, before)
		}
	}
	// The children report no free pages (the host would discard them from
	// the RAM they share): the balloon's driver is unbound.
	for i, k := range kids {
		r, err := runtimetest.Exec(ctx, k.Agent, "ls /sys/bus/virtio/drivers/virtio_balloon/ | grep -c '^virtio'")
		if err != nil || strings.TrimSpace(r.Stdout) != "0" {
			t.Errorf("child %d: balloon devices bound: %v %q", i, err, r.Stdout)
		}
	}
	// The children map one RAM file privately: its pages are shared
	// until a child writes them.
	time.Sleep(2 * time.Second) // let the children settle (free page reporting)
	var kidMem memUse
	ramFile := int64(0)
	for i, k := range kids {
		ram, size := ramMapping(k.Handle.Pid)
		if ram == "" {
			t.Errorf("child %d maps no RAM file", i)
			continue
		}
		ramFile = size
		kidMem.add(qemuMemUse(t, k.Handle.Pid))
	}
	cold := startCold(ctx, t, f, 3)
	var coldMem memUse
	for _, c := range cold {
		coldMem.add(qemuMemUse(t, c.Handle.Pid))
	}
	t.Logf("3 children: RSS %d MiB, PSS %d MiB, private %d MiB, + the RAM file %d MiB (allocated) = %d MiB; 3 cold VMs: RSS %d MiB, PSS %d MiB",
		kidMem.rss>>20, kidMem.pss>>20, kidMem.private>>20, ramFile>>20, (kidMem.private+ramFile)>>20, coldMem.rss>>20, coldMem.pss>>20)
	if kidMem.private+ramFile >= coldMem.pss {
		t.Errorf("the children's memory (private %d + file %d) is not below 3 cold VMs' (%d)", kidMem.private, ramFile, coldMem.pss)
	}

	// The children's disks are their own; the parent goes on counting.
	r, err = runtimetest.Exec(ctx, parent.Agent, "cat /root/disk; a=$(cat /dev/shm/count); sleep 0.5; b=$(cat /dev/shm/count); [ $b -gt $a ] && echo counting; hostname")
	if err != nil || r.Stdout != "parent\ncounting\n"+spec.Hostname+"\n" {
		t.Errorf("parent after the fork: %v %q", err, r.Stdout)
	}
	if _, err := os.Stat(filepath.Join(spec.Work, "vm-fork-memory")); err == nil {
		t.Error("the fork's memory snapshot was left")
	}
}

// memUse is QEMU processes' memory, in bytes.
type memUse struct{ rss, pss, private int64 }

func (m *memUse) add(o memUse) { m.rss += o.rss; m.pss += o.pss; m.private += o.private }

// qemuMemUse reads pid's smaps_rollup.
func qemuMemUse(t *testing.T, pid int) memUse {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/smaps_rollup")
	if err != nil {
		t.Fatal(err)
	}
	var m memUse
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		n, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Rss:":
			m.rss = n << 10
		case "Pss:":
			m.pss = n << 10
		case "Private_Clean:", "Private_Dirty:":
			m.private += n << 10
		}
	}
	return m
}

// ramMapping is the fork's RAM file that pid maps and its allocated size.
func ramMapping(pid int) (string, int64) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		return "", 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && (strings.Contains(f[5], "warren-vm-ram-") || strings.Contains(f[5], "/memfd:"+forkRAMName)) {
			var st syscall.Stat_t
			if err := syscall.Stat("/proc/"+strconv.Itoa(pid)+"/map_files/"+f[0], &st); err != nil {
				return f[5], 0
			}
			return f[5], st.Blocks * 512
		}
	}
	return "", 0
}

// startCold boots n VMs (from the kernel, not from a memory template)
// running the same counting loop as the fork's parent, for comparison;
// they are destroyed at the test's end.
func startCold(ctx context.Context, t *testing.T, f *fixture, n int) []*runtime.Instance {
	t.Helper()
	defer func(was bool) { f.rt.cfg.NoTemplates = was }(f.rt.cfg.NoTemplates)
	f.rt.cfg.NoTemplates = true
	var out []*runtime.Instance
	for i := range n {
		in, err := f.rt.Start(ctx, f.spec(t, fmt.Sprintf("cold%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			in.Agent.Close()
			if err := f.rt.Destroy(context.Background(), in.Handle); err != nil {
				t.Error(err)
			}
		})
		if _, err := runtimetest.Exec(ctx, in.Agent, "echo in-memory > /dev/shm/mark; "+counter); err != nil {
			t.Fatal(err)
		}
		out = append(out, in)
	}
	time.Sleep(2 * time.Second)
	return out
}
