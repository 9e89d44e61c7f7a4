package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// TestMemberOwnSnapshotsTrajectories: a member token lists, reads and
// deletes its own project's snapshots and trajectories (issue 19, problem
// 3: it got 400 on GET/DELETE /v1/snapshots/<its own id>).
func TestMemberOwnSnapshotsTrajectories(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	for _, p := range []api.CreateProjectRequest{{Name: "m1"}, {Name: "m2"}} {
		if _, err := s.C.CreateProject(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	tok := func(project string) string {
		tk, err := s.C.CreateToken(ctx, api.CreateTokenRequest{Principal: "member-" + project, Project: project, Role: api.RoleMember})
		if err != nil {
			t.Fatal(err)
		}
		return tk.Secret
	}
	tok1, tok2 := tok("m1"), tok("m2")
	m1 := warren.New(s.URL, tok1)
	sb, err := m1.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64, Trajectory: "mine"})
	if err != nil {
		t.Fatalf("member create: %v", err)
	}
	t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), sb.ID) })
	if _, err := m1.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo hi > /x"}); err != nil {
		t.Fatal(err)
	}
	snap, err := m1.Snapshot(ctx, sb.ID, api.CreateSnapshotRequest{Name: "mine"})
	if err != nil {
		t.Fatalf("member snapshot: %v", err)
	}
	t.Cleanup(func() { _ = s.C.DeleteSnapshot(context.Background(), snap.ID) })

	// Read it, by the SDK and raw.
	if got, err := m1.GetSnapshot(ctx, snap.ID); err != nil || got.ID != snap.ID {
		t.Fatalf("member GET /v1/snapshots/%s: %+v %v", snap.ID, got, err)
	}
	// List: its own project's, and not a sibling's.
	code, body := s.rawRequest(t, http.MethodGet, "/v1/snapshots", tok1, nil, nil)
	if code != http.StatusOK || !strings.Contains(body, snap.ID) {
		t.Fatalf("member GET /v1/snapshots: %d %s", code, body)
	}
	var sl api.SnapshotList
	if err := json.Unmarshal([]byte(body), &sl); err != nil || len(sl.Snapshots) != 1 || sl.Snapshots[0].Project != "m1" {
		t.Fatalf("snapshot list: %s (%v)", body, err)
	}
	if code, body := s.rawRequest(t, http.MethodGet, "/v1/snapshots", tok2, nil, nil); code != http.StatusOK || strings.Contains(body, snap.ID) {
		t.Fatalf("sibling GET /v1/snapshots: %d %s", code, body)
	}
	if code, body := s.rawRequest(t, http.MethodGet, "/v1/trajectories", tok1, nil, nil); code != http.StatusOK || !strings.Contains(body, `"mine"`) {
		t.Fatalf("member GET /v1/trajectories: %d %s", code, body)
	}
	if code, body := s.rawRequest(t, http.MethodGet, "/v1/trajectories", tok2, nil, nil); code != http.StatusOK || strings.Contains(body, `"mine"`) {
		t.Fatalf("sibling GET /v1/trajectories: %d %s", code, body)
	}
	if p, err := m1.Trajectory(ctx, "mine", 0, 0); err != nil || len(p.Steps) == 0 {
		t.Fatalf("member reads its trajectory: %+v %v", p, err)
	}
	// A sibling's delete is a 404; the member's own is a 204.
	if code, body := s.rawRequest(t, http.MethodDelete, "/v1/snapshots/"+snap.ID, tok2, nil, nil); code != http.StatusNotFound {
		t.Fatalf("sibling DELETE: %d %s", code, body)
	}
	if err := m1.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatalf("member DELETE /v1/snapshots/%s: %v", snap.ID, err)
	}
	if _, err := m1.GetSnapshot(ctx, snap.ID); err == nil || !strings.Contains(err.Error(), api.CodeNotFound) {
		t.Fatalf("deleted snapshot still there: %v", err)
	}
	// The CLI: warren snapshot ls, warren traj ls / rm.
	if out := s.cliOK(t, "snapshot", "ls"); strings.Contains(out, snap.ID) {
		t.Fatalf("warren snapshot ls lists a deleted snapshot:\n%s", out)
	}
	if out := s.cliOK(t, "traj", "ls"); !strings.Contains(out, "mine") || !strings.Contains(out, "m1") {
		t.Fatalf("warren traj ls:\n%s", out)
	}
	if _, errs, code := s.cli(t, "traj", "rm", "--project", "m1", "mine"); code == 0 || !strings.Contains(errs, "records it") {
		t.Fatalf("warren traj rm while its sandbox runs: exit %d %s", code, errs)
	}
	if _, err := m1.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s.cliOK(t, "traj", "rm", "--project", "m1", "mine")
	if l, err := m1.ListTrajectories(ctx); err != nil || len(l) != 0 {
		t.Fatalf("after warren traj rm: %+v %v", l, err)
	}
}

