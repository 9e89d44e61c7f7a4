package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/serve"
	warren "github.com/warrenhq/warren/sdk/go"
)

// proc is one warren process of a cluster (nats, apiserver or edge).
type proc struct {
	t    *testing.T
	name string
	args []string
	cmd  *exec.Cmd
	logs *syncBuffer
	done chan struct{}
}

func startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, args: args}
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *proc) start() {
	p.logs = &syncBuffer{}
	p.cmd = exec.Command(bins.warren, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	p.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(p.cmd, p.done)
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) stop() {
	if !p.running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(90 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		p.t.Errorf("%s did not stop on SIGTERM:\n%s", p.name, p.logs.String())
	}
}

func (p *proc) kill9() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// cluster is three NATS servers, two apiservers and three edges, all
// separate processes on loopback.
type cluster struct {
	t       *testing.T
	dir     string
	nats    []*proc
	api     []*proc
	apiURL  []string
	e2bURL  string // apiserver 0's E2B front (--e2b-listen)
	edges   map[string]*proc
	natsURL string
	auth    string // the credentials directory
	token   string
	C       *warren.Client
	// edgeArgs adds to an edge's command line (startClusterWith).
	edgeArgs func(name string) []string
}

func startCluster(t *testing.T, edges ...string) *cluster {
	t.Helper()
	return startClusterWith(t, nil, edges...)
}

// startClusterWith is startCluster whose edges get edgeArgs(name) on
// their command lines too (nil: none).
func startClusterWith(t *testing.T, edgeArgs func(name string) []string, edges ...string) *cluster {
	t.Helper()
	dir, err := os.MkdirTemp("", "wtest-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := &cluster{t: t, dir: dir, edges: map[string]*proc{}, edgeArgs: edgeArgs}
	var client, routes []string
	for i := 0; i < 3; i++ {
		client = append(client, "nats://"+freePort(t))
		routes = append(routes, "nats-route://"+freePort(t))
	}
	c.natsURL = strings.Join(client, ",")
	// One credentials directory for the cluster: a seed per role (each
	// edge its own), shared by the three servers with the route secret.
	c.auth = filepath.Join(dir, "nats-auth")
	if _, err := bus.EnsureAuth(c.auth, edges); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		c.nats = append(c.nats, startProc(t, fmt.Sprintf("nats%d", i), "nats", "--auth-dir", c.auth,
			"--name", fmt.Sprintf("n%d", i), "--listen", strings.TrimPrefix(client[i], "nats://"),
			"--cluster-listen", strings.TrimPrefix(routes[i], "nats-route://"), "--routes", strings.Join(routes, ","),
			"--data-dir", filepath.Join(dir, fmt.Sprintf("nats%d", i))))
	}
	for i := 0; i < 2; i++ {
		addr := freePort(t)
		c.apiURL = append(c.apiURL, "http://"+addr)
		args := []string{"apiserver", "--nats", c.natsURL, "--replicas", "3",
			"--nats-nkey", filepath.Join(c.auth, "apiserver.nk"),
			"--listen", addr, "--data-dir", filepath.Join(dir, fmt.Sprintf("api%d", i))}
		if i == 0 {
			e2b := freePort(t)
			c.e2bURL = "http://" + e2b
			args = append(args, "--e2b-listen", e2b)
		}
		c.api = append(c.api, startProc(t, fmt.Sprintf("apiserver%d", i), args...))
	}
	for _, name := range edges {
		c.startEdge(name)
	}
	deadline := time.Now().Add(90 * time.Second)
	for i := range c.apiURL {
		for rebinds := 0; ; {
			resp, err := http.Get(c.apiURL[i] + "/healthz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if p := c.api[i]; !p.running() && rebinds < 3 && strings.Contains(p.logs.String(), "address already in use") {
				// Another process took a port between freePort and the
				// apiserver's bind: start it again on new ones.
				rebinds++
				c.rebindAPI(i)
				continue
			}
			if time.Now().After(deadline) {
				c.dump()
				t.Fatalf("apiserver %s did not become healthy", c.apiURL[i])
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	// Exactly one apiserver made the bootstrap token.
	var found []string
	for i := range c.api {
		if b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("api%d", i), "admin-token")); err == nil {
			found = append(found, strings.TrimSpace(string(b)))
		}
	}
	if len(found) != 1 {
		c.dump()
		t.Fatalf("want exactly one bootstrap admin token, found %d", len(found))
	}
	c.token = found[0]
	c.C = warren.New(strings.Join(c.apiURL, ","), c.token, warren.WithRetry(12, 100*time.Millisecond, 2*time.Second))
	// Before the processes stop: bring back any edge a test killed, so that
	// it adopts its sandboxes and stops them when it stops.
	t.Cleanup(func() {
		for _, name := range edges {
			if p := c.edges[name]; !p.running() {
				p.start()
				for i := 0; i < 600 && p.running() && !strings.Contains(p.logs.String(), "edge is serving"); i++ {
					time.Sleep(100 * time.Millisecond)
				}
			}
		}
	})
	c.waitNodes(len(edges))
	return c
}

// rebindAPI starts apiserver i again on new ports (its --listen, and
// its --e2b-listen if it has one) after it failed to bind.
func (c *cluster) rebindAPI(i int) {
	p := c.api[i]
	for j := 0; j+1 < len(p.args); j++ {
		switch p.args[j] {
		case "--listen":
			p.args[j+1] = freePort(c.t)
			c.apiURL[i] = "http://" + p.args[j+1]
		case "--e2b-listen":
			p.args[j+1] = freePort(c.t)
			c.e2bURL = "http://" + p.args[j+1]
		}
	}
	p.start()
}

func (c *cluster) startEdge(name string) {
	c.t.Helper()
	dataDir := filepath.Join(c.dir, "edge-"+name)
	noteStarted(dataDir)
	if p := c.edges[name]; p != nil {
		p.start()
		return
	}
	args := []string{"edge", "--nats", c.natsURL, "--replicas", "3", "--node", name,
		"--nats-nkey", filepath.Join(c.auth, "edge-"+name+".nk"),
		"--data-dir", dataDir, "--store", filepath.Join(c.dir, "store"), "--agent", bins.agent, "--label", "zone=" + name}
	if c.edgeArgs != nil {
		args = append(args, c.edgeArgs(name)...)
	}
	c.edges[name] = startProc(c.t, "edge-"+name, args...)
}

func (c *cluster) dump() {
	for _, p := range append(append(append([]*proc{}, c.nats...), c.api...), func() []*proc {
		var out []*proc
		for _, p := range c.edges {
			out = append(out, p)
		}
		return out
	}()...) {
		c.t.Logf("=== %s\n%s", p.name, tail(p.logs.String(), 30))
	}
}

// waitNodes waits until every running apiserver sees n nodes up.
func (c *cluster) waitNodes(n int) {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	// Every apiserver's view: each places on its own (a group's first
	// member goes where its name hashes among the nodes a replica sees).
	for i, u := range c.apiURL {
		if !c.api[i].running() {
			continue // a test stopped it
		}
		client := warren.New(u, c.token)
		for {
			nodes, err := client.Nodes(context.Background())
			up := 0
			if err == nil {
				for _, nd := range nodes {
					if nd.State == "up" {
						up++
					}
				}
			}
			if up >= n {
				break
			}
			if time.Now().After(deadline) {
				c.dump()
				c.t.Fatalf("%d nodes up at %s, want %d (err %v)", up, u, n, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func TestClusterFaults(t *testing.T) {
	t.Cleanup(func() { assertNoLeaks(t) })
	c := startCluster(t, "ea", "eb", "ec")
	ctx := context.Background()

	// The bus of the cluster: no anonymous client, and an edge's
	// credentials reach only that edge's own subjects.
	first := strings.Split(c.natsURL, ",")[0]
	if nc, err := nats.Connect(first, nats.Timeout(5*time.Second)); err == nil {
		nc.Close()
		t.Errorf("a client without credentials connected to the cluster's NATS")
	}
	checkEdgeCredentials(t, first, filepath.Join(c.auth, "edge-ea.nk"), "ea")
	defer func() {
		if t.Failed() {
			c.dump()
		}
	}()

	// A trajectory that checkpoints every step; its node is the one to die.
	traj, err := c.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64,
		Trajectory: "cluster/rollout", Checkpoint: "every-step"})
	if err != nil {
		t.Fatalf("create trajectory sandbox: %v", err)
	}
	victim := traj.Node
	if _, err := c.C.Mkdir(ctx, traj.ID, api.MkdirRequest{Path: "/state"}); err != nil {
		t.Fatal(err)
	}
	const trajSteps = 5
	for i := 1; i <= trajSteps; i++ {
		if res, err := c.C.Exec(ctx, traj.ID, counterOp(i)); err != nil || strings.TrimSpace(res.Stdout) != fmt.Sprint(i) {
			t.Fatalf("trajectory step %d: %+v %v", i, res, err)
		}
	}
	steps, err := c.C.TrajectoryAll(ctx, "cluster/rollout")
	if err != nil || len(steps) != trajSteps+1 || steps[trajSteps].Checkpoint == "" {
		t.Fatalf("trajectory log: %d steps (last %+v), %v", len(steps), steps[len(steps)-1], err)
	}
	checkpoint := steps[trajSteps].Checkpoint

	// Creates spread over the nodes; every sandbox answers.
	byNode := map[string][]string{}
	for i := 0; i < 9; i++ {
		sb, err := c.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64})
		if err != nil {
			t.Fatalf("create: %v", err)
		}
		byNode[sb.Node] = append(byNode[sb.Node], sb.ID)
	}
	if len(byNode) < 2 {
		t.Fatalf("9 sandboxes all went to %v", byNode)
	}
	if len(byNode[victim]) == 0 { // the node to die holds some of them too
		sb, err := c.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64,
			NodeSelector: map[string]string{"zone": victim}})
		if err != nil {
			t.Fatalf("create on %s: %v", victim, err)
		}
		byNode[victim] = append(byNode[victim], sb.ID)
	}
	nVictim := len(byNode[victim])
	for _, ids := range byNode {
		r, err := c.C.Exec(ctx, ids[0], api.ExecRequest{Cmd: "echo ok"})
		if err != nil || r.Stdout != "ok\n" {
			t.Fatalf("exec: %v %+v", err, r)
		}
	}
	// Follow the event stream from now on (GET /v1/events?follow=1).
	start, err := c.C.Events(ctx, 0, 10000, 0)
	if err != nil {
		t.Fatalf("events: %v", err)
	}
	followCtx, stopFollow := context.WithTimeout(ctx, 60*time.Second)
	defer stopFollow()
	streamed := make(chan api.Event, 1000)
	go func() {
		defer close(streamed)
		_ = c.C.FollowEvents(followCtx, start.Next, func(ev api.Event) error {
			streamed <- ev
			return nil
		})
	}()
	time.Sleep(time.Second) // the node's roster names sandboxes within 500ms
	victimDir := filepath.Join(c.dir, "edge-"+victim)
	tracesBefore := map[string]sandboxTraces{}
	for _, id := range append([]string{traj.ID}, byNode[victim]...) {
		tr := traces(victimDir, id)
		if len(tr.cgroups) == 0 || len(tr.pids) == 0 {
			t.Fatalf("sandbox %s on %s: no cgroup or process found (%+v): the trace check sees nothing", id, victim, tr)
		}
		tracesBefore[id] = tr
	}
	c.edges[victim].kill9()
	killedAt := time.Now()

	// Its sandboxes (and the trajectory's) are reported lost on the event
	// stream, streamed as they happen.
	want := map[string]bool{traj.ID: true}
	for _, id := range byNode[victim] {
		want[id] = true
	}
	sawDown := false
	for len(want) > 0 || !sawDown {
		ev, ok := <-streamed
		if !ok {
			t.Fatalf("after %v: node.down seen %v, still not reported lost: %v", time.Since(killedAt), sawDown, want)
		}
		if ev.Seq <= start.Next {
			t.Fatalf("streamed event %d at or before the start %d", ev.Seq, start.Next)
		}
		switch {
		case ev.Type == api.EventNodeDown && ev.Node == victim:
			sawDown = true
		case ev.Type == api.EventSandboxLost && ev.Node == victim:
			delete(want, ev.Sandbox)
		}
	}
	stopFollow()
	t.Logf("node down and %d sandboxes lost streamed %v after kill -9", nVictim+1, time.Since(killedAt).Round(time.Millisecond))

	// The trajectory resumes on another node from its last checkpoint (in
	// the shared --store): the logged steps are fast-forwarded, not run.
	nb, err := c.C.ResumeTrajectory(ctx, "cluster/rollout", false)
	if err != nil {
		t.Fatalf("resume of the trajectory whose node died: %v", err)
	}
	if nb.Node == victim || nb.ID == traj.ID || nb.Snapshot != checkpoint {
		t.Fatalf("rebuilt trajectory sandbox: %+v (dead node %s, checkpoint %s)", nb, victim, checkpoint)
	}
	if r, err := c.C.Mkdir(ctx, nb.ID, api.MkdirRequest{Path: "/state"}); err != nil || !r.Replayed {
		t.Fatalf("replayed mkdir: %+v %v", r, err)
	}
	for i := 1; i <= trajSteps; i++ {
		res, err := c.C.Exec(ctx, nb.ID, counterOp(i))
		if err != nil || !res.Replayed || strings.TrimSpace(res.Stdout) != fmt.Sprint(i) {
			t.Fatalf("replay %d on %s: %+v %v", i, nb.Node, res, err)
		}
	}
	for i := trajSteps + 1; i <= trajSteps+2; i++ {
		if res, err := c.C.Exec(ctx, nb.ID, counterOp(i)); err != nil || res.Replayed || res.Step != int64(i+1) {
			t.Fatalf("live step %d on %s: %+v %v", i, nb.Node, res, err)
		}
	}
	check := api.ExecRequest{Cmd: "wc -l < /counter; ls /state | wc -l"}
	if r, err := c.C.Exec(ctx, nb.ID, check); err != nil || r.Stdout != fmt.Sprintf("%d\n%d\n", trajSteps+2, trajSteps+2) {
		t.Fatalf("rebuilt filesystem on %s: %+v %v (want each step run once)", nb.Node, r, err)
	}
	sb, err := c.C.Get(ctx, byNode[victim][0])
	if err != nil || sb.State != api.StateLost {
		t.Fatalf("get of a lost sandbox: %v %+v", err, sb)
	}
	if _, err := c.C.Exec(ctx, byNode[victim][0], api.ExecRequest{Cmd: "true"}); !warren.IsConflict(err) {
		t.Fatalf("exec in a lost sandbox: %v, want 409", err)
	}
	// The others are unaffected and creates continue, never on the dead node.
	for n, ids := range byNode {
		if n == victim {
			continue
		}
		for _, id := range ids {
			if r, err := c.C.Exec(ctx, id, api.ExecRequest{Cmd: "echo ok"}); err != nil || r.Stdout != "ok\n" {
				t.Fatalf("exec on %s after the kill: %v", n, err)
			}
		}
	}
	for i := 0; i < 6; i++ {
		sb, err := c.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64})
		if err != nil {
			t.Fatalf("create after the kill: %v", err)
		}
		if sb.Node == victim {
			t.Fatalf("sandbox placed on the dead node %s", victim)
		}
		byNode[sb.Node] = append(byNode[sb.Node], sb.ID)
	}

	// The first apiserver dies: the client moves to the other, loses nothing.
	c.api[0].kill9()
	for i := 0; i < 3; i++ {
		sb, err := c.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64})
		if err != nil {
			t.Fatalf("create with apiserver 0 dead: %v", err)
		}
		byNode[sb.Node] = append(byNode[sb.Node], sb.ID)
	}
	if u := c.C.URL(); u != c.apiURL[1] {
		t.Fatalf("client uses %s, want the surviving %s", u, c.apiURL[1])
	}
	list, err := c.C.List(ctx, warren.ListOptions{})
	if err != nil {
		t.Fatalf("list: %v", err)
	}
	live := 0
	for _, s := range list {
		if s.State == api.StateRunning {
			live++
		}
	}
	if want := 9 - len(byNode[victim]) + 9; live < want {
		t.Fatalf("%d running sandboxes listed, want %d", live, want)
	}

	// One NATS server dies: everything continues.
	c.nats[2].kill9()
	for i := 0; i < 3; i++ {
		if _, err := c.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64}); err != nil {
			t.Fatalf("create with a NATS server dead: %v", err)
		}
	}

	// The dead edge comes back. What was reported lost does not come back
	// to life: the node destroys it (processes, cgroups, mounts, storage)
	// before it serves, says so on the event stream, and answers it as
	// lost; the trajectory goes on on the sandbox it was rebuilt on.
	c.startEdge(victim)
	c.waitNodes(3)
	lostIDs := append([]string{traj.ID}, byNode[victim]...)
	destroyed := map[string]bool{}
	for _, id := range lostIDs {
		destroyed[id] = true
	}
	after := start.Next
	deadline := time.Now().Add(30 * time.Second)
	for len(destroyed) > 0 {
		evs, err := c.C.Events(ctx, after, 1000, time.Second)
		if err == nil {
			for _, ev := range evs.Events {
				if ev.Type == api.EventSandboxDestroyed && ev.Node == victim {
					delete(destroyed, ev.Sandbox)
				}
			}
			after = evs.Next
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sandbox.destroyed event for %v (%v)", destroyed, err)
		}
	}
	for _, id := range lostIDs {
		if tr := traces(victimDir, id); len(tr.cgroups)+len(tr.mounts) > 0 || alive(tracesBefore[id].pids, id) {
			t.Fatalf("lost sandbox %s still on %s after it came back: %+v (before: %+v)", id, victim, tr, tracesBefore[id])
		}
		if _, err := os.Stat(filepath.Join(victimDir, "edge", "run", id)); !os.IsNotExist(err) {
			t.Fatalf("lost sandbox %s: state dir left (%v)", id, err)
		}
		sb, err := c.C.Get(ctx, id)
		if err != nil || sb.State != api.StateLost {
			t.Fatalf("get of a lost sandbox after its node came back: %v %+v", err, sb)
		}
		if _, err := c.C.Exec(ctx, id, api.ExecRequest{Cmd: "true"}); !warren.IsConflict(err) {
			t.Fatalf("exec in a lost sandbox after its node came back: %v, want 409", err)
		}
	}
	rb, err := c.C.ResumeTrajectory(ctx, "cluster/rollout", false)
	if err != nil || rb.ID != nb.ID {
		t.Fatalf("resume after the old node came back: %+v %v (want the rebuilt %s)", rb, err, nb.ID)
	}
	if r, err := c.C.Mkdir(ctx, nb.ID, api.MkdirRequest{Path: "/state"}); err != nil || !r.Replayed {
		t.Fatalf("replayed mkdir: %+v %v", r, err)
	}
	for i := 1; i <= trajSteps+2; i++ {
		if res, err := c.C.Exec(ctx, nb.ID, counterOp(i)); err != nil || !res.Replayed || strings.TrimSpace(res.Stdout) != fmt.Sprint(i) {
			t.Fatalf("replay %d on %s: %+v %v", i, nb.Node, res, err)
		}
	}
	if r, err := c.C.Exec(ctx, nb.ID, check); err != nil || !r.Replayed {
		t.Fatalf("replayed check: %+v %v", r, err)
	}
	if res, err := c.C.Exec(ctx, nb.ID, counterOp(trajSteps+3)); err != nil || res.Replayed || res.Step != int64(trajSteps+5) ||
		strings.TrimSpace(res.Stdout) != fmt.Sprint(trajSteps+3) {
		t.Fatalf("live step after the old node came back: %+v %v", res, err)
	}
	if tr, err := c.C.Trajectory(ctx, "cluster/rollout", 0, 0); err != nil || tr.Sandbox != nb.ID {
		t.Fatalf("trajectory record: %+v %v (want sandbox %s)", tr, err, nb.ID)
	}
	if _, err := c.C.Delete(ctx, nb.ID); err != nil {
		t.Fatal(err)
	}

	// A sandbox that was never reported lost is adopted: the edge dies and
	// comes back before it is marked down.
	kept, err := c.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64,
		NodeSelector: map[string]string{"zone": victim}})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // in the roster
	c.edges[victim].kill9()
	c.startEdge(victim)
	deadline = time.Now().Add(30 * time.Second)
	for {
		sb, err := c.C.Get(ctx, kept.ID)
		if err == nil && sb.State == api.StateRunning {
			if r, err := c.C.Exec(ctx, kept.ID, api.ExecRequest{Cmd: "echo ok"}); err != nil || r.Stdout != "ok\n" {
				t.Fatalf("exec in the adopted sandbox: %+v %v", r, err)
			}
			break
		}
		if err == nil && sb.State == api.StateLost {
			// Restarting took longer than the heartbeat timeout: then it
			// must have been reported lost, and is destroyed.
			down := false
			for after := start.Next; !down; {
				evs, err := c.C.Events(ctx, after, 1000, 0)
				if err != nil || len(evs.Events) == 0 {
					break
				}
				for _, ev := range evs.Events {
					down = down || (ev.Type == api.EventSandboxLost && ev.Sandbox == kept.ID)
				}
				after = evs.Next
			}
			if !down {
				t.Fatalf("sandbox %s answers lost but was never reported lost", kept.ID)
			}
			t.Logf("the edge took longer than %v to restart: %s was reported lost, not adopted", 5*time.Second, kept.ID)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox of the restarted node: %v %+v", err, sb)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// A partition: the edge lives on but is unheard (stopped) until it is
	// marked down and its sandbox reported lost; when it is heard again it
	// destroys the sandbox at once, without a restart.
	keptTraces := traces(victimDir, kept.ID)
	p := c.edges[victim].cmd.Process
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := true
	defer func() {
		if stopped {
			_ = p.Signal(syscall.SIGCONT)
		}
	}()
	waitEvent := func(typ, id string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			for after := start.Next; ; {
				evs, err := c.C.Events(ctx, after, 1000, 0)
				if err != nil || len(evs.Events) == 0 {
					break
				}
				for _, ev := range evs.Events {
					if ev.Type == typ && ev.Sandbox == id {
						return
					}
				}
				after = evs.Next
			}
			if time.Now().After(deadline) {
				t.Fatalf("no %s event for %s", typ, id)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitEvent(api.EventSandboxLost, kept.ID)
	_ = p.Signal(syscall.SIGCONT)
	stopped = false
	waitEvent(api.EventSandboxDestroyed, kept.ID)
	if tr := traces(victimDir, kept.ID); len(tr.cgroups)+len(tr.mounts) > 0 || alive(keptTraces.pids, kept.ID) {
		t.Fatalf("lost sandbox %s still on %s after the partition: %+v", kept.ID, victim, tr)
	}
	if sb, err := c.C.Get(ctx, kept.ID); err != nil || sb.State != api.StateLost {
		t.Fatalf("get of a sandbox lost in a partition: %v %+v", err, sb)
	}
}

// sandboxTraces is what a sandbox holds on its host.
type sandboxTraces struct{ cgroups, pids, mounts []string }

// traces finds sandbox id's cgroups (of the edge with dataDir), the
// processes in them, and the mounts naming it.
func traces(dataDir, id string) sandboxTraces {
	var tr sandboxTraces
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + serve.CgroupParent(dataDir) + "/" + id)
	for _, d := range dirs {
		tr.cgroups = append(tr.cgroups, d)
		if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err == nil {
			tr.pids = append(tr.pids, strings.Fields(string(b))...)
		}
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mi), "\n") {
		if strings.Contains(l, id) {
			tr.mounts = append(tr.mounts, l)
		}
	}
	return tr
}

// alive reports whether any of pids still runs in a cgroup of sandbox id
// (a reused pid elsewhere does not count, nor does a zombie: an agent
// orphaned by the edge's kill -9 waits for the host's init to reap it, and
// its /proc/<pid>/cgroup still names its deleted cgroup v2).
func alive(pids []string, id string) bool {
	for _, p := range pids {
		if st, err := os.ReadFile("/proc/" + p + "/stat"); err == nil {
			if i := strings.LastIndexByte(string(st), ')'); i > 0 && strings.HasPrefix(string(st[i+1:]), " Z") {
				continue
			}
		}
		if b, err := os.ReadFile("/proc/" + p + "/cgroup"); err == nil && strings.Contains(string(b), "/"+id) {
			return true
		}
	}
	return false
}
