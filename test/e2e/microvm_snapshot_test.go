package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// createFrom creates a sandbox of tier from snapshot snapID.
func (s *server) createFrom(t *testing.T, tier, snapID string) *api.Sandbox {
	t.Helper()
	sb, err := s.C.Create(context.Background(), api.CreateSandboxRequest{Tier: tier, Snapshot: snapID, MemoryMB: 256})
	if err != nil {
		t.Fatalf("create %s from %s: %v\nserver log:\n%s", tier, snapID, err, tail(s.logs.String(), 40))
	}
	t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), sb.ID) })
	return sb
}

// TestMicroVMSnapshot: a disk snapshot of a microVM (its writable disk's
// changes: new files, a removed image file, a symlink, a setuid bit the
// image never had) starts a container and a microVM that both see those
// changes; a container's snapshot starts a microVM.
func TestMicroVMSnapshot(t *testing.T) {
	kdir := vmKernelDir(t)
	s := startServer(t, "--vm-kernel", kdir)
	ctx := context.Background()
	t0 := time.Now()

	vm := s.create(t, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256})
	r := s.sh(t, vm.ID, "mkdir -p /work/sub && echo made in the vm > /work/sub/f && ln -s sub/f /work/link && "+
		"cp /bin/busybox /work/suid && chmod 4755 /work/suid && rm /etc/group && echo ok")
	if r.Stdout != "ok\n" {
		t.Fatalf("setup in the vm: %q %q", r.Stdout, r.Stderr)
	}
	snap, err := s.C.Snapshot(ctx, vm.ID, api.CreateSnapshotRequest{Name: "vm-state"})
	if err != nil {
		t.Fatalf("snapshot of a microVM: %v\n%s", err, tail(s.logs.String(), 20))
	}
	if snap.Entries == 0 || snap.Image != "busybox" {
		t.Errorf("snapshot: %+v", snap)
	}
	// The VM runs on after the snapshot, its disk writable.
	if r := s.sh(t, vm.ID, "echo after > /work/after && cat /work/sub/f"); r.Stdout != "made in the vm\n" {
		t.Errorf("vm after its snapshot: %q %q", r.Stdout, r.Stderr)
	}

	check := func(id, what string) {
		t.Helper()
		r := s.sh(t, id, "cat /work/link; test -e /etc/group && echo group; test -e /work/after && echo after; stat -c %a /work/suid")
		if r.Stdout != "made in the vm\n755\n" {
			t.Errorf("%s from the vm's snapshot sees %q (stderr %q)", what, r.Stdout, r.Stderr)
		}
	}
	c := s.createFrom(t, api.TierContainer, snap.ID)
	check(c.ID, "a container")
	m := s.createFrom(t, api.TierMicroVM, snap.ID)
	check(m.ID, "a microVM")

	// The other way: a container's snapshot starts a microVM.
	if r := s.sh(t, c.ID, "echo made in the container > /work/c && rm /work/sub/f && echo ok"); r.Stdout != "ok\n" {
		t.Fatalf("container: %q %q", r.Stdout, r.Stderr)
	}
	csnap, err := s.C.Snapshot(ctx, c.ID, api.CreateSnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	m2 := s.createFrom(t, api.TierMicroVM, csnap.ID)
	if r := s.sh(t, m2.ID, "cat /work/c; test -e /work/sub/f || echo gone; test -d /work/sub && echo dir"); r.Stdout != "made in the container\ngone\ndir\n" {
		t.Errorf("a microVM from a container's snapshot sees %q (stderr %q)", r.Stdout, r.Stderr)
	}
	t.Logf("microVM snapshot round trips: %v", time.Since(t0))
	for _, id := range []string{vm.ID, c.ID, m.ID, m2.ID} {
		if _, err := s.C.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	s.stop()
	assertNoLeaks(t, s)
}
