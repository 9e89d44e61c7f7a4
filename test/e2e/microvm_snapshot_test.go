package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
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
	parallel(t)
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

	// The VM's next snapshot holds only what changed since (chained on the
	// first one), and a sandbox from it sees both.
	snap2, err := s.C.Snapshot(ctx, vm.ID, api.CreateSnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if snap2.Previous != snap.ID || snap2.Entries >= snap.Entries {
		t.Errorf("second snapshot: previous %q (want %s), %d entries (first: %d)", snap2.Previous, snap.ID, snap2.Entries, snap.Entries)
	}
	t.Logf("microVM snapshots: frozen %.1f ms and %.1f ms (%d and %d entries)", snap.FrozenMs, snap2.FrozenMs, snap.Entries, snap2.Entries)
	c2 := s.createFrom(t, api.TierContainer, snap2.ID)
	if r := s.sh(t, c2.ID, "cat /work/after /work/link"); r.Stdout != "after\nmade in the vm\n" {
		t.Errorf("a container from the vm's second snapshot sees %q (stderr %q)", r.Stdout, r.Stderr)
	}

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
	for _, id := range []string{vm.ID, c.ID, c2.ID, m.ID, m2.ID} {
		if _, err := s.C.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	s.stop()
	assertNoLeaks(t, s)
}

// TestMicroVMTrajectory: a microVM records a trajectory with checkpoints
// (disk snapshots of the VM). kill -9 of warren: the VM is adopted and a
// resuming client's steps are replayed. kill -9 again, the VM lost too:
// resume rebuilds a microVM from the last checkpoint, replays the logged
// steps and runs the new ones live on it.
func TestMicroVMTrajectory(t *testing.T) {
	parallel(t)
	kdir := vmKernelDir(t)
	s := startServer(t, "--vm-kernel", kdir)
	ctx := context.Background()
	const traj = "vm-rollout"
	sb := s.create(t, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256, Trajectory: traj, Checkpoint: "every-step"})
	if _, err := s.C.Mkdir(ctx, sb.ID, api.MkdirRequest{Path: "/state"}); err != nil {
		t.Fatal(err)
	}
	const n = 4
	for i := 1; i <= n; i++ {
		if res, err := s.C.Exec(ctx, sb.ID, counterOp(i)); err != nil || strings.TrimSpace(res.Stdout) != fmt.Sprint(i) {
			t.Fatalf("step %d: %+v %v", i, res, err)
		}
	}
	steps, err := s.C.TrajectoryAll(ctx, traj)
	if err != nil || len(steps) != n+1 || steps[n].Checkpoint == "" {
		t.Fatalf("checkpoints: %d steps %v\n%s", len(steps), err, tail(s.logs.String(), 20))
	}

	// kill -9 of warren; the VM runs on and is adopted; a resuming client
	// is answered from the log.
	s.kill9()
	s.start()
	if _, err := s.C.ResumeTrajectory(ctx, traj, false); err != nil {
		t.Fatalf("resume: %v", err)
	}
	replay := func(id string) {
		t.Helper()
		if r, err := s.C.Mkdir(ctx, id, api.MkdirRequest{Path: "/state"}); err != nil || !r.Replayed {
			t.Fatalf("replayed mkdir: %+v %v", r, err)
		}
		for i := 1; i <= n; i++ {
			if res, err := s.C.Exec(ctx, id, counterOp(i)); err != nil || !res.Replayed || strings.TrimSpace(res.Stdout) != fmt.Sprint(i) {
				t.Fatalf("replay %d: %+v %v", i, res, err)
			}
		}
	}
	replay(sb.ID)
	if res, err := s.C.Exec(ctx, sb.ID, counterOp(n+1)); err != nil || res.Replayed || strings.TrimSpace(res.Stdout) != fmt.Sprint(n+1) {
		t.Fatalf("live step on the adopted VM: %+v %v", res, err)
	}

	// kill -9 again, and the VM is lost while warren is down.
	steps, err = s.C.TrajectoryAll(ctx, traj)
	if err != nil || len(steps) != n+2 || steps[n+1].Checkpoint == "" {
		t.Fatalf("checkpoints: %d steps %v", len(steps), err)
	}
	pid := agentPid(t, s, sb.ID)
	s.kill9()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	s.start()
	nb, err := s.C.ResumeTrajectory(ctx, traj, false)
	if err != nil {
		t.Fatalf("resume of a lost microVM: %v\n%s", err, tail(s.logs.String(), 30))
	}
	t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), nb.ID) })
	if nb.ID == sb.ID || nb.Tier != api.TierMicroVM || nb.Snapshot != steps[n+1].Checkpoint {
		t.Fatalf("rebuilt sandbox: %+v (checkpoint %s)", nb, steps[n+1].Checkpoint)
	}
	replay(nb.ID)
	if res, err := s.C.Exec(ctx, nb.ID, counterOp(n+1)); err != nil || !res.Replayed {
		t.Fatalf("replay %d: %+v %v", n+1, res, err)
	}
	if res, err := s.C.Exec(ctx, nb.ID, counterOp(n+2)); err != nil || res.Replayed || res.Step != int64(n+3) {
		t.Fatalf("live step on the rebuilt VM: %+v %v", res, err)
	}
	if got := s.sh(t, nb.ID, "wc -l < /counter; ls /state | wc -l; grep -c hypervisor /proc/cpuinfo").Stdout; got != fmt.Sprintf("%d\n%d\n1\n", n+2, n+2) {
		t.Fatalf("rebuilt VM's filesystem: %q", got)
	}
	if _, err := s.C.Delete(ctx, nb.ID); err != nil {
		t.Fatal(err)
	}
	s.stop()
	assertNoLeaks(t, s)
}

