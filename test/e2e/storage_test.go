package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// TestMemberOwnSnapshotsTrajectories: a member token lists, reads and
// deletes its own project's snapshots and trajectories (issue 19, problem
// 3: it got 400 on GET/DELETE /v1/snapshots/<its own id>).
func TestMemberOwnSnapshotsTrajectories(t *testing.T) {
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
}
