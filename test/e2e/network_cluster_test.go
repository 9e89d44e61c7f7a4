package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
	warren "github.com/warrenhq/warren/sdk/go"
)

// TestClusterNetworkRules: in a cluster (separate NATS, apiservers and an
// edge with its own credentials), a rule written through one apiserver is
// read through the other, and its change reaches a running sandbox on the
// edge within a second.
func TestClusterNetworkRules(t *testing.T) {
	t.Cleanup(func() { assertNoLeaks(t) })
	nettest.FakeInternet(t)
	c := startCluster(t, "nr")
	ctx := context.Background()
	defer func() {
		if t.Failed() {
			c.dump()
		}
	}()
	a, b := warren.New(c.apiURL[0], c.token), warren.New(c.apiURL[1], c.token)
	if _, err := a.PutNetworkRule(ctx, api.NetworkRule{Name: "mirror", CIDRs: []string{nettest.Mirror}, Ports: []int{443}}); err != nil {
		t.Fatal(err)
	}
	if r, err := b.NetworkRule(ctx, "mirror"); err != nil || r.Version != 1 || r.CIDRs[0] != nettest.Mirror+"/32" {
		t.Fatalf("the rule through the other apiserver: %+v %v", r, err)
	}
	sb, err := c.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64,
		Network: &api.NetworkSpec{Egress: []string{"mirror"}}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = c.C.Delete(context.Background(), sb.ID) }()
	reach := func(port string) bool {
		r, err := c.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "nc -w 3 " + nettest.Mirror + " " + port + " </dev/null"})
		return err == nil && r.ExitCode == 0 && r.Stdout == "hello"
	}
	if !reach("443") || reach("80") {
		t.Fatalf("before the change: 443 %v, 80 %v (want true, false)", reach("443"), reach("80"))
	}
	if r, err := b.PutNetworkRule(ctx, api.NetworkRule{Name: "mirror", CIDRs: []string{nettest.Mirror}, Ports: []int{80}}); err != nil || r.Version != 2 {
		t.Fatalf("change through the other apiserver: %+v %v", r, err)
	}
	time.Sleep(time.Second)
	if !reach("80") || reach("443") {
		t.Errorf("a second after the change: 80 %v, 443 %v (want true, false)", reach("80"), reach("443"))
	}
	n, err := c.C.Network(ctx, sb.ID)
	if err != nil || !strings.Contains(strings.Join(n.Egress, ","), "mirror") {
		t.Errorf("network: %+v %v", n, err)
	}
}

// TestClusterNetworkRuleChangedWhileEdgeDown: a named rule changed while
// the edge that runs a sandbox using it is dead (kill -9) holds on that
// sandbox once the edge is back and has adopted it: the kernel kept the
// old rule across the crash, the restarted edge catches up.
func TestClusterNetworkRuleChangedWhileEdgeDown(t *testing.T) {
	t.Cleanup(func() { assertNoLeaks(t) })
	nettest.FakeInternet(t)
	const node = "nrd"
	c := startCluster(t, node)
	ctx := context.Background()
	defer func() {
		if t.Failed() {
			c.dump()
		}
	}()
	put := func(port int) {
		t.Helper()
		if _, err := c.C.PutNetworkRule(ctx, api.NetworkRule{Name: "downmirror", CIDRs: []string{nettest.Mirror}, Ports: []int{port}}); err != nil {
			t.Fatal(err)
		}
	}
	// The edge must come back before the cluster marks it down (5 s);
	// when a loaded machine makes it slower, its sandbox is reported lost
	// and destroyed, and the test tries again with a new one.
	for attempt := 1; ; attempt++ {
		put(443)
		sb, err := c.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64,
			Network: &api.NetworkSpec{Egress: []string{"downmirror"}}})
		if err != nil {
			t.Fatal(err)
		}
		reach := func(port string) bool {
			r, err := c.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "nc -w 3 " + nettest.Mirror + " " + port + " </dev/null"})
			return err == nil && r.ExitCode == 0 && r.Stdout == "hello"
		}
		if !reach("443") || reach("80") {
			t.Fatalf("before the change: 443 %v, 80 %v (want true, false)", reach("443"), reach("80"))
		}
		time.Sleep(time.Second) // in the node's roster
		c.edges[node].kill9()
		put(80)
		c.startEdge(node)
		var got *api.Sandbox
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			got, err = c.C.Get(ctx, sb.ID)
			if err == nil && (got.State == api.StateLost || got.State == api.StateRunning) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox after the edge's restart: %+v %v", got, err)
			}
		}
		if got.State == api.StateLost {
			if attempt == 3 {
				t.Fatalf("the edge never came back within the cluster's heartbeat timeout in %d tries", attempt)
			}
			t.Logf("try %d: the edge took longer than the heartbeat timeout to restart; %s was reported lost", attempt, sb.ID)
			continue
		}
		// Adopted: within a second of answering, it obeys the new rule.
		for deadline := time.Now().Add(time.Second); ; time.Sleep(50 * time.Millisecond) {
			r80, r443 := reach("80"), reach("443")
			if r80 && !r443 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after the restart: 80 %v, 443 %v (want true, false): the rule changed while the edge was down does not hold", r80, r443)
			}
		}
		if n, err := c.C.Network(ctx, sb.ID); err != nil || n.DeniedBy["not-allowed"] == 0 {
			t.Errorf("refusal under the new rule not counted: %+v %v", n, err)
		}
		if _, err := c.C.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		return
	}
}

