package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// owned is what project p1 owns in TestOwnership, attacked with the token
// of its sibling p2 (and of its child p1.c, which sees nothing above it).
type owned struct {
	s                 *server
	p1, p2, child     *warren.Client
	tok1, tok2, tokC  string
	tok1ID            string
	sb, cmd           string // a p1 sandbox and a background command in it
	traj              string // its trajectory
	snap              string // a snapshot of it
	layer             string // a layer packed from it
	pool              string // a p1 warm pool
	secret            string // what sb's files hold
	trajSB            string // the sandbox of traj
	ids               map[string]string
	createdSandboxIDs []string
}

func (o *owned) mk(t *testing.T, c *warren.Client, req api.CreateSandboxRequest) *api.Sandbox {
	t.Helper()
	if req.Image == "" && req.Snapshot == "" {
		req.Image = "busybox"
	}
	sb, err := c.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("create: %v\nserver log:\n%s", err, tail(o.s.logs.String(), 40))
	}
	t.Cleanup(func() { _, _ = o.s.C.Delete(context.Background(), sb.ID) })
	return sb
}

func newOwned(t *testing.T) *owned {
	s := startServer(t)
	ctx := context.Background()
	admin := s.C
	o := &owned{s: s, secret: "p1-secret-" + fmt.Sprint(os.Getpid())}
	for _, p := range []api.CreateProjectRequest{{Name: "p1"}, {Name: "p2"}, {Name: "c", Parent: "p1"}} {
		if _, err := admin.CreateProject(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	tok := func(project string) (string, string) {
		tk, err := admin.CreateToken(ctx, api.CreateTokenRequest{Principal: "u-" + project, Project: project, Role: api.RoleAdmin})
		if err != nil {
			t.Fatal(err)
		}
		return tk.Secret, tk.ID
	}
	o.tok1, o.tok1ID = tok("p1")
	o.tok2, _ = tok("p2")
	o.tokC, _ = tok("p1.c")
	o.p1, o.p2, o.child = warren.New(s.URL, o.tok1), warren.New(s.URL, o.tok2), warren.New(s.URL, o.tokC)

	sb := o.mk(t, o.p1, api.CreateSandboxRequest{CPU: 0.1, MemoryMB: 64, Labels: map[string]string{"own": "p1", "job": "p1-job"}})
	o.sb = sb.ID
	if _, err := o.p1.WriteFileBytes(ctx, o.sb, "/secret", []byte(o.secret), 0o644); err != nil {
		t.Fatal(err)
	}
	r, err := o.p1.Exec(ctx, o.sb, api.ExecRequest{Cmd: "sleep 600", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	o.cmd = r.CommandID
	// A server on port 8000 that would hand out the secret to whoever
	// reaches it: the port routes must not let p2 do so.
	if _, err := o.p1.Exec(ctx, o.sb, api.ExecRequest{Cmd: "busybox httpd -f -p 8000 -h /", Background: true}); err != nil {
		t.Fatal(err)
	}
	o.traj = "run-42"
	tsb := o.mk(t, o.p1, api.CreateSandboxRequest{CPU: 0.1, MemoryMB: 64, Trajectory: o.traj})
	o.trajSB = tsb.ID
	if _, err := o.p1.WriteFileBytes(ctx, tsb.ID, "/work-secret", []byte(o.secret), 0o644); err != nil {
		t.Fatal(err)
	}
	if r, err := o.p1.Exec(ctx, tsb.ID, api.ExecRequest{Cmd: "echo " + o.secret}); err != nil || r.ExitCode != 0 {
		t.Fatalf("exec in the trajectory sandbox: %v", err)
	}
	snap, err := o.p1.Snapshot(ctx, o.sb, api.CreateSnapshotRequest{Name: "p1-snap"})
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	o.snap = snap.ID
	t.Cleanup(func() { _ = admin.DeleteSnapshot(context.Background(), o.snap) })
	l, err := o.p1.CreateLayerFromSandbox(ctx, o.sb, "ws/p1-private", 0)
	if err != nil {
		t.Fatalf("layer from sandbox: %v", err)
	}
	o.layer = l.Name
	pool, err := o.p1.CreatePool(ctx, api.PoolRequest{Name: "p1-pool", Image: "busybox", CPU: 0.1, MemoryMB: 32, Size: 1})
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	o.pool = pool.Name
	if _, err := o.p1.CreateTemplate(ctx, api.Template{Name: "p1-tmpl", Spec: api.CreateSandboxRequest{Image: "busybox", Labels: map[string]string{"t": "p1-tmpl-label"}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = admin.DeletePool(context.Background(), o.pool) })
	return o
}

// leaks reports whether an answer body carries p1's secret or ids.
func (o *owned) leaks(body string) bool {
	return strings.Contains(body, o.secret) || strings.Contains(body, o.sb) || strings.Contains(body, o.trajSB) ||
		strings.Contains(body, o.snap) || strings.Contains(body, o.layer) || strings.Contains(body, o.pool)
}

// TestOwnership: every object records its project, and a token of a
// sibling project (or of a child project) reaches none of them.
func TestOwnership(t *testing.T) {
	o := newOwned(t)
	ctx := context.Background()

	t.Run("trajectory", func(t *testing.T) {
		for name, c := range map[string]*warren.Client{"sibling": o.p2, "child": o.child} {
			_, err := c.Trajectory(ctx, o.traj, 0, 0)
			mustCode(t, name+" reads p1's trajectory", err, api.CodeNotFound)
			_, err = c.TrajectoryFiles(ctx, o.traj, "/work-secret")
			mustCode(t, name+" reads p1's trajectory by path", err, api.CodeNotFound)
			_, err = c.ReplayTrajectory(ctx, o.traj, false)
			mustCode(t, name+" replays p1's trajectory", err, api.CodeNotFound)
			_, err = c.ResumeTrajectory(ctx, o.traj, false)
			mustCode(t, name+" resumes p1's trajectory", err, api.CodeNotFound)
		}
		// The owner and its parent's root admin still read it.
		if p, err := o.p1.Trajectory(ctx, o.traj, 0, 0); err != nil || len(p.Steps) < 2 {
			t.Fatalf("owner reads its trajectory: %v", err)
		}
		// Names are per project: p2 makes its own run-42, which holds
		// nothing of p1's.
		sb := o.mk(t, o.p2, api.CreateSandboxRequest{CPU: 0.1, MemoryMB: 64, Trajectory: o.traj})
		if _, err := o.p2.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo p2"}); err != nil {
			t.Fatal(err)
		}
		p, err := o.p2.Trajectory(ctx, o.traj, 0, 0)
		if err != nil || len(p.Steps) != 1 || p.Sandbox != sb.ID {
			t.Fatalf("p2's own run-42: %+v %v", p, err)
		}
		if mine, err := o.p1.Trajectory(ctx, o.traj, 0, 0); err != nil || mine.Sandbox != o.trajSB {
			t.Fatalf("p1's run-42 after p2 made its own: %+v %v", mine, err)
		}
	})

	t.Run("snapshot", func(t *testing.T) {
		for name, c := range map[string]*warren.Client{"sibling": o.p2, "child": o.child} {
			_, err := c.GetSnapshot(ctx, o.snap)
			mustCode(t, name+" reads p1's snapshot", err, api.CodeNotFound)
			_, err = c.Create(ctx, api.CreateSandboxRequest{Snapshot: o.snap, CPU: 0.1, MemoryMB: 64})
			mustCode(t, name+" restores p1's snapshot", err, api.CodeNotFound)
			_, err = c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64,
				Layers: []api.LayerAttachment{{Layer: "snap/" + o.snap}}})
			mustCode(t, name+" mounts p1's snapshot layer", err, api.CodeNotFound)
			_, err = c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64,
				Layers: []api.LayerAttachment{{Layer: "snap/" + o.snap, Mount: "/x"}}})
			mustCode(t, name+" binds p1's snapshot layer", err, api.CodeNotFound)
			err = c.DeleteSnapshot(ctx, o.snap)
			mustCode(t, name+" deletes p1's snapshot", err, api.CodeNotFound)
		}
		snap, err := o.p1.GetSnapshot(ctx, o.snap)
		if err != nil || snap.Project != "p1" {
			t.Fatalf("owner reads its snapshot: %+v %v", snap, err)
		}
		// The owner restores it.
		sb := o.mk(t, o.p1, api.CreateSandboxRequest{Snapshot: o.snap, CPU: 0.1, MemoryMB: 64})
		if b, err := o.p1.ReadFileBytes(ctx, sb.ID, "/secret"); err != nil || string(b) != o.secret {
			t.Fatalf("restored: %q %v", b, err)
		}
	})

	t.Run("layer", func(t *testing.T) {
		for name, c := range map[string]*warren.Client{"sibling": o.p2} {
			_, err := c.Layer(ctx, o.layer)
			mustCode(t, name+" reads p1's layer", err, api.CodeNotFound)
			_, err = c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64,
				Layers: []api.LayerAttachment{{Layer: o.layer}}})
			mustCode(t, name+" mounts p1's layer", err, api.CodeNotFound)
			_, err = c.DeleteLayer(ctx, o.layer)
			mustCode(t, name+" deletes p1's layer", err, api.CodeNotFound)
			ls, err := c.Layers(ctx, "")
			if err != nil {
				t.Fatalf("%s lists layers: %v", name, err)
			}
			for _, l := range ls {
				if l.Name == o.layer || strings.HasPrefix(l.Name, "snap/") {
					t.Fatalf("%s lists p1's layer %s", name, l.Name)
				}
			}
		}
		// The child project reads and mounts its parent's layers (they
		// resolve after its own), and changes none of them.
		if l, err := o.child.Layer(ctx, o.layer); err != nil || l.Project != "p1" {
			t.Fatalf("p1.c reads p1's layer: %+v %v", l, err)
		}
		_, err := o.child.DeleteLayer(ctx, o.layer)
		mustCode(t, "p1.c deletes p1's layer", err, api.CodeForbidden)
		if ls, err := o.child.Layers(ctx, ""); err != nil {
			t.Fatalf("p1.c lists layers: %v", err)
		} else {
			for _, l := range ls {
				if strings.HasPrefix(l.Name, "snap/") {
					t.Fatalf("p1.c lists p1's snapshot layer %s", l.Name)
				}
			}
		}
		if l, err := o.p1.Layer(ctx, o.layer); err != nil || l.Project != "p1" {
			t.Fatalf("owner reads its layer: %+v %v", l, err)
		}
		// A root token's layer is the shared catalog: every project reads
		// and mounts it, none changes it.
		var tb bytes.Buffer
		tw := tar.NewWriter(&tb)
		_ = tw.WriteHeader(&tar.Header{Name: "shared.txt", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg})
		_, _ = tw.Write([]byte("ok"))
		_ = tw.Close()
		if _, err := o.s.C.CreateLayerFromTar(ctx, "toolkit/shared", 0, bytes.NewReader(tb.Bytes())); err != nil {
			t.Fatalf("root makes a catalog layer: %v", err)
		}
		if l, err := o.p2.Layer(ctx, "toolkit/shared"); err != nil || l.Project != "" {
			t.Fatalf("p2 reads the catalog layer: %+v %v", l, err)
		}
		sb := o.mk(t, o.p2, api.CreateSandboxRequest{CPU: 0.1, MemoryMB: 64, Layers: []api.LayerAttachment{{Layer: "toolkit/shared", Mount: "/opt/shared"}}})
		if b, err := o.p2.ReadFileBytes(ctx, sb.ID, "/opt/shared/shared.txt"); err != nil || string(b) != "ok" {
			t.Fatalf("p2 mounts the catalog layer: %q %v", b, err)
		}
		_, err = o.p2.DeleteLayer(ctx, "toolkit/shared")
		mustCode(t, "p2 deletes the catalog layer", err, api.CodeForbidden)
	})

	t.Run("layer-names-per-project", func(t *testing.T) {
		tarOf := func(content string) *bytes.Reader {
			var tb bytes.Buffer
			tw := tar.NewWriter(&tb)
			_ = tw.WriteHeader(&tar.Header{Name: "calc.txt", Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg})
			_, _ = tw.Write([]byte(content))
			_ = tw.Close()
			return bytes.NewReader(tb.Bytes())
		}
		sees := func(who string, c *warren.Client, want string) *api.Sandbox {
			t.Helper()
			sb := o.mk(t, c, api.CreateSandboxRequest{CPU: 0.1, MemoryMB: 64, Layers: []api.LayerAttachment{{Layer: "ws/calc", Mount: "/opt/calc"}}})
			if b, err := c.ReadFileBytes(ctx, sb.ID, "/opt/calc/calc.txt"); err != nil || string(b) != want {
				t.Fatalf("%s's sandbox mounts ws/calc: %q %v, want %q", who, b, err, want)
			}
			return sb
		}
		if _, err := o.p1.CreateLayerFromTar(ctx, "ws/calc", 0, tarOf("p1-calc")); err != nil {
			t.Fatalf("p1 publishes ws/calc: %v", err)
		}
		// Before p2 publishes it, p2 cannot tell p1's name from no name.
		_, errTaken := o.p2.Layer(ctx, "ws/calc")
		_, errNone := o.p2.Layer(ctx, "ws/calc-none")
		if warren.CodeOf(errTaken) != api.CodeNotFound || warren.CodeOf(errNone) != api.CodeNotFound ||
			strings.ReplaceAll(errTaken.Error(), "ws/calc", "X") != strings.ReplaceAll(errNone.Error(), "ws/calc-none", "X") {
			t.Fatalf("p2 reads p1's ws/calc: %v; a name nobody has: %v", errTaken, errNone)
		}
		_, errTaken = o.p2.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64, Layers: []api.LayerAttachment{{Layer: "ws/calc"}}})
		mustCode(t, "p2 mounts p1's ws/calc", errTaken, api.CodeNotFound)
		if ls, err := o.p2.Layers(ctx, "ws/calc"); err != nil || len(ls) != 0 {
			t.Fatalf("p2 lists ws/calc: %+v %v", ls, err)
		}
		l2, err := o.p2.CreateLayerFromTar(ctx, "ws/calc", 0, tarOf("p2-calc"))
		if err != nil || l2.Name != "ws/calc" || l2.Project != "p2" || l2.Version != 1 {
			t.Fatalf("p2 publishes its own ws/calc: %+v %v", l2, err)
		}
		sees("p1", o.p1, "p1-calc")
		sb2 := sees("p2", o.p2, "p2-calc")
		// A snapshot pins p2's layer: its restore and fork mount it again.
		snap2, err := o.p2.Snapshot(ctx, sb2.ID, api.CreateSnapshotRequest{})
		if err != nil {
			t.Fatalf("p2 snapshots its sandbox: %v", err)
		}
		t.Cleanup(func() { _ = o.s.C.DeleteSnapshot(context.Background(), snap2.ID) })
		restored := o.mk(t, o.p2, api.CreateSandboxRequest{Snapshot: snap2.ID, CPU: 0.1, MemoryMB: 64})
		if b, err := o.p2.ReadFileBytes(ctx, restored.ID, "/opt/calc/calc.txt"); err != nil || string(b) != "p2-calc" {
			t.Fatalf("p2's restore mounts ws/calc: %q %v", b, err)
		}
		// Root restores it too (into the root project): the pinned layer
		// is p2's, which root sees.
		rootSB := o.mk(t, o.s.C, api.CreateSandboxRequest{Snapshot: snap2.ID, CPU: 0.1, MemoryMB: 64})
		if b, err := o.s.C.ReadFileBytes(ctx, rootSB.ID, "/opt/calc/calc.txt"); err != nil || string(b) != "p2-calc" {
			t.Fatalf("root's restore of p2's snapshot mounts ws/calc: %q %v", b, err)
		}
		// A trajectory keeps the resolved layer: its replay reads p2's.
		tsb := o.mk(t, o.p2, api.CreateSandboxRequest{CPU: 0.1, MemoryMB: 64, Trajectory: "calc-run",
			Layers: []api.LayerAttachment{{Layer: "ws/calc", Mount: "/opt/calc"}}})
		if r, err := o.p2.Exec(ctx, tsb.ID, api.ExecRequest{Cmd: "cat /opt/calc/calc.txt"}); err != nil || r.Stdout != "p2-calc" {
			t.Fatalf("p2's trajectory sandbox reads ws/calc: %+v %v", r, err)
		}
		if rep, err := o.p2.ReplayTrajectory(ctx, "calc-run", false); err != nil || !rep.Deterministic || rep.Steps < 1 {
			t.Fatalf("p2 replays its trajectory over its ws/calc: %+v %v", rep, err)
		}
		for who, c := range map[string]*warren.Client{"p1": o.p1, "p2": o.p2} {
			l, err := c.Layer(ctx, "ws/calc")
			if err != nil || l.Name != "ws/calc" || l.Project != who {
				t.Fatalf("%s reads ws/calc: %+v %v", who, l, err)
			}
			ls, err := c.Layers(ctx, "ws/calc")
			if err != nil || len(ls) != 1 || ls[0].Project != who {
				t.Fatalf("%s lists ws/calc: %+v %v", who, ls, err)
			}
		}
		// A child project resolves its parent's name until it has its own.
		if l, err := o.child.Layer(ctx, "ws/calc"); err != nil || l.Project != "p1" {
			t.Fatalf("p1.c reads its parent's ws/calc: %+v %v", l, err)
		}
		sees("p1.c", o.child, "p1-calc")
		_, err = o.child.DeleteLayer(ctx, "ws/calc")
		mustCode(t, "p1.c deletes its parent's ws/calc", err, api.CodeForbidden)
		if l, err := o.child.CreateLayerFromTar(ctx, "ws/calc", 0, tarOf("c-calc")); err != nil || l.Project != "p1.c" {
			t.Fatalf("p1.c publishes its own ws/calc: %+v %v", l, err)
		}
		sees("p1.c", o.child, "c-calc")
		sees("p1", o.p1, "p1-calc")
		// The parent names its child's layer with ?project=.
		if code, body := o.s.rawRequest(t, "GET", "/v1/layers/ws/calc?project=p1.c", o.tok1, nil, nil); code != 200 || !strings.Contains(body, `"project":"p1.c"`) {
			t.Fatalf("p1 reads p1.c's ws/calc: %d %s", code, body)
		}
		if code, body := o.s.rawRequest(t, "GET", "/v1/layers/ws/calc?project=p1", o.tok2, nil, nil); code != 403 && code != 404 {
			t.Fatalf("p2 reads ws/calc naming p1: %d %s", code, body)
		}
		if _, err := o.p2.DeleteLayer(ctx, "ws/calc"); err != nil {
			t.Fatalf("p2 deletes its ws/calc: %v", err)
		}
		sees("p1", o.p1, "p1-calc")
		_, err = o.p2.Layer(ctx, "ws/calc")
		mustCode(t, "p2 reads ws/calc after deleting its own", err, api.CodeNotFound)
	})

	t.Run("pool-names-per-project", func(t *testing.T) {
		p, err := o.p2.CreatePool(ctx, api.PoolRequest{Name: o.pool, Image: "busybox", CPU: 0.1, MemoryMB: 48, Size: 0})
		if err != nil || p.Project != "p2" || p.MemoryMB != 48 {
			t.Fatalf("p2 makes its own pool named like p1's: %+v %v", p, err)
		}
		if p, err := o.p1.Pool(ctx, o.pool); err != nil || p.Project != "p1" || p.MemoryMB != 32 {
			t.Fatalf("p1 reads its pool: %+v %v", p, err)
		}
		if p, err := o.p2.Pool(ctx, o.pool); err != nil || p.Project != "p2" {
			t.Fatalf("p2 reads its pool: %+v %v", p, err)
		}
		ps, err := o.p2.Pools(ctx)
		if err != nil || len(ps) != 1 || ps[0].Project != "p2" {
			t.Fatalf("p2 lists pools: %+v %v", ps, err)
		}
		if _, err := o.p2.DeletePool(ctx, o.pool); err != nil {
			t.Fatalf("p2 deletes its pool: %v", err)
		}
		if p, err := o.p1.Pool(ctx, o.pool); err != nil || p.Project != "p1" {
			t.Fatalf("p1's pool after p2 deleted its own: %+v %v", p, err)
		}
		_, err = o.p2.Pool(ctx, o.pool)
		mustCode(t, "p2 reads the pool name after deleting its own", err, api.CodeNotFound)
	})

	t.Run("fncall-workers-per-project", func(t *testing.T) {
		// A worker that ran one project's task never serves another's:
		// the same shape keeps workers per project, each seen only by
		// its project (and root).
		shape := api.FnCallRequest{CPU: 0.15, MemoryMB: 72, Cmd: "echo ok"}
		for who, c := range map[string]*warren.Client{"p1": o.p1, "p2": o.p2} {
			if r, err := c.FnCall(ctx, shape); err != nil || r.Stdout != "ok\n" {
				t.Fatalf("%s's task: %+v %v", who, r, err)
			}
		}
		name := "fncall:busybox/0.15cpu/72mb"
		pools := func(c *warren.Client) map[string]bool {
			nodes, err := c.Nodes(ctx)
			if err != nil {
				t.Fatalf("nodes: %v", err)
			}
			out := map[string]bool{}
			for _, n := range nodes {
				for _, p := range n.Pools {
					if p.Name == name {
						out[p.Project] = true
					}
				}
			}
			return out
		}
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			got := pools(o.s.C)
			if got["p1"] && got["p2"] && len(got) == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the workers of %s are not per project: %v", name, got)
			}
		}
		if got := pools(o.p2); !got["p2"] || got["p1"] || len(got) != 1 {
			t.Fatalf("p2's view of the FnCall workers: %v", got)
		}
	})

	t.Run("fork", func(t *testing.T) {
		// A project admin forks its own sandbox; the children are p1's.
		res, err := o.p1.Fork(ctx, o.sb, 2)
		if err != nil {
			t.Fatalf("p1 forks its sandbox: %v", err)
		}
		for _, k := range res.Sandboxes {
			t.Cleanup(func() { _, _ = o.s.C.Delete(context.Background(), k.ID) })
			if k.Project != "p1" {
				t.Fatalf("fork child of p1 in project %q", k.Project)
			}
		}
		if res.Snapshot.Project != "p1" {
			t.Fatalf("fork snapshot in project %q", res.Snapshot.Project)
		}
		// A root admin's fork of a p1 sandbox stays in p1 and within its quota.
		if _, err := o.s.C.UpdateProject(ctx, "p1", api.UpdateProjectRequest{Quota: api.Quota{Sandboxes: 6}}); err != nil {
			t.Fatal(err)
		}
		defer func() { _, _ = o.s.C.UpdateProject(ctx, "p1", api.UpdateProjectRequest{}) }()
		root, err := o.s.C.Fork(ctx, o.sb, 1)
		if err != nil {
			t.Fatalf("root forks a p1 sandbox: %v", err)
		}
		for _, k := range root.Sandboxes {
			t.Cleanup(func() { _, _ = o.s.C.Delete(context.Background(), k.ID) })
			if k.Project != "p1" {
				t.Fatalf("root's fork child of a p1 sandbox in project %q", k.Project)
			}
		}
		// p1 now has sb, the trajectory's sandbox, 2+1 forks (and perhaps a
		// restored one): a fork of 8 exceeds the quota of 6.
		_, err = o.s.C.Fork(ctx, o.sb, 8)
		mustCode(t, "fork beyond p1's quota", err, api.CodeForbidden)
		_, err = o.p2.Fork(ctx, o.sb, 1)
		mustCode(t, "sibling forks p1's sandbox", err, api.CodeNotFound)
	})

	t.Run("replay", func(t *testing.T) {
		// A scoped token replays its own trajectory.
		rep, err := o.p1.ReplayTrajectory(ctx, o.traj, false)
		if err != nil {
			t.Fatalf("p1 replays its trajectory: %v\n%s", err, tail(o.s.logs.String(), 20))
		}
		if rep.Steps == 0 {
			t.Fatalf("replay: %+v", rep)
		}
	})

	t.Run("idempotency", func(t *testing.T) {
		key := "own-idem-" + fmt.Sprint(os.Getpid())
		a, err := o.p1.CreateWithKey(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 32}, key)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = o.s.C.Delete(context.Background(), a.ID) })
		b, err := o.p1.CreateWithKey(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 32}, key)
		if err != nil || b.ID != a.ID {
			t.Fatalf("same key, same body: %v %v", b, err)
		}
		c, err := o.p1.CreateWithKey(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.2, MemoryMB: 48}, key)
		if err == nil {
			t.Cleanup(func() { _, _ = o.s.C.Delete(context.Background(), c.ID) })
		}
		mustCode(t, "same key, another body", err, api.CodeInvalid)
	})

	t.Run("pool", func(t *testing.T) {
		if p, err := o.p1.Pool(ctx, o.pool); err != nil || p.Project != "p1" {
			t.Fatalf("owner reads its pool: %+v %v", p, err)
		}
		// The root token resizes p1's pool without naming the project.
		if p, err := o.s.C.CreatePool(ctx, api.PoolRequest{Name: o.pool, Image: "busybox", CPU: 0.1, MemoryMB: 32, Size: 1}); err != nil || p.Project != "p1" {
			t.Fatalf("root resizes p1's pool: %+v %v", p, err)
		}
		// A p2 sandbox of the pool's shape is not served by p1's pool; a
		// p1.c one is.
		ready := func() {
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				if p, err := o.p1.Pool(ctx, o.pool); err == nil && p.Ready >= 1 {
					return
				}
				if time.Now().After(deadline) {
					t.Fatal("the pool never got ready")
				}
			}
		}
		ready()
		sb := o.mk(t, o.p2, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 32})
		if sb.Pool != "" {
			t.Fatalf("p2's sandbox came from pool %q", sb.Pool)
		}
		ready()
		if sb := o.mk(t, o.child, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 32}); sb.Pool != o.pool {
			t.Fatalf("p1.c's sandbox of the pool's shape came from pool %q", sb.Pool)
		}
	})

	t.Run("scoped-codes", func(t *testing.T) {
		// A scoped token's own layer and snapshot calls are never 400.
		for _, c := range []struct{ method, path string }{
			{"GET", "/v1/layers"}, {"GET", "/v1/layers/ws/nosuch"}, {"DELETE", "/v1/layers/ws/nosuch"},
			{"GET", "/v1/snapshots/snap-aaaaaaaaaaaaaaaa"}, {"DELETE", "/v1/snapshots/snap-aaaaaaaaaaaaaaaa"},
			{"POST", "/v1/layers:gc"},
		} {
			code, body := o.s.rawRequest(t, c.method, c.path, o.tok2, nil, nil)
			if code == 400 || code >= 500 {
				t.Errorf("%s %s with a scoped token: %d %s", c.method, c.path, code, body)
			}
		}
	})

	t.Run("scoped-trajectory-lifecycle", func(t *testing.T) {
		// A project's trajectory is stored under its project: record,
		// checkpoint, resume (fast-forward), branch and rebuild all work
		// for a scoped token, and its parent reads it by ?project=.
		name := "life/run"
		counterOp := func(i int) api.ExecRequest {
			return api.ExecRequest{Cmd: fmt.Sprintf("echo x >> /counter; echo %d > /last; wc -l < /counter", i)}
		}
		sb := o.mk(t, o.child, api.CreateSandboxRequest{CPU: 0.1, MemoryMB: 64, Trajectory: name, Checkpoint: "2"})
		for i := 1; i <= 4; i++ {
			if r, err := o.child.Exec(ctx, sb.ID, counterOp(i)); err != nil || r.Step != int64(i) {
				t.Fatalf("step %d: %+v %v", i, r, err)
			}
		}
		if _, err := o.child.ResumeTrajectory(ctx, name, false); err != nil {
			t.Fatalf("resume: %v", err)
		}
		for i := 1; i <= 4; i++ {
			if r, err := o.child.Exec(ctx, sb.ID, counterOp(i)); err != nil || !r.Replayed {
				t.Fatalf("re-issued step %d: %+v %v", i, r, err)
			}
		}
		if r, err := o.child.Exec(ctx, sb.ID, counterOp(5)); err != nil || r.Replayed || r.Step != 5 || strings.TrimSpace(r.Stdout) != "5" {
			t.Fatalf("a new step after the fast-forward: %+v %v", r, err)
		}
		// Its sandbox goes away: resume rebuilds it from the checkpoint.
		if _, err := o.child.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		nsb, err := o.child.ResumeTrajectory(ctx, name, false)
		if err != nil || nsb.ID == sb.ID || nsb.Project != "p1.c" {
			t.Fatalf("rebuild: %+v %v", nsb, err)
		}
		t.Cleanup(func() { _, _ = o.s.C.Delete(context.Background(), nsb.ID) })
		for i := 1; i <= 5; i++ {
			if _, err := o.child.Exec(ctx, nsb.ID, counterOp(i)); err != nil {
				t.Fatalf("re-issued step %d on the rebuilt sandbox: %v", i, err)
			}
		}
		if b, err := o.child.ReadFileBytes(ctx, nsb.ID, "/counter"); err != nil || strings.Count(string(b), "x") != 5 {
			t.Fatalf("rebuilt state: %q %v", b, err)
		}
		// The parent reads it by naming the project; p2 does not, even so.
		code, body := o.s.rawRequest(t, "GET", "/v1/trajectories/"+name+"?project=p1.c", o.tok1, nil, nil)
		if code != 200 || !strings.Contains(body, `"step":5`) {
			t.Fatalf("parent reads the child's trajectory: %d %s", code, body)
		}
		if pg, err := o.p1.TrajectoryOf(ctx, "p1.c", name, 0, 0); err != nil || len(pg.Steps) != 5 {
			t.Fatalf("parent reads the child's trajectory (SDK): %+v %v", pg, err)
		}
		if rep, err := o.p1.ReplayTrajectoryOf(ctx, "p1.c", name, false); err != nil || rep.Steps != 5 {
			t.Fatalf("parent replays the child's trajectory: %+v %v", rep, err)
		}
		out, err := exec.Command(bins.warren, "--url", o.s.URL, "--token", o.tok1, "--json", "traj", "show", name, "--project", "p1.c").CombinedOutput()
		if err != nil || strings.Count(string(out), `"op": "exec"`)+strings.Count(string(out), `"op":"exec"`) != 5 {
			t.Fatalf("warren traj show --project: %v\n%s", err, out)
		}
		if code, _ := o.s.rawRequest(t, "GET", "/v1/trajectories/"+name+"?project=p1.c", o.tok2, nil, nil); code != 404 {
			t.Fatalf("sibling reads it naming the project: %d", code)
		}
		rep, err := o.child.ReplayTrajectory(ctx, name, false)
		if err != nil || rep.Steps != 5 {
			t.Fatalf("replay: %+v %v", rep, err)
		}
	})

	t.Run("audit", func(t *testing.T) { auditRoutes(t, o) })
}

