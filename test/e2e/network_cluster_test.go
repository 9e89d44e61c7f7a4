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
