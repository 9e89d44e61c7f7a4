package microvm

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/runtime/runtimetest"
)

// mapsTemplateRAM reports whether QEMU pid maps a memory template's RAM
// file (so the VM was restored from one, not booted).
func mapsTemplateRAM(t *testing.T, pid int) bool {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "/memfd:"+templateRAMName) {
			return true
		}
	}
	return false
}

// TestMemoryTemplate: VMs of one shape are restored from its memory
// template, each with its own disks (a layer attached at a path too), its
// own hostname and random numbers, and the host's clock although the
// template's memory is older; a VM with more disks than the template's
// slots boots from its kernel; New removes templates of other generations.
func TestMemoryTemplate(t *testing.T) {
	stale := filepath.Join(buildDir, "cache", templatesDir, "0123456789abcdef-256m-1c")
	if err := os.MkdirAll(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	f := newFixture(t)
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("a template of another generation outlived New: %v", err)
	}
	// The placeholder disk is every generation's (VMs of an older one
	// name it in their command lines): New keeps it.
	if _, err := os.Stat(f.rt.placeholder()); err != nil {
		t.Errorf("the placeholder disk: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	a := f.boot(t, ctx, f.spec(t, "tmpl-a"))
	tmpl := f.rt.templateFor(ctx, f.spec(t, "tmpl-a"), 1, 0) // built: a's
	if tmpl == nil {
		t.Fatal("no template for a's shape")
	}
	ramSum := fileSum(t, tmpl.ram)
	// The template is at least this old when b restores it: without the
	// clock set at restore, b's clock would be as far behind.
	time.Sleep(6 * time.Second)
	specB := f.spec(t, "tmpl-b")
	specB.Binds = []agentproto.Bind{{Source: filepath.Join(f.base, "tool"), Target: "/opt/tool"}}
	b := f.boot(t, ctx, specB)

	const probe = "hostname; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; date +%s; " +
		"echo mine > /root/$(hostname); ls /root | tr '\\n' ' '; echo; ls /opt/tool/bin/busybox 2>&1"
	out := map[string][]string{}
	for name, in := range map[string]*runtime.Instance{"a": a, "b": b} {
		if !mapsTemplateRAM(t, in.Handle.Pid) {
			t.Errorf("VM %s was not restored from a memory template", name)
		}
		r, err := runtimetest.Exec(ctx, in.Agent, probe)
		if err != nil || r.ExitCode > 1 {
			t.Fatalf("VM %s: %v %+v", name, err, r)
		}
		out[name] = strings.Split(strings.TrimSpace(r.Stdout), "\n")
		if len(out[name]) != 5 {
			t.Fatalf("VM %s answered %q", name, r.Stdout)
		}
		lines := out[name]
		if lines[0] != "vm-tmpl-"+name {
			t.Errorf("VM %s: hostname %q", name, lines[0])
		}
		guest, _ := strconv.ParseInt(lines[2], 10, 64)
		if d := time.Now().Unix() - guest; d > 3 || d < -3 {
			t.Errorf("VM %s: guest clock %d s off the host's", name, d)
		}
		if strings.TrimSpace(lines[3]) != "vm-tmpl-"+name {
			t.Errorf("VM %s sees another VM's disk: /root holds %q", name, lines[3])
		}
		if want := (name == "b"); strings.HasPrefix(lines[4], "/opt/tool/bin/busybox") != want {
			t.Errorf("VM %s: the layer attached at /opt/tool: %q", name, lines[4])
		}
	}
	var blocks int64
	for _, n := range []string{templateDevice, templateRAM} {
		var st syscall.Stat_t
		if err := syscall.Stat(tmpl.path(n), &st); err != nil {
			t.Error(err)
		}
		blocks += st.Blocks
	}
	t.Logf("the template's files take %d MiB of disk", blocks*512>>20)
	if out["a"][1] == out["b"][1] || len(out["a"][1]) != 32 {
		t.Errorf("random bytes: %q and %q", out["a"][1], out["b"][1])
	}

	// The VMs freed memory meanwhile (the guest reports free pages to
	// the host): the template's RAM, which every VM of the shape maps,
	// must not have changed.
	if got := fileSum(t, tmpl.ram); got != ramSum {
		t.Errorf("the template's RAM changed while VMs ran from it")
	}
	// No VM of a template reports free pages (the host would discard them
	// from the RAM they share): no balloon driver.
	if r, err := runtimetest.Exec(ctx, a.Agent, "ls -d /sys/bus/virtio/drivers/virtio_balloon 2>/dev/null || echo none"); err != nil || r.Stdout != "none\n" {
		t.Errorf("balloon driver in a template's VM: %v %q", err, r.Stdout)
	}
	// Nothing can change it: the memfd is sealed.
	if _, err := tmpl.ram.WriteAt([]byte{1}, 4096); err == nil {
		t.Error("a write to the template's RAM succeeded")
	}

	// More layers than the template has slots: booted from the kernel.
	spec := f.spec(t, "tmpl-many")
	for i := range templateLayers {
		spec.Lowers = append(spec.Lowers, filepath.Join(f.base, "extra"+strconv.Itoa(i)))
	}
	c := f.boot(t, ctx, spec)
	if mapsTemplateRAM(t, c.Handle.Pid) {
		t.Errorf("a VM of %d layers was restored from a template of %d slots", len(spec.Lowers), templateLayers)
	}
	if r, err := runtimetest.Exec(ctx, c.Agent, "hostname"); err != nil || r.Stdout != "vm-tmpl-many\n" {
		t.Errorf("the booted VM: %v %+v", err, r)
	}
}

// fileSum is the SHA-256 of f's content (hex).
func fileSum(t *testing.T, f *os.File) string {
	t.Helper()
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, 1<<40)); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", h.Sum(nil))
}

// TestWarmTemplate: WarmTemplate builds the default shape's template before
// any create asks for it (serve calls it at start); the edge's reconcile,
// which may run meanwhile, is not shown the template's VM as a leftover;
// templates off, nothing is built.
func TestWarmTemplate(t *testing.T) {
	f := newFixture(t)
	f.rt.cfg.CacheDir = t.TempDir() // no template built yet
	if err := f.rt.makePlaceholder(); err != nil {
		t.Fatal(err)
	}
	shape := templateShape{memMB: DefaultMemoryMB, smp: 1}
	f.rt.WarmTemplate()
	f.rt.mu.Lock()
	b := f.rt.templates[shape]
	f.rt.mu.Unlock()
	if b == nil {
		t.Fatal("WarmTemplate started no build of the default shape")
	}
	sawBuild := false
	for deadline := time.Now().Add(time.Minute); !sawBuild && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		qs, err := f.rt.findQEMUs()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range qs {
			sawBuild = sawBuild || strings.HasPrefix(q.id, ".template-")
		}
	}
	if !sawBuild {
		t.Fatal("no template VM ran")
	}
	left, err := f.rt.Leftovers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range left {
		if strings.HasPrefix(h.ID, ".template-") {
			t.Errorf("the template being built is listed as a leftover: %+v", h)
		}
	}
	select {
	case <-b.done:
	case <-time.After(3 * time.Minute):
		t.Fatal("the build did not end in 3 minutes")
	}
	if b.err != nil || !templateComplete(b.t) {
		t.Fatalf("the default shape's template: %v", b.err)
	}

	off := newFixture(t)
	off.rt.cfg.NoTemplates = true
	off.rt.WarmTemplate()
	off.rt.mu.Lock()
	n := len(off.rt.templates)
	off.rt.mu.Unlock()
	if n != 0 {
		t.Errorf("templates off, and WarmTemplate started %d builds", n)
	}
}
