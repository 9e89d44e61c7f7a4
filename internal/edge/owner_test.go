package edge

import (
	"context"
	"log/slog"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// TestSnapshotScope: a scoped create reaches only snapshots (and snap/
// layers) of its scope, whatever the apiserver let through.
func TestSnapshotScope(t *testing.T) {
	srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: t.TempDir(), NoAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	conn, err := srv.Connect("edge-owner-test", bus.RoleAPIServer, "")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	snaps, err := conn.Records(ctx, bus.BucketSnapshots)
	if err != nil {
		t.Fatal(err)
	}
	e := &Edge{cfg: Config{Node: "n1"}, log: slog.New(slog.DiscardHandler), snaps: snaps}
	e.snapshots = e.newSnapshotter()
	if err := snaps.Put(ctx, "snap-p1", &api.Snapshot{ID: "snap-p1", Project: "p1"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		spec  api.CreateSandboxRequest
		scope string
		ok    bool
	}{
		{api.CreateSandboxRequest{Snapshot: "snap-p1"}, "p1", true},
		{api.CreateSandboxRequest{Snapshot: "snap-p1"}, "p1.c", false},
		{api.CreateSandboxRequest{Snapshot: "snap-p1"}, "p2", false},
		{api.CreateSandboxRequest{Snapshot: "snap-p1"}, "p", false},
		{api.CreateSandboxRequest{Image: "x", Layers: []api.LayerAttachment{{Layer: "snap/snap-p1@1"}}}, "p2", false},
		{api.CreateSandboxRequest{Image: "x", Layers: []api.LayerAttachment{{Layer: "snap/snap-p1", Mount: "/m"}}}, "p1", true},
		{api.CreateSandboxRequest{Snapshot: "snap-none"}, "p2", true}, // the create answers 404 itself
	} {
		err := e.checkSnapshotScope(ctx, &c.spec, c.scope)
		if c.ok != (err == nil) {
			t.Errorf("%+v in scope %q: %v", c.spec, c.scope, err)
		}
		if err != nil {
			if ae, ok := err.(*api.Error); !ok || ae.Code != api.CodeNotFound {
				t.Errorf("%+v in scope %q: %v, want not_found", c.spec, c.scope, err)
			}
		}
	}
}

// TestTrajKey: trajectory names are per project and keys never collide.
func TestTrajKey(t *testing.T) {
	seen := map[string][2]string{}
	for _, p := range []string{"", "a", "a.b", "ab"} {
		for _, n := range []string{"run-42", "a.run-42", "a.b:x", "x:y", "b/x", "a/run-42"} {
			k := TrajKey(p, n)
			if o, dup := seen[k]; dup {
				t.Fatalf("TrajKey(%q,%q) = TrajKey(%q,%q) = %q", p, n, o[0], o[1], k)
			}
			seen[k] = [2]string{p, n}
		}
	}
	if sandboxspec.ValidTrajectory("a|run-42") {
		t.Fatal(`a trajectory name may hold "|", so keys could collide`)
	}
	if TrajKey("", "run-42") != "run-42" {
		t.Fatal("the root project's keys must stay the bare names")
	}
}

// TestLayerScope: a scoped create names a project's layer (by its
// qualified name) only when its scope sees it: its own project's, an
// ancestor's or a descendant's; never a sibling's.
func TestLayerScope(t *testing.T) {
	for _, c := range []struct {
		scope, layer string
		ok           bool
	}{
		{"p1", "~p1/ws/calc@1", true},
		{"p1.c", "~p1/ws/calc", true}, // the parent's: a catalog below it
		{"p1", "~p1.c/ws/calc", true}, // the child's: the parent sees it
		{"p2", "~p1/ws/calc@1", false},
		{"p1x", "~p1/ws/calc", false},
		{"p1", "~p1x/ws/calc", false},
		{"p2", "ws/calc", true}, // the shared catalog
		{"p2", "snap/snap-0123456789abcdef", true},
	} {
		spec := &api.CreateSandboxRequest{Image: "busybox", Project: c.scope, Layers: []api.LayerAttachment{{Layer: "toolkit/x"}, {Layer: c.layer}}}
		err := checkLayerScope(spec, c.scope)
		if c.ok != (err == nil) {
			t.Errorf("scope %s, layer %s: %v, want ok=%v", c.scope, c.layer, err, c.ok)
		}
		if err != nil && (err.(*api.Error).Code != api.CodeNotFound || err.Error() != (&api.Error{Code: api.CodeNotFound, Message: `layer "` + c.layer + `" not found`}).Error()) {
			t.Errorf("scope %s, layer %s: %v, want the answer for a name nobody has", c.scope, c.layer, err)
		}
	}
}