// specPaths lists "METHOD /path" for every operation of api/openapi.yaml.
func specPaths(t *testing.T) []string {
	f, err := os.Open("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	in, path := false, ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "paths:":
			in = true
		case in && line != "" && !strings.HasPrefix(line, " ") && !strings.HasPrefix(line, "#"):
			in = false
		case in && strings.HasPrefix(line, "  /") && strings.HasSuffix(line, ":"):
			path = strings.Trim(strings.TrimSpace(strings.TrimSuffix(line, ":")), `"'`)
		case in && path != "" && strings.HasPrefix(line, "    ") && !strings.HasPrefix(line, "     "):
			m := strings.TrimSuffix(strings.TrimSpace(line), ":")
			switch m {
			case "get", "post", "put", "patch", "delete":
				out = append(out, strings.ToUpper(m)+" "+path)
			}
		}
	}
	if len(out) < 30 {
		t.Fatalf("parsed only %d operations from openapi.yaml", len(out))
	}
	sort.Strings(out)
	return out
}

// auditRoutes walks every route of the spec with p2's token against p1's
// objects. Each route needs a case here: a route added to the spec without
// one fails, so it cannot ship without its ownership check being tested.
func auditRoutes(t *testing.T, o *owned) {
	// The fleet view must show p1's usage first (the next heartbeat).
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, body := o.s.rawRequest(t, "GET", "/v1/nodes", "", nil, nil)
		if strings.Contains(body, `"p1":`) && strings.Contains(body, "p1-job") && strings.Contains(body, o.pool) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the node view never showed p1's usage, job and pool: %s", body)
		}
	}
	q := url.PathEscape
	js := func(v any) []byte { b, _ := json.Marshal(v); return b }
	type attempt struct {
		path string
		body []byte
		// ok: the answer is right for a request that names no p1 object
		// (lists, public data); nil means 403 or 404 is required.
		ok func(code int, body string) bool
		// child, when set, judges the answer to p1.c instead of ok: a
		// child project reads and mounts its ancestors' layers.
		child func(code int, body string) bool
	}
	listOK := func(code int, body string) bool { return code == 200 && !o.leaks(body) }
	public := func(code int, body string) bool { return code < 500 && !o.leaks(body) }
	nothing := func(code int, body string) bool {
		return (code == 200 || code == 404 || code == 403) && !o.leaks(body)
	}
	// ownOrNone: the caller's own object of the same name (names are per
	// project, and p2 made its own run-42), or none; never p1's.
	ownOrNone := func(code int, body string) bool {
		return code == 403 || code == 404 || (code < 300 && !o.leaks(body))
	}
	// notP1: the caller's own object of the same name (layer and pool
	// names are per project), or none; never p1's.
	notP1 := func(code int, body string) bool {
		return (code < 300 || code == 400 || code == 403 || code == 404) && !strings.Contains(body, `"project":"p1"`) &&
			!strings.Contains(body, o.secret) && !strings.Contains(body, o.sb) && !strings.Contains(body, o.snap)
	}
	// parentLayer: p1.c reads (or mounts) p1's layer, nothing else of p1.
	parentLayer := func(code int, body string) bool {
		return code < 300 && !strings.Contains(body, o.secret) && !strings.Contains(body, o.sb) && !strings.Contains(body, o.snap)
	}
	sb := "/v1/sandboxes/" + o.sb
	cases := map[string][]attempt{
		"GET /metrics": {{path: "/metrics", ok: public}},
		"GET /healthz": {{path: "/healthz", ok: public}},
		"GET /v1/nodes": {{path: "/v1/nodes", ok: func(code int, body string) bool {
			// The fleet is public; other projects' usage and jobs are not.
			return code == 200 && !o.leaks(body) && !strings.Contains(body, `"p1":`) && !strings.Contains(body, "p1-job")
		}}},
		"GET /v1/images":                              {{path: "/v1/images", ok: public}},
		"POST /v1/images":                             {{path: "/v1/images", body: js(api.PullImageRequest{Ref: "127.0.0.1:1/none:latest"}), ok: public}},
		"POST /v1/images:commit":                      {{path: "/v1/images:commit", body: js(api.CommitImageRequest{Name: "stolen", Base: "busybox", Layers: []string{o.layer}})}, {path: "/v1/images:commit", body: js(api.CommitImageRequest{Name: "busybox"})}},
		"POST /v1/images:import":                      {{path: "/v1/images:import?name=busybox", body: []byte("not an archive")}},
		"GET /v1/events":                              {{path: "/v1/events?limit=10000", ok: listOK}},
		"POST /v1/sandboxes":                          {{path: "/v1/sandboxes", body: js(api.CreateSandboxRequest{Snapshot: o.snap})}, {path: "/v1/sandboxes", body: js(api.CreateSandboxRequest{Image: "busybox", Layers: []api.LayerAttachment{{Layer: "snap/" + o.snap}}})}, {path: "/v1/sandboxes", body: js(api.CreateSandboxRequest{Image: "busybox", Layers: []api.LayerAttachment{{Layer: o.layer}}}), child: parentLayer}, {path: "/v1/sandboxes", body: js(api.CreateSandboxRequest{Trajectory: o.traj, Resume: true}), ok: ownOrNone}, {path: "/v1/sandboxes", body: js(api.CreateSandboxRequest{Trajectory: o.traj, Resume: true, Project: "p1"})}, {path: "/v1/sandboxes", body: js(api.CreateSandboxRequest{Image: "busybox", Project: "p1"})}},
		"POST /v1/sandboxes:batch":                    {{path: "/v1/sandboxes:batch", body: js(api.BatchCreateRequest{Count: 1, Spec: api.CreateSandboxRequest{Snapshot: o.snap}})}, {path: "/v1/sandboxes:batch", body: js(api.BatchCreateRequest{Count: 1, Spec: api.CreateSandboxRequest{Image: "busybox", Layers: []api.LayerAttachment{{Layer: o.layer}}}}), child: parentLayer}, {path: "/v1/sandboxes:batch", body: js(api.BatchCreateRequest{Count: 1, Spec: api.CreateSandboxRequest{Image: "busybox", Project: "p1"}})}},
		"GET /v1/sandboxes":                           {{path: "/v1/sandboxes", ok: listOK}, {path: "/v1/sandboxes?project=p1", ok: listOK}},
		"GET /v1/sandboxes/{id}":                      {{path: sb}},
		"DELETE /v1/sandboxes/{id}":                   {{path: sb}},
		"POST /v1/sandboxes/{id}/pause":               {{path: sb + "/pause"}},
		"POST /v1/sandboxes/{id}/resume":              {{path: sb + "/resume"}},
		"POST /v1/sandboxes/{id}/timeout":             {{path: sb + "/timeout", body: js(api.TimeoutRequest{TTL: 5})}},
		"POST /v1/sandboxes:pause":                    {{path: "/v1/sandboxes:pause", body: js(api.PauseRequest{Label: "own=p1"}), ok: func(code int, body string) bool { return code == 200 && !o.leaks(body) }}},
		"POST /v1/sandboxes:resume":                   {{path: "/v1/sandboxes:resume", body: js(api.PauseRequest{Label: "own=p1"}), ok: func(code int, body string) bool { return code == 200 && !o.leaks(body) }}},
		"POST /v1/sandboxes/{id}/exec":                {{path: sb + "/exec", body: js(api.ExecRequest{Cmd: "cat /secret"})}},
		"GET /v1/sandboxes/{id}/pty":                  {{path: sb + "/pty?cmd=cat+/secret"}},
		"GET /v1/sandboxes/{id}/commands":             {{path: sb + "/commands"}},
		"GET /v1/sandboxes/{id}/stats":                {{path: sb + "/stats"}},
		"GET /v1/sandboxes/{id}/network":              {{path: sb + "/network"}},
		"PUT /v1/sandboxes/{id}/network":              {{path: sb + "/network", body: js(api.NetworkSpec{Egress: []string{"10.0.0.0/8"}})}},
		"GET /v1/sandboxes/{id}/commands/{cid}":       {{path: sb + "/commands/" + o.cmd}},
		"GET /v1/sandboxes/{id}/audit":                {{path: sb + "/audit"}, {path: sb + "/audit?step=1&kind=exec"}, {path: sb + "/audit?follow=1"}, {path: sb + "/audit?summary=1"}},
		"POST /v1/sandboxes/{id}/commands/{cid}/kill": {{path: sb + "/commands/" + o.cmd + "/kill", body: js(map[string]int{"signal": 9})}},
		"PUT /v1/sandboxes/{id}/files":                {{path: sb + "/files?path=/x", body: []byte("x")}},
		"GET /v1/sandboxes/{id}/files":                {{path: sb + "/files?path=/secret"}},
		"DELETE /v1/sandboxes/{id}/files":             {{path: sb + "/files?path=/secret"}},
		"POST /v1/sandboxes/{id}/files/mkdir":         {{path: sb + "/files/mkdir", body: js(api.MkdirRequest{Path: "/d"})}},
		"POST /v1/sandboxes/{id}/files/rename":        {{path: sb + "/files/rename", body: js(map[string]string{"from": "/secret", "to": "/s2"})}},
		"PUT /v1/sandboxes/{id}/archive":              {{path: sb + "/archive?path=/", body: []byte{}}},
		"GET /v1/sandboxes/{id}/archive":              {{path: sb + "/archive?path=/"}},
		"POST /v1/sandboxes/{id}/snapshots":           {{path: sb + "/snapshots", body: js(api.CreateSnapshotRequest{})}},
		"POST /v1/sandboxes/{id}/fork":                {{path: sb + "/fork", body: js(api.ForkRequest{Count: 1})}},
		"GET /v1/snapshots":                           {{path: "/v1/snapshots", ok: listOK}, {path: "/v1/snapshots?sandbox=" + o.sb, ok: listOK}},
		"GET /v1/trajectories":                        {{path: "/v1/trajectories", ok: listOK}},
		"GET /v1/snapshots/{sid}":                     {{path: "/v1/snapshots/" + o.snap}},
		"DELETE /v1/snapshots/{sid}":                  {{path: "/v1/snapshots/" + o.snap}},
		"GET /v1/trajectories/{name}":                 {{path: "/v1/trajectories/" + o.traj, ok: ownOrNone}, {path: "/v1/trajectories/" + o.traj + "?path=/work-secret", ok: ownOrNone}, {path: "/v1/trajectories/" + o.traj + "?project=p1"}, {path: "/v1/trajectories/" + o.traj + "?audit=1&project=p1"}, {path: "/v1/trajectories/" + o.traj + "/audit/summary", ok: ownOrNone}, {path: "/v1/trajectories/" + o.traj + "?audit=summary&project=p1"}},
		"DELETE /v1/trajectories/{name}": {{path: "/v1/trajectories/" + o.traj, ok: func(code int, body string) bool {
			// p2's own run-42 is recorded by its live sandbox: 409.
			return (code == 409 || ownOrNone(code, body)) && !o.leaks(body)
		}}, {path: "/v1/trajectories/" + o.traj + "?project=p1"}},
		"POST /v1/trajectories:replay": {{path: "/v1/trajectories:replay", body: js(api.ReplayRequest{Trajectory: o.traj}), ok: ownOrNone}, {path: "/v1/trajectories:replay", body: js(api.ReplayRequest{Trajectory: o.traj, Project: "p1"})}},
		"POST /v1/layers":              {{path: "/v1/layers", body: js(api.CreateLayerRequest{Name: "ws/stolen", FromSandbox: o.sb})}, {path: "/v1/layers?name=" + q(o.layer), body: []byte{}, ok: notP1}},
		"GET /v1/layers":               {{path: "/v1/layers", ok: listOK, child: parentLayer}, {path: "/v1/layers?name=" + q(o.layer), ok: listOK, child: parentLayer}},
		"POST /v1/layers:gc":           {{path: "/v1/layers:gc", ok: nothing}},
		"GET /v1/layers/{ref}":         {{path: "/v1/layers/" + o.layer, child: parentLayer}, {path: "/v1/layers/snap/" + o.snap}},
		"DELETE /v1/layers/{ref}":      {{path: "/v1/layers/" + o.layer}, {path: "/v1/layers/snap/" + o.snap}},
		"POST /v1/fncall":              {{path: "/v1/fncall", body: js(api.FnCallRequest{Image: "busybox", Cmd: "cat /secret 2>&1; ls /"}), ok: public}},
		"POST /v1/pools":               {{path: "/v1/pools", body: js(api.PoolRequest{Name: o.pool, Image: "busybox", Size: 0}), ok: notP1}},
		"GET /v1/pools":                {{path: "/v1/pools", ok: notP1}},
		"GET /v1/pools/{name}":         {{path: "/v1/pools/" + o.pool, ok: notP1}},
		"DELETE /v1/pools/{name}":      {{path: "/v1/pools/" + o.pool, ok: notP1}},
		"POST /v1/projects":            {{path: "/v1/projects", body: js(api.CreateProjectRequest{Name: "x", Parent: "p1"})}},
		"GET /v1/projects":             {{path: "/v1/projects", ok: func(code int, body string) bool { return code == 200 && !strings.Contains(body, `"id":"p1"`) }}},
		"GET /v1/projects/{id}":        {{path: "/v1/projects/p1"}},
		"PATCH /v1/projects/{id}":      {{path: "/v1/projects/p1.c", body: js(api.UpdateProjectRequest{})}},
		"DELETE /v1/projects/{id}":     {{path: "/v1/projects/p1.c"}},
		"POST /v1/tokens":              {{path: "/v1/tokens", body: js(api.CreateTokenRequest{Principal: "x", Project: "p1"})}},
		"GET /v1/tokens":               {{path: "/v1/tokens", ok: func(code int, body string) bool { return code == 200 && !strings.Contains(body, o.tok1ID) }}},
		"DELETE /v1/tokens/{id}":       {{path: "/v1/tokens/" + o.tok1ID}},
		// Templates are catalogs for the projects below, like layers.
		"POST /v1/templates": {{path: "/v1/templates", body: js(api.Template{Name: "p1-tmpl", Project: "p1", Spec: api.CreateSandboxRequest{Image: "busybox"}})}},
		"GET /v1/templates": {{path: "/v1/templates", ok: func(code int, body string) bool { return code == 200 && !strings.Contains(body, "p1-tmpl") },
			child: func(code int, body string) bool { return code == 200 && strings.Contains(body, "p1-tmpl-label") }}},
		"GET /v1/templates/{name}":    {{path: "/v1/templates/p1-tmpl", child: parentLayer}},
		"DELETE /v1/templates/{name}": {{path: "/v1/templates/p1-tmpl"}, {path: "/v1/templates/p1-tmpl?project=p1"}},

		// Ports: p1's sandbox serves its secret on port 8000.
		"GET /v1/sandboxes/{id}/ports/{port}":           {{path: sb + "/ports/8000"}, {path: sb + "/ports/8000?raw=1"}},
		"POST /v1/sandboxes/{id}/ports/{port}":          {{path: sb + "/ports/8000", body: js(api.PortRequest{Public: true})}},
		"DELETE /v1/sandboxes/{id}/ports/{port}":        {{path: sb + "/ports/8000"}},
		"GET /v1/sandboxes/{id}/ports/{port}/{path}":    {{path: sb + "/ports/8000/secret"}},
		"POST /v1/sandboxes/{id}/ports/{port}/{path}":   {{path: sb + "/ports/8000/secret", body: []byte("x")}},
		"PUT /v1/sandboxes/{id}/ports/{port}/{path}":    {{path: sb + "/ports/8000/secret", body: []byte("x")}},
		"PATCH /v1/sandboxes/{id}/ports/{port}/{path}":  {{path: sb + "/ports/8000/secret", body: []byte("x")}},
		"DELETE /v1/sandboxes/{id}/ports/{port}/{path}": {{path: sb + "/ports/8000/secret"}},
		"GET /v1/sandboxes/{id}/screenshot":             {{path: sb + "/screenshot"}},
		"GET /v1/sandboxes/{id}/display":                {{path: sb + "/display"}},
		"POST /v1/sandboxes/{id}/display/input":         {{path: sb + "/display/input", body: js(api.DisplayInput{Type: "text", Text: "x"})}},
		// A made-up secret reaches nothing (p1's port is not public).
		"GET /p/{secret}/{path}":    {{path: "/p/" + strings.Repeat("x", 43) + "/secret"}},
		"POST /p/{secret}/{path}":   {{path: "/p/" + strings.Repeat("x", 43) + "/secret", body: []byte("x")}},
		"PUT /p/{secret}/{path}":    {{path: "/p/" + strings.Repeat("x", 43) + "/secret", body: []byte("x")}},
		"PATCH /p/{secret}/{path}":  {{path: "/p/" + strings.Repeat("x", 43) + "/secret", body: []byte("x")}},
		"DELETE /p/{secret}/{path}": {{path: "/p/" + strings.Repeat("x", 43) + "/secret"}},
	}
	cases["GET /v1/sandboxes/{id}/network/denials"] = []attempt{{path: sb + "/network/denials"}}
	// Network rules are cluster objects: every project reads them, only a
	// root admin changes them.
	cases["GET /v1/network-rules"] = []attempt{{path: "/v1/network-rules", ok: listOK}}
	cases["GET /v1/network-rules/{name}"] = []attempt{{path: "/v1/network-rules/p1-rule",
		ok: func(code int, body string) bool { return code == 404 && !o.leaks(body) }}}
	cases["PUT /v1/network-rules/{name}"] = []attempt{{path: "/v1/network-rules/p1-rule",
		body: js(api.NetworkRule{CIDRs: []string{"10.0.0.0/8"}}), ok: func(code int, body string) bool { return code == 403 }}}
	cases["DELETE /v1/network-rules/{name}"] = []attempt{{path: "/v1/network-rules/p1-rule",
		ok: func(code int, body string) bool { return code == 403 }}}
	for _, route := range specPaths(t) {
		method, path, _ := strings.Cut(route, " ")
		key := method + " " + strings.ReplaceAll(path, "{name...}", "{name}")
		att, ok := cases[key]
		if !ok {
			t.Errorf("route %s has no ownership case in auditRoutes: add one (with the check)", route)
			continue
		}
		for _, a := range att {
			for who, tok := range map[string]string{"p2": o.tok2, "p1.c": o.tokC} {
				code, body := o.s.rawRequest(t, method, a.path, tok, a.body, map[string]string{"Content-Type": contentType(a.body)})
				good := code == 403 || code == 404
				if a.child != nil && who == "p1.c" {
					good = a.child(code, body)
				} else if a.ok != nil {
					good = a.ok(code, body)
				} else if strings.Contains(body, o.secret) {
					good = false
				}
				if !good {
					t.Errorf("%s %s with %s's token: %d %s", method, a.path, who, code, strings.TrimSpace(tail(body, 3)))
				}
			}
		}
	}
	// The port routes had something to leak: p1 itself reads the secret
	// through its port.
	if code, body := o.s.rawRequest(t, "GET", sb+"/ports/8000/secret", o.tok1, nil, nil); code != 200 || body != o.secret {
		t.Errorf("p1 through its own port: %d %q", code, tail(body, 3))
	}
	// Nothing of p1 changed: its sandbox still runs and holds the secret.
	b, err := o.p1.ReadFileBytes(context.Background(), o.sb, "/secret")
	if err != nil || string(b) != o.secret {
		t.Fatalf("p1's sandbox after the audit: %q %v", b, err)
	}
	if tp, err := o.p1.GetTemplate(context.Background(), "p1-tmpl"); err != nil || tp.Project != "p1" || tp.Spec.Labels["t"] != "p1-tmpl-label" {
		t.Fatalf("p1's template after the audit: %+v %v", tp, err)
	}
}

func contentType(body []byte) string {
	if len(body) > 0 && (body[0] == '{' || body[0] == '[') {
		return "application/json"
	}
	return "application/octet-stream"
}
