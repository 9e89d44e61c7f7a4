package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// TestMicroVMForkMemory: POST /fork {"memory": true} on a microVM gives N
// sandboxes restored from one memory snapshot of it. A Python interpreter
// of the source holds a counter in memory only (read from a file it then
// deleted) and waits; in each child the same interpreter continues and
// writes counter+1. (The guest is busybox with the host's Python 3 as a
// named layer over it: hostPythonLayer.) Each child has its own hostname,
// machine-id and random numbers, is its source's project's, and goes
// without a trace when deleted; the source runs on. A container is
// refused with a 422 naming the tiers that can.
func TestMicroVMForkMemory(t *testing.T) {
	parallel(t)
	kdir := vmKernelDir(t)
	s := startServer(t, "--vm-kernel", kdir)
	ctx := context.Background()

	ct := s.create(t, api.CreateSandboxRequest{})
	_, err := s.C.ForkMemory(ctx, ct.ID, 2)
	var ae *api.Error
	if !errors.As(err, &ae) || api.HTTPStatus(ae.Code) != 422 || !strings.Contains(ae.Message, api.TierMicroVM) || !strings.Contains(ae.Message, "container") {
		t.Errorf("memory fork of a container: want a 422 naming the tier microvm, got %v", err)
	}

	py := hostPythonLayer(t, s)
	src := s.create(t, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256, Layers: []api.LayerAttachment{{Layer: py}}})
	seed := 1000 + rand.IntN(1_000_000)
	// The counter lives in the interpreter only: the seed file is gone
	// before the fork. The result is written aside and renamed, so a
	// reader never finds it half written.
	holder := `import os, time
n = int(open("/tmp/seed").read())
os.remove("/tmp/seed")
while not os.path.exists("/tmp/go"):
    time.sleep(0.2)
n += 1
with open("/tmp/out.new", "w") as f:
    f.write("%d\n" % n)
os.rename("/tmp/out.new", "/tmp/out")
`
	script := fmt.Sprintf("echo %d > /tmp/seed; cat > /tmp/holder.py <<'EOF'\n%sEOF\n"+
		"python3 /tmp/holder.py </dev/null >/tmp/holder.log 2>&1 & "+
		"echo $!; cat /etc/machine-id 2>/dev/null; hostname", seed, holder)
	r := s.sh(t, src.ID, script)
	f := strings.Fields(r.Stdout)
	if r.ExitCode != 0 || len(f) < 2 {
		t.Fatalf("start the holder: %q exit %d %q", r.Stdout, r.ExitCode, r.Stderr)
	}
	pid := f[0]
	srcMachineID := ""
	if len(f) == 3 {
		srcMachineID = f[1]
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.sh(t, src.ID, "test -e /tmp/seed && echo there").Stdout != "" {
		if time.Now().After(deadline) {
			t.Fatalf("the holder did not read its seed: %q", s.sh(t, src.ID, "cat /tmp/holder.log").Stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}

	t0 := time.Now()
	res, err := s.C.ForkMemory(ctx, src.ID, 3)
	if err != nil {
		t.Fatalf("fork from memory: %v\nserver log:\n%s", err, tail(s.logs.String(), 40))
	}
	t.Logf("fork 3 from memory: %v", time.Since(t0))
	if res.Snapshot != nil || len(res.Sandboxes) != 3 {
		t.Fatalf("fork result: %+v", res)
	}
	hosts, ids, rnd := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, k := range res.Sandboxes {
		t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), k.ID) })
		if k.Tier != api.TierMicroVM || k.Project != src.Project || k.State != api.StateRunning || k.ID == src.ID {
			t.Errorf("child %+v of %+v", k, src)
		}
		// The holder runs on with its value: it was not started again.
		r := s.sh(t, k.ID, "test -e /tmp/seed && echo seed-back; kill -0 "+pid+" && touch /tmp/go; "+
			"for n in $(seq 50); do [ -s /tmp/out ] && break; sleep 0.2; done; cat /tmp/out; "+
			"hostname; cat /etc/machine-id; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \\n'")
		out := strings.Split(strings.TrimSpace(r.Stdout), "\n")
		if r.ExitCode != 0 || len(out) != 4 || out[0] != fmt.Sprint(seed+1) {
			t.Errorf("child %s: %q exit %d %q (want %d first)", k.ID, r.Stdout, r.ExitCode, r.Stderr, seed+1)
			continue
		}
		if out[1] != k.ID {
			t.Errorf("child %s: hostname %q", k.ID, out[1])
		}
		if len(out[2]) != 32 || out[2] == srcMachineID || ids[out[2]] {
			t.Errorf("child %s: machine-id %q (source's %q, siblings' %v)", k.ID, out[2], srcMachineID, ids)
		}
		if rnd[out[3]] {
			t.Errorf("child %s: the same random bytes as a sibling: %s", k.ID, out[3])
		}
		hosts[out[1]], ids[out[2]], rnd[out[3]] = true, true, true
	}
	// A child pauses (its memory, private and shared, to a file) and
	// resumes like any VM.
	k0 := res.Sandboxes[0].ID
	if _, err := s.C.Pause(ctx, k0); err != nil {
		t.Fatalf("pause a child: %v", err)
	}
	if r := s.sh(t, k0, "cat /tmp/out; hostname"); r.Stdout != fmt.Sprintf("%d\n%s\n", seed+1, k0) {
		t.Errorf("child after pause and resume: %q exit %d %q", r.Stdout, r.ExitCode, r.Stderr)
	}
	// The source runs on, with its own holder.
	if r := s.sh(t, src.ID, "touch /tmp/go; for n in $(seq 50); do [ -s /tmp/out ] && break; sleep 0.2; done; cat /tmp/out"); r.Stdout != fmt.Sprintf("%d\n", seed+1) {
		t.Errorf("source after the fork: %q exit %d", r.Stdout, r.ExitCode)
	}

	for _, k := range res.Sandboxes {
		if _, err := s.C.Delete(ctx, k.ID); err != nil {
			t.Errorf("delete %s: %v", k.ID, err)
		}
		if q := qemusOf(s.dataDir); strings.Contains(q, k.ID) {
			t.Errorf("QEMU of %s left after delete: %s", k.ID, q)
		}
	}
	if _, err := s.C.Delete(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	var left []string
	_ = filepath.Walk(s.dataDir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && (strings.HasSuffix(p, ".ext4") || strings.Contains(filepath.Base(p), "vm-fork") || strings.Contains(filepath.Base(p), "vm-memory")) {
			left = append(left, p)
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("left after delete: %v", left)
	}
	s.stop()
	assertNoLeaks(t, s)
	if q := qemusOf(s.dataDir); q != "" {
		t.Errorf("QEMU left after shutdown: %s", q)
	}
}

// hostPythonLayer makes the named layer "py/host": the host's Python 3
// (its interpreter, the shared libraries it loads and its standard library,
// without tests, IDLE, Tk and the like), to stack over busybox.
func hostPythonLayer(t *testing.T, s *server) string {
	t.Helper()
	bin, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Fatalf("the host's python3: %v", err)
	}
	ver := filepath.Base(bin) // python3.11
	dir := t.TempDir()
	copyTo := func(src, dst string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(dst)), 0o755); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("cp", "-a", "--dereference", src, filepath.Join(dir, dst)).CombinedOutput(); err != nil {
			t.Fatalf("cp %s: %v %s", src, err, out)
		}
	}
	copyTo(bin, "usr/bin/python3")
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		t.Fatalf("ldd %s: %v", bin, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				copyTo(f, strings.TrimPrefix(f, "/"))
			}
		}
	}
	lib := "/usr/lib/" + ver
	ents, err := os.ReadDir(lib)
	if err != nil {
		t.Fatal(err)
	}
	skip := map[string]bool{"test": true, "idlelib": true, "tkinter": true, "lib2to3": true, "ensurepip": true,
		"dist-packages": true, "site-packages": true, "__pycache__": true, "turtledemo": true}
	for _, e := range ents {
		if !skip[e.Name()] && !strings.HasPrefix(e.Name(), "config-") {
			copyTo(filepath.Join(lib, e.Name()), strings.TrimPrefix(filepath.Join(lib, e.Name()), "/"))
		}
	}
	if out, err := s.warren(t, "layer", "create", "--from-dir", dir, "--name", "py/host"); err != nil {
		t.Fatalf("layer create py/host: %v\n%s", err, out)
	}
	return "py/host"
}
