package apiserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/watcher"
)

// ownerRig is an apiserver over an embedded NATS without nodes: enough
// for every ownership decision, which is made before anything reaches a
// node (a request that passes it ends in 503: no node).
type ownerRig struct {
	s    *Server
	iam  *iam.IAM
	root *iam.Principal
}

var (
	rigOnce sync.Once
	rig     *ownerRig
	rigErr  error
	rigN    atomic.Int64
	rigDir  string
	rigStop = func() {}
)

// TestMain stops the shared rig and removes its data after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	rigStop()
	if rigDir != "" {
		_ = os.RemoveAll(rigDir)
	}
	os.Exit(code)
}

func ownerServer(t testing.TB) *ownerRig {
	rigOnce.Do(func() {
		dir, err := os.MkdirTemp("", "warren-owner-test-")
		rigDir = dir
		if err != nil {
			rigErr = err
			return
		}
		srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: dir, NoAuth: true})
		if err != nil {
			rigErr = err
			return
		}
		conn, err := srv.Connect("owner-test", bus.RoleAPIServer, "")
		if err != nil {
			rigErr = err
			return
		}
		ctx := context.Background()
		m, err := iam.Open(ctx, conn)
		if err != nil {
			rigErr = err
			return
		}
		w, err := watcher.New(conn)
		if err != nil {
			rigErr = err
			return
		}
		s, err := New(ctx, Config{Bus: conn, IAM: m, Watcher: w})
		if err != nil {
			rigErr = err
			return
		}
		rig = &ownerRig{s: s, iam: m, root: &iam.Principal{Name: "root", Role: api.RoleAdmin}}
		rigStop = func() {
			w.Close()
			m.Close()
			conn.Close()
			srv.Shutdown()
		}
	})
	if rigErr != nil {
		t.Fatalf("rig: %v", rigErr)
	}
	return rig
}

// tree is a random project tree: parent pointers, so the model below
// never uses the string prefixes the rule is written with.
type tree struct {
	parent map[string]string // project -> parent ("" = root)
	ids    []string
}

// randomTree grows up to n projects under a fresh top project. Names are
// drawn from a few that prefix each other ("a", "ab", "a-b"), the cases a
// prefix test without the dot gets wrong.
func randomTree(r *rand.Rand, top string, n int) *tree {
	t := &tree{parent: map[string]string{top: ""}, ids: []string{top}}
	names := []string{"a", "ab", "a-b", "b", "ba", "c"}
	for i := 0; i < n; i++ {
		p := t.ids[r.IntN(len(t.ids))]
		id := p + "." + names[r.IntN(len(names))]
		if _, dup := t.parent[id]; dup || len(id) > 120 {
			continue
		}
		t.parent[id] = p
		t.ids = append(t.ids, id)
	}
	return t
}

// sees is the model of the rule: scope is owner or one of its ancestors,
// found by walking parent pointers; the root sees everything, and a layer
// is seen below its owner too (one without an owner is the shared catalog).
func (t *tree) sees(scope, owner, kind string) bool {
	if scope == "" || (kind == iam.KindLayer && owner == "") {
		return true
	}
	if kind == iam.KindLayer {
		// A layer is a catalog for the projects below its owner.
		for p := scope; p != ""; p = t.parent[p] {
			if p == owner {
				return true
			}
		}
	}
	for p := owner; p != ""; p = t.parent[p] {
		if p == scope {
			return true
		}
	}
	return false
}

// routeCase is one route asked about one object by one principal.
type routeCase struct {
	method, path string
	body         any
	kind         string // the rule's kind for the object
	change       bool   // a change: the shared catalog is root's
	ownNameOnly  bool   // no ?project=: the caller's own namespace
}

func (g *ownerRig) do(t testing.TB, tok, method, path string, body any) (int, string) {
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req := httptest.NewRequest(method, path, rd)
	req.Header.Set("Authorization", "Bearer "+tok)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	w := httptest.NewRecorder()
	g.s.ServeHTTP(w, req.WithContext(ctx))
	return w.Code, w.Body.String()
}

