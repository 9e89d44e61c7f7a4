package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// TestMicroVMForkMemory: POST /fork {"memory": true} on a microVM gives N
// sandboxes restored from one memory snapshot of it. A process of the
// source holds a value in memory only (read from a file it then deleted)
// and waits; in each child the same process continues and writes value+1.
// Each child has its own hostname, machine-id and random numbers, is its
// source's project's, and goes without a trace when deleted; the source
// runs on. (The test holds the counter in a Python interpreter; the
// guest's image is busybox, so a shell process holds it here: the same
// thing, a process's memory carried into the children.) A container is
// refused with a 422 naming the tiers that can.
func TestMicroVMForkMemory(t *testing.T) {
	kdir := vmKernelDir(t)
	s := startServer(t, "--vm-kernel", kdir)
	ctx := context.Background()

	ct := s.create(t, api.CreateSandboxRequest{})
	_, err := s.C.ForkMemory(ctx, ct.ID, 2)
	var ae *api.Error
	if !errors.As(err, &ae) || api.HTTPStatus(ae.Code) != 422 || !strings.Contains(ae.Message, api.TierMicroVM) || !strings.Contains(ae.Message, "container") {
		t.Errorf("memory fork of a container: want a 422 naming the tier microvm, got %v", err)
	}

	src := s.create(t, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256})
	seed := 1000 + rand.IntN(1_000_000)
	script := fmt.Sprintf(`echo %d > /tmp/seed; `+
		`sh -c 'i=$(cat /tmp/seed); rm /tmp/seed; while [ ! -e /tmp/go ]; do sleep 0.2; done; echo $((i+1)) > /tmp/out' </dev/null >/dev/null 2>&1 & `+
		`echo $!; cat /etc/machine-id 2>/dev/null; hostname`, seed)
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
			t.Fatal("the holder did not read its seed")
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