// TestClusterNetworkGroup: a network group lives on one node of a
// cluster. Members created through both apiservers all land on the node
// that holds the group, reach each other there, and the node's view
// counts them; a second group of the same project goes where its own name
// hashes, and its members do not reach the first group's.
func TestClusterNetworkGroup(t *testing.T) {
	t.Cleanup(func() { assertNoLeaks(t) })
	pools := map[string]string{"nga": "10.214.1.0/24", "ngb": "10.214.2.0/24"}
	c := startClusterWith(t, func(name string) []string { return []string{"--net-pool", pools[name]} }, "nga", "ngb")
	ctx := context.Background()
	defer func() {
		if t.Failed() {
			c.dump()
		}
	}()
	apis := []*warren.Client{warren.New(c.apiURL[0], c.token), warren.New(c.apiURL[1], c.token)}
	create := func(i int, group string) *api.Sandbox {
		t.Helper()
		sb, err := apis[i%2].Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64,
			Network: &api.NetworkSpec{Egress: []string{}, Group: group}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = c.C.Delete(context.Background(), sb.ID) })
		return sb
	}
	// Two groups; their members created one after another through
	// alternating apiservers (each replica places on its own view).
	var task, other []*api.Sandbox
	for i := 0; i < 4; i++ {
		task = append(task, create(i, "task"))
		other = append(other, create(i+1, "other"))
	}
	for _, g := range [][]*api.Sandbox{task, other} {
		for _, sb := range g[1:] {
			if sb.Node != g[0].Node {
				t.Fatalf("group %s spans nodes: %s on %s, %s on %s", g[0].Network.Group, g[0].ID, g[0].Node, sb.ID, sb.Node)
			}
		}
	}
	t.Logf("group task on %s, group other on %s", task[0].Node, other[0].Node)

	addr := func(sb *api.Sandbox) string {
		n, err := c.C.Network(ctx, sb.ID)
		if err != nil || n.Address == "" {
			t.Fatalf("network of %s: %+v %v", sb.ID, n, err)
		}
		return n.Address
	}
	if _, err := c.C.Exec(ctx, task[0].ID, api.ExecRequest{Cmd: "while true; do echo hi | nc -l -p 7000; done", Background: true}); err != nil {
		t.Fatal(err)
	}
	to := addr(task[0])
	reach := func(from *api.Sandbox) bool {
		for try := 0; try < 20; try++ {
			r, err := c.C.Exec(ctx, from.ID, api.ExecRequest{Cmd: "nc -w 3 " + to + " 7000 </dev/null"})
			if err != nil {
				t.Fatal(err)
			}
			if strings.Contains(r.Stdout, "hi") {
				return true
			}
			if from.Network.Group != "task" {
				return false
			}
			time.Sleep(100 * time.Millisecond) // the listener may not be up yet
		}
		return false
	}
	for _, sb := range task[1:] {
		if !reach(sb) {
			t.Errorf("member %s (node %s) does not reach %s of its group", sb.ID, sb.Node, to)
		}
	}
	if reach(other[0]) {
		t.Errorf("a member of another group reached group task's %s", to)
	}

	// The node's view counts the group's members (heartbeats, 1 s).
	key := api.NetworkGroupKey(task[0].Project, "task")
	deadline := time.Now().Add(10 * time.Second)
	for {
		nodes, err := c.C.Nodes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int{}
		for _, n := range nodes {
			got[n.Name] = n.NetworkGroups[key]
		}
		if got[task[0].Node] == 4 && len(nodes) == 2 && got["nga"]+got["ngb"] == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("network_groups[%s] per node: %v, want 4 on %s", key, got, task[0].Node)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