// checkOwnership builds a random tree, puts one object of each kind with
// a random owner in it, and asks every route about it with the token of a
// random project of the tree (or of a root admin): a route answers 404
// exactly when the model says the caller may not see the object.
func checkOwnership(t *testing.T, seed uint64) {
	g := ownerServer(t)
	ctx := context.Background()
	r := rand.New(rand.NewPCG(seed, seed>>32|1))
	top := fmt.Sprintf("t%d", rigN.Add(1))
	tr := randomTree(r, top, 1+r.IntN(8))
	for _, id := range tr.ids {
		name := id[strings.LastIndexByte(id, '.')+1:]
		if _, err := g.iam.CreateProject(ctx, g.root, &api.CreateProjectRequest{Name: name, Parent: tr.parent[id]}); err != nil {
			t.Fatalf("project %s: %v", id, err)
		}
	}
	pick := func() string { return tr.ids[r.IntN(len(tr.ids))] }
	caller := pick()
	if r.IntN(8) == 0 {
		caller = ""
	}
	tk, err := g.iam.CreateToken(ctx, g.root, &api.CreateTokenRequest{Principal: "fuzz", Project: caller, Role: api.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	own := pick() // the project of the caller's creates (in its scope)
	if caller != "" {
		own = caller
	}

	// The objects: a trajectory, a snapshot and a layer, each owned by a
	// random project (the layer may be the shared catalog's).
	trajOwner, snapOwner, layerOwner := pick(), pick(), pick()
	if r.IntN(4) == 0 {
		layerOwner = ""
	}
	traj := "run-42"
	rec := edgeproto.TrajectoryRecord{Name: traj, Project: trajOwner, Sandbox: "sb-nonode-" + top,
		Spec: api.CreateSandboxRequest{Image: "busybox", Project: trajOwner, Trajectory: traj}, CreatedAt: time.Now()}
	if err := g.s.trajMeta.Put(ctx, edgeproto.TrajKey(trajOwner, traj), &rec); err != nil {
		t.Fatal(err)
	}
	sid := fmt.Sprintf("snap-%016x", r.Uint64())[:21]
	if err := g.s.snaps.Put(ctx, sid, &api.Snapshot{ID: sid, Project: snapOwner, Image: "busybox"}); err != nil {
		t.Fatal(err)
	}
	layer := "ws/" + top
	if err := g.s.layerOwners.Put(ctx, layer, &layerOwnerRecord{Project: layerOwner}); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		routeCase
		owner string
	}{
		{routeCase{method: "GET", path: "/v1/trajectories/" + traj + "?project=" + trajOwner, kind: iam.KindTrajectory}, trajOwner},
		{routeCase{method: "GET", path: "/v1/trajectories/" + traj, kind: iam.KindTrajectory, ownNameOnly: true}, trajOwner},
		{routeCase{method: "POST", path: "/v1/trajectories:replay", body: api.ReplayRequest{Trajectory: traj, Project: trajOwner}, kind: iam.KindTrajectory}, trajOwner},
		{routeCase{method: "POST", path: "/v1/sandboxes", body: api.CreateSandboxRequest{Trajectory: traj, Resume: true, Project: trajOwner}, kind: iam.KindTrajectory}, trajOwner},
		{routeCase{method: "GET", path: "/v1/snapshots/" + sid, kind: iam.KindSnapshot}, snapOwner},
		{routeCase{method: "DELETE", path: "/v1/snapshots/" + sid, kind: iam.KindSnapshot, change: true}, snapOwner},
		{routeCase{method: "GET", path: "/v1/layers/snap/" + sid, kind: iam.KindSnapshot}, snapOwner},
		{routeCase{method: "POST", path: "/v1/sandboxes", body: api.CreateSandboxRequest{Snapshot: sid, Project: own}, kind: iam.KindSnapshot}, snapOwner},
		{routeCase{method: "POST", path: "/v1/sandboxes", body: api.CreateSandboxRequest{Image: "busybox", Project: own, Layers: []api.LayerAttachment{{Layer: "snap/" + sid}}}, kind: iam.KindSnapshot}, snapOwner},
		{routeCase{method: "POST", path: "/v1/sandboxes:batch", body: api.BatchCreateRequest{Count: 1, Spec: api.CreateSandboxRequest{Snapshot: sid, Project: own}}, kind: iam.KindSnapshot}, snapOwner},
		{routeCase{method: "GET", path: "/v1/layers/" + layer, kind: iam.KindLayer}, layerOwner},
		{routeCase{method: "DELETE", path: "/v1/layers/" + layer, kind: iam.KindLayer, change: true}, layerOwner},
		{routeCase{method: "POST", path: "/v1/sandboxes", body: api.CreateSandboxRequest{Image: "busybox", Project: own, Layers: []api.LayerAttachment{{Layer: layer + "@1", Mount: "/opt/x"}}}, kind: iam.KindLayer}, layerOwner},
	}
	// A few of them, in a random order, each seed.
	r.Shuffle(len(cases), func(i, j int) { cases[i], cases[j] = cases[j], cases[i] })
	for _, c := range cases[:4+r.IntN(len(cases)-3)] {
		want := tr.sees(caller, c.owner, c.kind)
		if c.ownNameOnly {
			want = caller == c.owner || (caller == "" && c.owner == "")
		}
		code, body := g.do(t, tk.Secret, c.method, c.path, c.body)
		where := fmt.Sprintf("seed %d: %s %s as %q, owner %q (tree %v)", seed, c.method, c.path, caller, c.owner, tr.ids)
		switch {
		case !want && code != http.StatusNotFound:
			t.Fatalf("%s: %d %s, want 404", where, code, body)
		case want && c.change && c.kind == iam.KindLayer && !tr.sees(caller, c.owner, iam.KindSandbox):
			if code != http.StatusForbidden {
				t.Fatalf("%s: %d %s, want 403 (an ancestor's layer, or the shared catalog, is read-only below)", where, code, body)
			}
		case want && (code == http.StatusNotFound || code == http.StatusForbidden):
			t.Fatalf("%s: %d %s, want it past the ownership check", where, code, body)
		}
	}
}

// FuzzOwnership checks the ownership rule over random (project tree,
// object, route) triples against a model of it. The seeds run in every
// plain `go test`; `go test -fuzz FuzzOwnership` searches further.
func FuzzOwnership(f *testing.F) {
	for i := uint64(1); i <= 24; i++ {
		f.Add(i * 0x9e3779b97f4a7c15)
	}
	f.Fuzz(checkOwnership)
}

// TestSeesModel: the rule against its model over many random trees, with
// no server (fast, and exhaustive over each tree's pairs).
func TestSeesModel(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	for i := 0; i < 300; i++ {
		tr := randomTree(r, []string{"a", "ab", "p1"}[i%3], 1+r.IntN(10))
		scopes := append([]string{""}, tr.ids...)
		owners := append([]string{"", "zz", "a-b"}, tr.ids...)
		for _, scope := range scopes {
			p := &iam.Principal{Project: scope, Role: api.RoleMember}
			for _, owner := range owners {
				for _, kind := range []string{iam.KindSandbox, iam.KindTrajectory, iam.KindSnapshot, iam.KindLayer, iam.KindPool, iam.KindEvent} {
					if got, want := p.Sees(kind, owner), tr.sees(scope, owner, kind); got != want {
						t.Fatalf("Sees(%q as %q, %s of %q) = %v, model %v (tree %v)", kind, scope, kind, owner, got, want, tr.ids)
					}
				}
			}
		}
	}
}

// TestLegacyTrajectoryOwner: a trajectory recorded before trajectories had
// owners (under its bare name, its project only in its spec) stays
// readable by its project, and by no sibling.
func TestLegacyTrajectoryOwner(t *testing.T) {
	g := ownerServer(t)
	ctx := context.Background()
	top := fmt.Sprintf("t%d", rigN.Add(1))
	for _, p := range []api.CreateProjectRequest{{Name: top}, {Name: "x", Parent: top}, {Name: "y", Parent: top}} {
		if _, err := g.iam.CreateProject(ctx, g.root, &p); err != nil {
			t.Fatal(err)
		}
	}
	name := "legacy-" + top
	rec := edgeproto.TrajectoryRecord{Name: name, Sandbox: "sb-nonode-" + top, Spec: api.CreateSandboxRequest{Image: "busybox", Project: top + ".x", Trajectory: name}}
	if err := g.s.trajMeta.Put(ctx, name, &rec); err != nil {
		t.Fatal(err)
	}
	for project, want := range map[string]int{top + ".x": 200, top + ".y": 404, top: 404} {
		tk, err := g.iam.CreateToken(ctx, g.root, &api.CreateTokenRequest{Principal: "l", Project: project, Role: api.RoleViewer})
		if err != nil {
			t.Fatal(err)
		}
		if code, body := g.do(t, tk.Secret, "GET", "/v1/trajectories/"+name, nil); code != want {
			t.Errorf("%s reads the legacy trajectory of %s.x: %d %s, want %d", project, top, code, body, want)
		}
	}
	// The parent reads it naming the project; the root token by its bare name.
	tk, err := g.iam.CreateToken(ctx, g.root, &api.CreateTokenRequest{Principal: "l", Project: top, Role: api.RoleViewer})
	if err != nil {
		t.Fatal(err)
	}
	if code, body := g.do(t, tk.Secret, "GET", "/v1/trajectories/"+name+"?project="+top+".x", nil); code != 200 {
		t.Errorf("parent with ?project=: %d %s", code, body)
	}
	rtk, err := g.iam.CreateToken(ctx, g.root, &api.CreateTokenRequest{Principal: "r", Role: api.RoleViewer})
	if err != nil {
		t.Fatal(err)
	}
	if code, body := g.do(t, rtk.Secret, "GET", "/v1/trajectories/"+name, nil); code != 200 {
		t.Errorf("root by the bare name: %d %s", code, body)
	}
}
