package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

func TestSnapshotRestoreChainFork(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	src := s.create(t, api.CreateSandboxRequest{})
	s.sh(t, src.ID, "mkdir -p /work && echo one > /work/a && echo gone > /work/b && echo base > /etc/motd")
	// A command writing while the snapshot is taken: the snapshot is consistent.
	bg, err := s.C.Exec(ctx, src.ID, api.ExecRequest{Cmd: "i=0; while [ $i -lt 200 ]; do echo $i >> /work/busy; i=$((i+1)); done", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	snap1, err := s.C.Snapshot(ctx, src.ID, api.CreateSnapshotRequest{Name: "first"})
	if err != nil {
		t.Fatalf("snapshot: %v\n%s", err, tail(s.logs.String(), 30))
	}
	if snap1.Image != "busybox" || snap1.Diff == "" || len(snap1.Layers) != 1 || snap1.Name != "first" {
		t.Fatalf("snapshot record: %+v", snap1)
	}
	if _, err := s.C.Command(ctx, src.ID, bg.CommandID, true); err != nil {
		t.Fatal(err)
	}
	// The source keeps running and changes after the snapshot do not leak in.
	s.sh(t, src.ID, "echo two > /work/a")

	r1 := restore(t, s, snap1.ID)
	if r1.Snapshot != snap1.ID || r1.Image != "busybox" {
		t.Fatalf("restored sandbox: %+v", r1)
	}
	if got := s.sh(t, r1.ID, "cat /work/a /work/b /etc/motd").Stdout; got != "one\ngone\nbase\n" {
		t.Fatalf("restored filesystem: %q", got)
	}
	// Chain: the restored sandbox's snapshot packs only what changed since.
	s.sh(t, r1.ID, "rm /work/b && echo three > /work/c")
	snap2, err := s.C.Snapshot(ctx, r1.ID, api.CreateSnapshotRequest{Stop: true})
	if err != nil {
		t.Fatal(err)
	}
	if snap2.Parent != snap1.ID || len(snap2.Layers) != 2 || snap2.Layers[0].Layer != snap1.Diff {
		t.Fatalf("chained snapshot: %+v", snap2)
	}
	if snap2.Entries > 4 { // /work, /work/b whiteout, /work/c (and maybe /)
		t.Fatalf("the second diff packed %d entries: not incremental", snap2.Entries)
	}
	if got, _ := s.C.Get(ctx, r1.ID); got.State != api.StateStopped {
		t.Fatalf("stop: true left the sandbox %s", got.State)
	}
	r2 := restore(t, s, snap2.ID)
	if got := s.sh(t, r2.ID, "cat /work/a /work/c; ls /work").Stdout; got != "one\nthree\na\nbusy\nc\n" {
		t.Fatalf("restored chain: %q", got)
	}
	if got, err := s.C.GetSnapshot(ctx, snap2.ID); err != nil || got.Digest != snap2.Digest {
		t.Fatalf("get snapshot: %+v %v", got, err)
	}

	// Fork: N sandboxes from the source's current state; the source runs on.
	t0 := time.Now()
	fr, err := s.C.Fork(ctx, src.ID, 3)
	if err != nil {
		t.Fatalf("fork: %v\n%s", err, tail(s.logs.String(), 30))
	}
	t.Logf("fork of 3 in %v", time.Since(t0))
	if len(fr.Sandboxes) != 3 {
		t.Fatalf("fork: %+v", fr)
	}
	for i, k := range fr.Sandboxes {
		t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), k.ID) })
		s.sh(t, k.ID, "echo kid > /work/kid"+string(rune('0'+i)))
		if got := s.sh(t, k.ID, "cat /work/a; ls /work | grep -c kid").Stdout; got != "two\n1\n" {
			t.Fatalf("fork %d: %q", i, got)
		}
	}
	if got := s.sh(t, src.ID, "cat /work/a; ls /work | grep -c kid || true").Stdout; got != "two\n0\n" {
		t.Fatalf("source after fork: %q", got)
	}

	// Bad input.
	for _, tc := range []struct {
		req  api.CreateSandboxRequest
		code string
	}{
		{api.CreateSandboxRequest{Snapshot: "snap-nosuchthing"}, api.CodeNotFound},
		{api.CreateSandboxRequest{Snapshot: "../x"}, api.CodeInvalid},
		{api.CreateSandboxRequest{Snapshot: snap1.ID, Image: "busybox"}, api.CodeInvalid},
	} {
		if _, err := s.C.Create(ctx, tc.req); err == nil || !strings.Contains(err.Error(), tc.code) {
			t.Errorf("create %+v: %v, want %s", tc.req, err, tc.code)
		}
	}
	if _, err := s.C.Fork(ctx, src.ID, 1000); err == nil || !strings.Contains(err.Error(), api.CodeInvalid) {
		t.Errorf("fork of 1000: %v", err)
	}
	if _, err := s.C.Fork(ctx, src.ID, 0); err == nil || !strings.Contains(err.Error(), api.CodeInvalid) {
		t.Errorf("fork of 0: %v", err)
	}
}