// TestVMTierSnapshot: the vm tier (q35, the same agent and disks) takes
// disk snapshots as the microvm tier does, also of a paused VM; one starts
// a container and a vm.
func TestVMTierSnapshot(t *testing.T) {
	parallel(t)
	kdir := vmKernelDir(t)
	s := startServer(t, "--vm-kernel", kdir)
	ctx := context.Background()
	vm := s.create(t, api.CreateSandboxRequest{Tier: api.TierVM, MemoryMB: 256})
	if r := s.sh(t, vm.ID, "echo from q35 > /root/q && rm /etc/group && echo ok"); r.Stdout != "ok\n" {
		t.Fatalf("setup: %q %q", r.Stdout, r.Stderr)
	}
	// Paused (its memory in a file, no QEMU): the snapshot restores it
	// first, and the agent's hold on its disk survives the restore.
	if _, err := s.C.Pause(ctx, vm.ID); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	snap, err := s.C.Snapshot(ctx, vm.ID, api.CreateSnapshotRequest{Stop: true})
	if err != nil {
		t.Fatalf("snapshot of a vm: %v\n%s", err, tail(s.logs.String(), 20))
	}
	t.Logf("vm snapshot of a paused vm (with its restore): %v (frozen %.1f ms)", time.Since(t0), snap.FrozenMs)
	if got, err := s.C.Get(ctx, vm.ID); err != nil || got.State != api.StateStopped {
		t.Errorf("after snapshot with stop: %+v %v", got, err)
	}
	for _, tier := range []string{api.TierContainer, api.TierVM} {
		sb := s.createFrom(t, tier, snap.ID)
		if r := s.sh(t, sb.ID, "cat /root/q; test -e /etc/group || echo gone"); r.Stdout != "from q35\ngone\n" {
			t.Errorf("%s from a vm's snapshot sees %q (stderr %q)", tier, r.Stdout, r.Stderr)
		}
		if _, err := s.C.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.C.Delete(ctx, vm.ID); err != nil {
		t.Fatal(err)
	}
	s.stop()
	assertNoLeaks(t, s)
}

// TestMicroVMForkDisk: a fork (not from memory) of a microVM is one disk
// snapshot and children of the source's tier, which see its files.
func TestMicroVMForkDisk(t *testing.T) {
	parallel(t)
	kdir := vmKernelDir(t)
	s := startServer(t, "--vm-kernel", kdir)
	ctx := context.Background()
	vm := s.create(t, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256})
	if r := s.sh(t, vm.ID, "echo forked > /root/f && echo ok"); r.Stdout != "ok\n" {
		t.Fatalf("setup: %q %q", r.Stdout, r.Stderr)
	}
	res, err := s.C.Fork(ctx, vm.ID, 2)
	if err != nil {
		t.Fatalf("fork: %v\n%s", err, tail(s.logs.String(), 20))
	}
	if res.Snapshot == nil || len(res.Sandboxes) != 2 {
		t.Fatalf("fork: %+v", res)
	}
	for _, kid := range res.Sandboxes {
		t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), kid.ID) })
		r := s.sh(t, kid.ID, "cat /root/f; grep -c hypervisor /proc/cpuinfo")
		if kid.Tier != api.TierMicroVM || r.Stdout != "forked\n1\n" {
			t.Errorf("child %s: tier %q, sees %q (stderr %q)", kid.ID, kid.Tier, r.Stdout, r.Stderr)
		}
	}
	for _, id := range []string{vm.ID, res.Sandboxes[0].ID, res.Sandboxes[1].ID} {
		if _, err := s.C.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	s.stop()
	assertNoLeaks(t, s)
}

// TestMicroVMSnapshotRefusal: a container's snapshot that attaches a layer
// at a path (a protected toolkit) cannot start a microVM (the tier has no
// such attachments yet): a 422 that says why, not a failed start.
func TestMicroVMSnapshotRefusal(t *testing.T) {
	parallel(t)
	kdir := vmKernelDir(t)
	s := startServer(t, "--vm-kernel", kdir)
	ctx := context.Background()
	if _, err := s.C.CreateLayerFromTar(ctx, "tk/vm", 0, bytes.NewReader(tarOf(t, [2]string{"bin/tool", "x"}))); err != nil {
		t.Fatal(err)
	}
	c := s.create(t, api.CreateSandboxRequest{Layers: []api.LayerAttachment{{Layer: "tk/vm", Mount: "/opt/tk", Protected: true}}})
	snap, err := s.C.Snapshot(ctx, c.ID, api.CreateSnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.C.Create(ctx, api.CreateSandboxRequest{Tier: api.TierMicroVM, Snapshot: snap.ID})
	var we *warren.APIError
	if !errors.As(err, &we) || we.Status != 422 || !strings.Contains(we.Message, "/opt/tk") {
		t.Fatalf("a microVM from a snapshot with a layer at a path: %v", err)
	}
	if q := qemusOf(s.dataDir); q != "" {
		t.Errorf("QEMU started: %s", q)
	}
}
