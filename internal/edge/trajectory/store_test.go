package trajectory

import (
	"context"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// TestLegacyTrajectoryKey: a trajectory recorded before trajectories had
// owners (under its bare name) keeps its record and log for its sandbox.
func TestLegacyTrajectoryKey(t *testing.T) {
	srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: t.TempDir(), NoAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	conn, err := srv.Connect("edge-legacy-test", bus.RoleAPIServer, "")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	meta, err := conn.Records(ctx, bus.BucketTrajectories)
	if err != nil {
		t.Fatal(err)
	}
	r := NewRecorder(nil, meta, nil, nil)
	put := func(key string, rec edgeproto.TrajectoryRecord) {
		if err := meta.Put(ctx, key, &rec); err != nil {
			t.Fatal(err)
		}
	}
	put("old", edgeproto.TrajectoryRecord{Name: "old", Spec: api.CreateSandboxRequest{Project: "p1", Trajectory: "old"}})
	put("other", edgeproto.TrajectoryRecord{Name: "other", Spec: api.CreateSandboxRequest{Project: "p2", Trajectory: "other"}})
	put("p1|new", edgeproto.TrajectoryRecord{Name: "new", Project: "p1", Spec: api.CreateSandboxRequest{Project: "p1", Trajectory: "new"}})
	put("new", edgeproto.TrajectoryRecord{Name: "new", Spec: api.CreateSandboxRequest{Project: "p1", Trajectory: "new"}})
	for name, want := range map[string]string{"old": "old", "other": "p1|other", "new": "p1|new", "none": "p1|none"} {
		tr := New(&api.CreateSandboxRequest{Project: "p1", Trajectory: name})
		r.resolveKey(ctx, tr)
		if tr.key != want {
			t.Errorf("trajectory %q of p1: key %q, want %q", name, tr.key, want)
		}
	}
}
