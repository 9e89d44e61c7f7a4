package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
)

// TestNetworkEgressRate: a networked sandbox's uploads are held to its
// egress rate: network.egress_rate_mbit when its create sets one, else the
// node's --net-egress-rate-mbit; the drops are counted as rate-limit
// refusals. Only lower bounds of durations are asserted (a loaded machine
// only makes transfers slower).
func TestNetworkEgressRate(t *testing.T) {
	nettest.FakeInternet(t)
	pool := fmt.Sprintf("10.213.%d.0/24", 60+(os.Getpid()+30)%60)
	s := startServer(t, "--net-pool", pool, "--net-egress-rate-mbit", "16")
	ctx := context.Background()

	b := []byte(`{"image":"busybox","network":{"egress":[],"egress_rate_mbit":-1}}`)
	code, body := s.rawRequest(t, "POST", "/v1/sandboxes", "", b, map[string]string{"Content-Type": "application/json"})
	if code != 422 || !strings.Contains(body, "egress_rate_mbit") {
		t.Errorf("egress_rate_mbit -1: %d %s, want 422 naming it", code, body)
	}
	egress := []string{nettest.Mirror + ":" + nettest.HoldPort + "/tcp"}
	byNode := s.create(t, api.CreateSandboxRequest{Network: &api.NetworkSpec{Egress: egress}})
	slow := s.create(t, api.CreateSandboxRequest{Network: &api.NetworkSpec{Egress: egress, EgressRateMbit: 4}})
	fast := s.create(t, api.CreateSandboxRequest{Network: &api.NetworkSpec{Egress: egress, EgressRateMbit: api.MaxEgressRateMbit}})
	if got, _ := s.C.Get(ctx, slow.ID); got == nil || got.Network == nil || got.Network.EgressRateMbit != 4 {
		t.Errorf("sandbox view: %+v", got)
	}
	// MB megabytes to the mirror's sink, which closes when the upload ends.
	upload := func(id string, mb int) time.Duration {
		t.Helper()
		t0 := time.Now()
		r := s.sh(t, id, fmt.Sprintf("head -c %d000000 /dev/zero | nc %s %s", mb, nettest.Mirror, nettest.HoldPort))
		d := time.Since(t0)
		if r.ExitCode != 0 || r.Stdout != "hello" {
			t.Fatalf("upload from %s: exit %d %q %q", id, r.ExitCode, r.Stdout, r.Stderr)
		}
		return d
	}
	dSlow, dNode, dFast := upload(slow.ID, 2), upload(byNode.ID, 6), upload(fast.ID, 6)
	t.Logf("2 MB at 4 Mbit/s %v; 6 MB at the node's 16 Mbit/s %v, unlimited %v", dSlow, dNode, dFast)
	// The kernel's bucket starts full: a second of the rate (and a tenth)
	// passes at once. 2 MB at 4 Mbit/s: 0.55 MB at once, the rest in 2.9 s;
	// 6 MB at 16 Mbit/s: 2.2 MB at once, the rest in 1.9 s.
	if dSlow < 2500*time.Millisecond {
		t.Errorf("2 MB at 4 Mbit/s took %v, want at least 2.5 s", dSlow)
	}
	if dNode < 1500*time.Millisecond {
		t.Errorf("6 MB at the node's 16 Mbit/s took %v, want at least 1.5 s", dNode)
	}
	if dFast > dNode/2 {
		t.Errorf("6 MB without a real limit took %v, at 16 Mbit/s %v: no difference", dFast, dNode)
	}
	for _, id := range []string{slow.ID, byNode.ID} {
		if n, err := s.C.Network(ctx, id); err != nil || n.DeniedBy["rate-limit"] == 0 {
			t.Errorf("rate-limit drops of %s not counted: %+v %v", id, n, err)
		}
	}
	// A change of the list keeps the rate.
	if _, err := s.C.SetNetwork(ctx, slow.ID, egress); err != nil {
		t.Fatal(err)
	}
	if d := upload(slow.ID, 2); d < 2500*time.Millisecond {
		t.Errorf("after a change of the list, 2 MB at 4 Mbit/s took %v", d)
	}
	for _, id := range []string{slow.ID, byNode.ID, fast.ID} {
		if _, err := s.C.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	s.stop()
	assertNoLeaks(t, s)
}
