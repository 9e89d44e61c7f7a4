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

	"github.com/warrenhq/warren/api"
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
	edges   map[string]*proc
	natsURL string
	token   string
	C       *warren.Client
}

func startCluster(t *testing.T, edges ...string) *cluster {
	t.Helper()
	dir, err := os.MkdirTemp("", "wtest-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := &cluster{t: t, dir: dir, edges: map[string]*proc{}}
	var client, routes []string
	for i := 0; i < 3; i++ {
		client = append(client, "nats://"+freePort(t))
		routes = append(routes, "nats-route://"+freePort(t))
	}
	c.natsURL = strings.Join(client, ",")
	for i := 0; i < 3; i++ {
		c.nats = append(c.nats, startProc(t, fmt.Sprintf("nats%d", i), "nats",
			"--name", fmt.Sprintf("n%d", i), "--listen", strings.TrimPrefix(client[i], "nats://"),
			"--cluster-listen", strings.TrimPrefix(routes[i], "nats-route://"), "--routes", strings.Join(routes, ","),
			"--data-dir", filepath.Join(dir, fmt.Sprintf("nats%d", i))))
	}
	for i := 0; i < 2; i++ {
		addr := freePort(t)
		c.apiURL = append(c.apiURL, "http://"+addr)
		c.api = append(c.api, startProc(t, fmt.Sprintf("apiserver%d", i), "apiserver", "--nats", c.natsURL, "--replicas", "3",
			"--listen", addr, "--data-dir", filepath.Join(dir, fmt.Sprintf("api%d", i))))
	}
	for _, name := range edges {
		c.startEdge(name)
	}
	deadline := time.Now().Add(90 * time.Second)
	for _, u := range c.apiURL {
		for {
			resp, err := http.Get(u + "/healthz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				c.dump()
				t.Fatalf("apiserver %s did not become healthy", u)
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
				time.Sleep(3 * time.Second)
			}
		}
	})
	c.waitNodes(len(edges))
	return c
}

func (c *cluster) startEdge(name string) {
	c.t.Helper()
	dataDir := filepath.Join(c.dir, "edge-"+name)
	startedDataDirs[dataDir] = true
	if p := c.edges[name]; p != nil {
		p.start()
		return
	}
	c.edges[name] = startProc(c.t, "edge-"+name, "edge", "--nats", c.natsURL, "--replicas", "3", "--node", name,
		"--data-dir", dataDir, "--store", filepath.Join(c.dir, "store"), "--agent", bins.agent, "--label", "zone="+name)
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

// waitNodes waits until n nodes are up.
func (c *cluster) waitNodes(n int) {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		nodes, err := c.C.Nodes(context.Background())
		up := 0
		if err == nil {
			for _, nd := range nodes {
				if nd.State == "up" {
					up++
				}
			}
		}
		if up >= n {
			return
		}
		if time.Now().After(deadline) {
			c.dump()
			c.t.Fatalf("%d nodes up, want %d (err %v)", up, n, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestClusterFaults(t *testing.T) {
	t.Cleanup(func() { assertNoLeaks(t) })
	c := startCluster(t, "ea", "eb", "ec")
	ctx := context.Background()
	defer func() {
		if t.Failed() {
			c.dump()
		}
	}()

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
	// The node with the most sandboxes dies.
	victim := ""
	for n, ids := range byNode {
		if victim == "" || len(ids) > len(byNode[victim]) {
			victim = n
		}
	}
	for _, ids := range byNode {
		r, err := c.C.Exec(ctx, ids[0], api.ExecRequest{Cmd: "echo ok"})
		if err != nil || r.Stdout != "ok\n" {
			t.Fatalf("exec: %v %+v", err, r)
		}
	}
	time.Sleep(time.Second) // the node's roster names sandboxes within 500ms
	c.edges[victim].kill9()
	killedAt := time.Now()

	// Its sandboxes are reported lost on the event stream.
	want := map[string]bool{}
	for _, id := range byNode[victim] {
		want[id] = true
	}
	var after uint64
	sawDown := false
	for len(want) > 0 || !sawDown {
		if time.Since(killedAt) > 30*time.Second {
			t.Fatalf("after 30s: node.down seen %v, still not reported lost: %v", sawDown, want)
		}
		evs, err := c.C.Events(ctx, after, 1000, time.Second)
		if err != nil {
			t.Fatalf("events: %v", err)
		}
		after = evs.Next
		for _, ev := range evs.Events {
			switch {
			case ev.Type == api.EventNodeDown && ev.Node == victim:
				sawDown = true
			case ev.Type == api.EventSandboxLost && ev.Node == victim:
				delete(want, ev.Sandbox)
			}
		}
	}
	t.Logf("node down and %d sandboxes lost reported %v after kill -9", len(byNode[victim]), time.Since(killedAt).Round(time.Millisecond))
	sb, err := c.C.Get(ctx, byNode[victim][0])
	if err != nil || sb.State != api.StateLost {
		t.Fatalf("get of a lost sandbox: %v %+v", err, sb)
	}
	if _, err := c.C.Exec(ctx, byNode[victim][0], api.ExecRequest{Cmd: "true"}); !warren.IsUnavailable(err) {
		t.Fatalf("exec in a lost sandbox: %v, want 503", err)
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

	// The dead edge comes back, adopts its sandboxes and is up again.
	c.startEdge(victim)
	c.waitNodes(3)
	deadline := time.Now().Add(20 * time.Second)
	for {
		sb, err := c.C.Get(ctx, byNode[victim][0])
		if err == nil && sb.State == api.StateRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox of the restarted node: %v %+v", err, sb)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
