package e2e

import (
	"fmt"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
)

// TestNetworkRecycledContainer: a networked sandbox's container, deleted,
// serves the next networked sandbox of its shape with its link and
// address kept and nothing else of its network: no rule of the previous
// list, no counts, refusals, refused names, connection tracking or
// neighbour entries; with its own list and resolver. A sandbox without a
// network never gets such a container.
func TestNetworkRecycledContainer(t *testing.T) {
	nettest.FakeInternet(t)
	pool := fmt.Sprintf("10.213.%d.0/24", 60+os.Getpid()%60)
	s := startServer(t, "--net-pool", pool, "--dns-upstream", nettest.DNS, "--recycle-idle", "20s")
	ctx := t.Context()
	shape := api.CreateSandboxRequest{CPU: 0.5, MemoryMB: 96}

	first := shape
	first.Network = &api.NetworkSpec{Egress: []string{nettest.Mirror + ":443/tcp"}, Group: "g"}
	a := s.create(t, first)
	// The mirror closes first: no socket of the sandbox is left in
	// TIME_WAIT, which would keep its container from being recycled
	// (TestRecycledContainer).
	if r := s.sh(t, a.ID, "sleep 1 | nc -w 5 "+nettest.Mirror+" 443"); r.Stdout != "hello" {
		t.Fatalf("first: allowed destination: %+v", r)
	}
	if r := s.sh(t, a.ID, "nc -w 5 "+nettest.Elsewhere+" 443 </dev/null; nslookup "+nettest.ElsewhereName+" 2>&1"); r.ExitCode == 0 {
		t.Fatalf("first: refused destination and name: %+v", r)
	}
	na, err := s.C.Network(ctx, a.ID)
	if err != nil || na.Denied < 2 {
		t.Fatalf("first: network %+v %v (want its refusals counted)", na, err)
	}
	addr := net.ParseIP(na.Address)
	if conntrackOf(t, addr) == 0 {
		t.Fatal("first: no connection tracking entry of its address: the test sees nothing to clear")
	}
	if _, err := s.C.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Kept == 1 && r.Waiting == 1 })

	// A sandbox without a network, of the same shape otherwise, does not
	// get it.
	plain := s.create(t, shape)
	if r := s.sh(t, plain.ID, "cat /proc/net/dev"); strings.Contains(r.Stdout, "eth0") {
		t.Errorf("a sandbox without network got a networked container:\n%s", r.Stdout)
	}
	if got := s.recycling(t, func(api.NodeRecycling) bool { return true }); got.Reused != 0 || got.Waiting != 1 {
		t.Errorf("after a create without network: %+v", got)
	}

	second := shape
	second.Network = &api.NetworkSpec{Egress: []string{nettest.Mirror + ":80/tcp"}}
	b := s.create(t, second)
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Reused == 1 && r.Waiting == 0 })
	nb, err := s.C.Network(ctx, b.ID)
	if err != nil {
		t.Fatal(err)
	}
	if nb.Address != na.Address || nb.Gateway != na.Gateway {
		t.Fatalf("second: %s via %s, want the recycled link's %s via %s", nb.Address, nb.Gateway, na.Address, na.Gateway)
	}
	if nb.Denied != 0 || len(nb.DeniedDestinations) != 0 {
		t.Errorf("second starts with the first's refusals: %+v", nb)
	}
	if d, err := s.C.NetworkDenials(ctx, b.ID); err != nil || len(d.Denials) != 0 {
		t.Errorf("second's denial log: %+v %v", d, err)
	}
	if n := conntrackOf(t, addr); n != 0 {
		t.Errorf("second starts with %d connection tracking entries of the first", n)
	}
	// Before it sent anything: no neighbour entry, its own resolver.
	if r := s.sh(t, b.ID, "tail -n +2 /proc/net/arp | wc -l; cat /etc/resolv.conf"); !strings.HasPrefix(r.Stdout, "0\n") ||
		!strings.Contains(r.Stdout, "nameserver "+nb.Gateway) {
		t.Errorf("second: neighbours and resolver: %+v", r)
	}
	if r := s.sh(t, b.ID, "nc -w 5 "+nettest.Mirror+" 80 </dev/null"); r.Stdout != "hello" {
		t.Errorf("second: its own list's destination: %+v", r)
	}
	if r := s.sh(t, b.ID, "nc -w 5 "+nettest.Mirror+" 443 </dev/null"); r.ExitCode == 0 || r.Stdout == "hello" {
		t.Errorf("second: the first's destination reachable: %+v", r)
	}
	nb, err = s.C.Network(ctx, b.ID)
	if err != nil || nb.Denied != 1 || nb.DeniedBy["not-allowed"] != 1 || len(nb.DeniedDestinations) != 1 ||
		nb.DeniedDestinations[0].Destination != nettest.Mirror+":443" {
		t.Errorf("second: counts its own refusal only: %+v %v", nb, err)
	}
	for _, id := range []string{b.ID, plain.ID} {
		if _, err := s.C.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	s.stop()
	assertNoLeaks(t, s)
}

// conntrackOf counts the host's connection tracking entries to or from
// addr.
func conntrackOf(t *testing.T, addr net.IP) int {
	t.Helper()
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range flows {
		if f.Forward.SrcIP.Equal(addr) || f.Forward.DstIP.Equal(addr) {
			n++
		}
	}
	return n
}

// onlyParked says whether the leftovers l of an edge's network (netLeaks)
// are at most its table and what containers kept for recycling hold: their
// links and their own chains and sets (no group set, which a parked
// network leaves at once).
func onlyParked(l []string) bool {
	for _, x := range l {
		switch {
		case strings.HasPrefix(x, "nftables table"), strings.HasPrefix(x, "link "), strings.HasPrefix(x, "nftables chains of "),
			strings.HasPrefix(x, "nftables set d_"), strings.HasPrefix(x, "nftables set n_"), strings.HasPrefix(x, "nftables set na_"):
		default:
			return false
		}
	}
	return true
}