// dirBytes is the size of the files under dir (what they take on disk).
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if info, ierr := d.Info(); ierr == nil && info.Mode().IsRegular() {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			} else {
				n += info.Size()
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTrajectoryStorageBounded (issue 19, problem 2): 40 uploads of 4 MiB
// and 20 execs printing 1 MiB under one trajectory grew JetStream by
// ~193 MB, which stayed after the sandbox was deleted, counted against no
// quota and could not be deleted. Now DELETE /v1/trajectories/{name}
// frees the log and the inputs (JetStream returns near where it started),
// the bytes count against the project's storage_bytes quota (a write
// beyond it is 413 storage_quota), and a trajectory_ttl deletes it by
// itself.
func TestTrajectoryStorageBounded(t *testing.T) {
	parallel(t)
	s := startServer(t, "--trajectory-sweep", "1s")
	ctx := context.Background()
	if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: "st"}); err != nil {
		t.Fatal(err)
	}
	tk, err := s.C.CreateToken(ctx, api.CreateTokenRequest{Principal: "member-st", Project: "st", Role: api.RoleMember})
	if err != nil {
		t.Fatal(err)
	}
	c := warren.New(s.URL, tk.Secret)
	js := filepath.Join(s.dataDir, "nats")
	before := dirBytes(t, js)

	sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.5, MemoryMB: 256, DiskMB: 512, Trajectory: "big"})
	if err != nil {
		t.Fatalf("create: %v\n%s", err, tail(s.logs.String(), 30))
	}
	t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), sb.ID) })
	rnd := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 4<<20)
	for i := 0; i < 40; i++ {
		for j := range buf {
			buf[j] = byte(rnd.Uint32())
		}
		if _, err := c.WriteFileBytes(ctx, sb.ID, fmt.Sprintf("/up%d", i%4), buf, 0o644); err != nil {
			t.Fatalf("upload %d: %v", i, err)
		}
	}
	for i := 0; i < 20; i++ {
		r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: fmt.Sprintf("head -c 786432 /dev/urandom | base64 -w0; echo %d", i)})
		if err != nil || r.ExitCode != 0 || len(r.Stdout) < 1<<20 {
			t.Fatalf("exec %d: %v %+v", i, err, r)
		}
	}
	grown := dirBytes(t, js) - before
	t.Logf("JetStream grew by %.1f MB for 160 MiB of uploads and 20 MiB of output", float64(grown)/1e6)
	if grown < 150e6 {
		t.Fatalf("JetStream grew by only %d bytes: the trajectory was not stored as the test assumes", grown)
	}
	list, err := c.ListTrajectories(ctx)
	if err != nil || len(list) != 1 || list[0].Bytes < 150e6 {
		t.Fatalf("trajectory list: %+v %v", list, err)
	}
	p, err := s.C.Project(ctx, "st")
	if err != nil || p.Usage == nil || p.Usage.StorageBytes < list[0].Bytes {
		t.Fatalf("project usage %+v (trajectory holds %d): %v", p.Usage, list[0].Bytes, err)
	}
	// A live sandbox still records it.
	if err := c.DeleteTrajectory(ctx, "", "big"); err == nil || !strings.Contains(err.Error(), api.CodeConflict) {
		t.Fatalf("delete while its sandbox lives: %v", err)
	}
	if _, err := c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if after := dirBytes(t, js) - before; after < grown/2 {
		t.Fatalf("JetStream shrank to +%d bytes before the trajectory was deleted", after)
	}
	if err := c.DeleteTrajectory(ctx, "", "big"); err != nil {
		t.Fatalf("DELETE /v1/trajectories/big: %v", err)
	}
	var left int64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		left = dirBytes(t, js) - before
		if left < 16e6 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("after DELETE, JetStream is %.1f MB above where it started", float64(left)/1e6)
	if left >= 16e6 {
		t.Fatalf("after DELETE JetStream still holds %d bytes more than at the start (grew by %d)", left, grown)
	}
	if _, err := c.Trajectory(ctx, "big", 0, 0); err == nil || !strings.Contains(err.Error(), api.CodeNotFound) {
		t.Fatalf("deleted trajectory still answers: %v", err)
	}
	if p, err := s.C.Project(ctx, "st"); err != nil || p.Usage.StorageBytes > 1<<20 {
		t.Fatalf("project usage after delete: %+v %v", p.Usage, err)
	}

	// The quota: 10 MiB; the third 4 MiB upload is refused, unlogged.
	if _, err := s.C.UpdateProject(ctx, "st", api.UpdateProjectRequest{Quota: api.Quota{StorageBytes: 10 << 20}}); err != nil {
		t.Fatal(err)
	}
	sb2, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.5, MemoryMB: 128, Trajectory: "capped"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), sb2.ID) })
	var refused error
	for i := 0; i < 4 && refused == nil; i++ {
		for j := range buf { // new data: the same bytes twice are stored once
			buf[j] = byte(rnd.Uint32())
		}
		_, refused = c.WriteFileBytes(ctx, sb2.ID, fmt.Sprintf("/q%d", i), buf, 0o644)
	}
	var ae *warren.APIError
	if !errors.As(refused, &ae) || ae.Status != http.StatusRequestEntityTooLarge || ae.Reason != api.ReasonStorageQuota || !strings.Contains(ae.Message, "storage quota") {
		t.Fatalf("an upload beyond the storage quota: %v", refused)
	}
	// A project at its quota (lowered below what it holds) takes no
	// snapshot either.
	if _, err := s.C.UpdateProject(ctx, "st", api.UpdateProjectRequest{Quota: api.Quota{StorageBytes: 1 << 20}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Snapshot(ctx, sb2.ID, api.CreateSnapshotRequest{}); err == nil || !strings.Contains(err.Error(), "storage quota") {
		t.Fatalf("a snapshot beyond the storage quota: %v", err)
	}
	if _, err := c.Delete(ctx, sb2.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteTrajectory(ctx, "", "capped"); err != nil {
		t.Fatal(err)
	}
	if p, err := s.C.Project(ctx, "st"); err != nil || p.Usage.StorageBytes > 1<<20 {
		t.Fatalf("project usage after the second delete: %+v %v", p.Usage, err)
	}

	// Layers count too: once, however often the same content is published.
	if _, err := s.C.UpdateProject(ctx, "st", api.UpdateProjectRequest{Quota: api.Quota{StorageBytes: 4 << 20}}); err != nil {
		t.Fatal(err)
	}
	usage := func() int64 {
		t.Helper()
		p, err := s.C.Project(ctx, "st")
		if err != nil {
			t.Fatal(err)
		}
		return p.Usage.StorageBytes
	}
	tarOf := func(n int) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		data := make([]byte, n)
		for j := range data {
			data[j] = byte(rnd.Uint32())
		}
		_ = tw.WriteHeader(&tar.Header{Name: "blob", Mode: 0o644, Size: int64(n), Typeflag: tar.TypeReg})
		_, _ = tw.Write(data)
		_ = tw.Close()
		return b.Bytes()
	}
	u0 := usage()
	small := tarOf(1 << 20)
	l, err := c.CreateLayerFromTar(ctx, "ws/counted", 0, bytes.NewReader(small))
	if err != nil {
		t.Fatalf("layer upload: %v", err)
	}
	if u := usage(); u-u0 < 1<<20 {
		t.Fatalf("a 1 MiB layer added %d bytes to the project's storage", u-u0)
	}
	u1 := usage()
	if _, err := c.CreateLayerFromTar(ctx, "ws/counted", 0, bytes.NewReader(small)); err != nil {
		t.Fatal(err)
	}
	if u := usage(); u != u1 {
		t.Fatalf("publishing the same content again charged %d bytes", u-u1)
	}
	big := tarOf(5 << 20)
	_, err = c.CreateLayerFromTar(ctx, "ws/too-big", 0, bytes.NewReader(big))
	if !errors.As(err, &ae) || ae.Status != http.StatusRequestEntityTooLarge || ae.Reason != api.ReasonStorageQuota {
		t.Fatalf("a layer beyond the storage quota: %v", err)
	}
	if _, err := c.DeleteLayer(ctx, l.Name); err != nil {
		t.Fatal(err)
	}
	if u := usage(); u != u0 {
		t.Fatalf("after the layer's delete the project holds %d, was %d", u, u0)
	}
	if _, err := s.C.UpdateProject(ctx, "st", api.UpdateProjectRequest{}); err != nil {
		t.Fatal(err)
	}

	// trajectory_ttl: gone by itself once its sandbox is gone.
	sb3, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.5, MemoryMB: 128, Trajectory: "short", TrajectoryTTL: 2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, sb3.ID, api.ExecRequest{Cmd: "echo hi"}); err != nil {
		t.Fatal(err)
	}
	if l, err := c.ListTrajectories(ctx); err != nil || len(l) != 1 || l[0].ExpiresAt.IsZero() {
		t.Fatalf("list with a ttl: %+v %v", l, err)
	}
	if _, err := c.Delete(ctx, sb3.ID); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		_, err := c.Trajectory(ctx, "short", 0, 0)
		if err != nil && strings.Contains(err.Error(), api.CodeNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the trajectory outlived its ttl: %v\n%s", err, tail(s.logs.String(), 20))
		}
	}
}
