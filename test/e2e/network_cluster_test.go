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
