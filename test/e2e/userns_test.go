package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

// TestUsernsOwnersAndNodeView: the node says its sandboxes run in user
// namespaces; a sandbox's root is an unprivileged host user; files that it
// gives to other users keep those owners (as the sandbox saw them) in a
// snapshot restored into another sandbox and in a layer packed from it.
func TestUsernsOwnersAndNodeView(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	nodes, err := s.C.Nodes(ctx)
	if err != nil || len(nodes) != 1 {
		t.Fatalf("nodes: %+v %v", nodes, err)
	}
	if f := nodes[0].Features; f.SandboxRoot != "userns" || f.SandboxRootDetail == "" {
		t.Fatalf("node features: %+v, want sandbox_root userns", f)
	}
	src := s.create(t, api.CreateSandboxRequest{})
	if r := s.sh(t, src.ID, "cat /proc/self/uid_map"); strings.Fields(r.Stdout)[0] != "0" || strings.Fields(r.Stdout)[1] == "0" {
		t.Fatalf("uid_map %q: root is host root", r.Stdout)
	}
	const setup = "mkdir -p /data/u && echo x > /data/u/f && chown -R 1000:1001 /data/u && echo r > /data/r && " +
		"ln -s f /data/u/l && chown -h 1002:1003 /data/u/l"
	if r := s.sh(t, src.ID, setup); r.ExitCode != 0 {
		t.Fatalf("setup: %+v", r)
	}
	const check = "stat -c '%n %u:%g' /data /data/r /data/u /data/u/f /data/u/l"
	want := s.sh(t, src.ID, check).Stdout
	if !strings.Contains(want, "/data/u/f 1000:1001") || !strings.Contains(want, "/data/u/l 1002:1003") {
		t.Fatalf("owners in the source: %q", want)
	}
	snap, err := s.C.Snapshot(ctx, src.ID, api.CreateSnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	r1 := restore(t, s, snap.ID)
	if got := s.sh(t, r1.ID, check).Stdout; got != want {
		t.Errorf("restored owners:\n%s\nwant:\n%s", got, want)
	}
	if _, err := s.C.CreateLayerFromSandbox(ctx, src.ID, "ws/owners", 0); err != nil {
		t.Fatal(err)
	}
	l := s.create(t, api.CreateSandboxRequest{Layers: []api.LayerAttachment{{Layer: "ws/owners"}}})
	if got := s.sh(t, l.ID, check).Stdout; got != want {
		t.Errorf("owners from the layer:\n%s\nwant:\n%s", got, want)
	}
}