func TestSnapshotDeleteInUse(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	src := s.create(t, api.CreateSandboxRequest{})
	s.sh(t, src.ID, "echo a > /a")
	a, err := s.C.Snapshot(ctx, src.ID, api.CreateSnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	r := restore(t, s, a.ID)
	s.sh(t, r.ID, "echo b > /b")
	b, err := s.C.Snapshot(ctx, r.ID, api.CreateSnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	conflict := func(id, want string) {
		t.Helper()
		err := s.C.DeleteSnapshot(ctx, id)
		if err == nil || !strings.Contains(err.Error(), "conflict") || !strings.Contains(err.Error(), want) {
			t.Fatalf("delete %s in use: %v (want %q)", id, err, want)
		}
	}
	conflict(a.ID, b.ID+" chains on it")
	if err := s.C.DeleteSnapshot(ctx, b.ID); err != nil {
		t.Fatalf("delete unused snapshot: %v", err)
	}
	if _, err := s.C.GetSnapshot(ctx, b.ID); err == nil || !strings.Contains(err.Error(), "not_found") {
		t.Fatalf("deleted snapshot: %v", err)
	}
	if _, err := s.C.Layer(ctx, "snap/"+b.ID); err == nil {
		t.Fatal("the deleted snapshot's layer is still there")
	}
	conflict(a.ID, "sandbox "+r.ID+" was restored from it")
	// Through the layer API: the same rules.
	if _, err := s.C.DeleteLayer(ctx, "snap/"+a.ID); err == nil || !strings.Contains(err.Error(), "conflict") {
		t.Fatalf("delete of an in-use snapshot layer: %v", err)
	}
	if _, err := s.C.Delete(ctx, r.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.C.DeleteSnapshot(ctx, a.ID); err != nil {
		t.Fatalf("delete after its sandbox stopped: %v", err)
	}
	if err := s.C.DeleteSnapshot(ctx, a.ID); err == nil || !strings.Contains(err.Error(), "not_found") {
		t.Fatalf("second delete: %v", err)
	}
	// A trajectory's latest checkpoint stays; an older one may go.
	tr := s.create(t, api.CreateSandboxRequest{Trajectory: "gc", Checkpoint: "every-step"})
	s.C.Exec(ctx, tr.ID, api.ExecRequest{Cmd: "echo 1 > /x"})
	s.C.Exec(ctx, tr.ID, api.ExecRequest{Cmd: "echo 2 > /x"})
	steps, err := s.C.TrajectoryAll(ctx, "gc")
	if err != nil || len(steps) != 2 || steps[1].Checkpoint == "" {
		t.Fatalf("checkpoints: %+v %v", steps, err)
	}
	conflict(steps[1].Checkpoint, `latest checkpoint of trajectory "gc"`)
	if err := s.C.DeleteSnapshot(ctx, steps[0].Checkpoint); err != nil {
		t.Fatalf("delete an older checkpoint: %v", err)
	}
	if err := s.C.DeleteSnapshot(ctx, "bad id"); err == nil || !strings.Contains(err.Error(), "invalid") {
		t.Fatalf("malformed id: %v", err)
	}
}

func restore(t *testing.T, s *server, snapID string) *api.Sandbox {
	t.Helper()
	sb, err := s.C.Create(context.Background(), api.CreateSandboxRequest{Snapshot: snapID})
	if err != nil {
		t.Fatalf("restore %s: %v\n%s", snapID, err, tail(s.logs.String(), 30))
	}
	t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), sb.ID) })
	return sb
}
