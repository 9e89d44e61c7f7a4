package sandboxnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
)

// conntrackOf counts the host's connection tracking entries to or from
// addr.
func conntrackOf(t *testing.T, addr netip.Addr) int {
	t.Helper()
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	ip := net.IP(addr.AsSlice())
	for _, f := range flows {
		if f.Forward.SrcIP.Equal(ip) || f.Forward.DstIP.Equal(ip) {
			n++
		}
	}
	return n
}

// neighbours counts the neighbour entries of link in pid's namespace (0:
// the host's).
func neighbours(t *testing.T, pid int, link string) int {
	t.Helper()
	n := -1
	count := func() {
		l, err := netlink.LinkByName(link)
		if err != nil {
			t.Error(err)
			return
		}
		ns, err := netlink.NeighList(l.Attrs().Index, netlink.FAMILY_ALL)
		if err != nil {
			t.Error(err)
			return
		}
		n = len(ns)
	}
	if pid == 0 {
		count()
	} else {
		nettest.InNS(t, pid, count)
	}
	return n
}

// TestParkReassign: a parked network (a recycled container's) keeps its
// link and address but nothing of its sandbox: no chains, counters,
// refusal record, group membership, connection tracking or neighbour
// entries; reassigned, it obeys the next sandbox's list alone.
func TestParkReassign(t *testing.T) {
	needRoot(t)
	nettest.FakeInternet(t)
	m := newManager(t, "10.213.136.0/24")
	pid := nettest.NSProc(t)
	id := fmt.Sprintf("sb-test-p%d", os.Getpid())
	a, err := m.AttachWith(id, pid, mustParse(t, nettest.Mirror+":443/tcp"), AttachOptions{Group: "p\x00g"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(id) })
	if err := nettest.Dial(t, pid, nettest.Mirror+":443"); err != nil {
		t.Fatalf("allowed before: %v", err)
	}
	if err := nettest.Dial(t, pid, nettest.Elsewhere+":443"); !errors.Is(err, unix.ECONNREFUSED) {
		t.Fatalf("refused before: %v", err)
	}
	if conntrackOf(t, a.Address) == 0 || neighbours(t, 0, a.Link) == 0 || neighbours(t, pid, SandboxLink) == 0 {
		t.Fatalf("before parking: conntrack %d, host neighbours %d, sandbox neighbours %d: the test sees nothing to clear",
			conntrackOf(t, a.Address), neighbours(t, 0, a.Link), neighbours(t, pid, SandboxLink))
	}

	nettest.InNS(t, pid, func() {
		if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + SandboxLink + "/disable_ipv6"); err == nil && string(b) != "1\n" {
			t.Errorf("IPv6 on the sandbox's end: disable_ipv6 %q", b)
		}
	})

	if err := m.Park(id, pid); err != nil {
		t.Fatal(err)
	}
	if n := conntrackOf(t, a.Address); n != 0 {
		t.Errorf("parked: %d connection tracking entries of %s left", n, a.Address)
	}
	if h, s := neighbours(t, 0, a.Link), neighbours(t, pid, SandboxLink); h != 0 || s != 0 {
		t.Errorf("parked: neighbour entries left: host end %d, sandbox end %d", h, s)
	}
	if d, err := m.Denied(id); err != nil || len(d) != 0 {
		t.Errorf("parked: counts %v %v", d, err)
	}
	if dd, err := m.DeniedDestinations(id); err != nil || len(dd) != 0 {
		t.Errorf("parked: refusal record %v %v", dd, err)
	}
	if err := nettest.Dial(t, pid, nettest.Mirror+":443"); err == nil {
		t.Error("parked: the previous list's destination reachable")
	}
	if g, err := m.groupSets(); err != nil || len(g) != 0 {
		t.Errorf("parked: group sets %v %v", g, err)
	}
	if !m.Attached(id) {
		t.Fatal("parked: the link is gone")
	}

	b, err := m.Reassign(id, mustParse(t, nettest.Mirror+":80/tcp"), AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b.Address != a.Address || b.Link != a.Link {
		t.Errorf("reassigned: %+v, was %+v", b, a)
	}
	if err := nettest.Dial(t, pid, nettest.Mirror+":80"); err != nil {
		t.Errorf("reassigned: its list's destination: %v", err)
	}
	if err := nettest.Dial(t, pid, nettest.Mirror+":443"); !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("reassigned: the previous list's destination: %v, want refused", err)
	}
	d, err := m.Denied(id)
	var sum int64
	for _, n := range d {
		sum += n
	}
	if err != nil || d[DenyNotAllowed] != 1 || sum != 1 {
		t.Errorf("reassigned: counts %v %v, want only its own refusal", d, err)
	}
	dd, err := m.DeniedDestinations(id)
	if err != nil || len(dd) != 1 || dd[0].Destination != nettest.Mirror+":443" {
		t.Errorf("reassigned: refusal record %+v %v, want only %s:443", dd, err, nettest.Mirror)
	}
	if g, err := m.groupSets(); err != nil || len(g) != 0 {
		t.Errorf("reassigned without a group: group sets %v %v", g, err)
	}

	// Again, without a group: the rules stay parked until Reassign
	// replaces them.
	if err := m.Park(id, pid); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Reassign(id, mustParse(t, nettest.Mirror+":443/tcp"), AttachOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := nettest.Dial(t, pid, nettest.Mirror+":443"); err != nil {
		t.Errorf("third: its list's destination: %v", err)
	}
	if err := nettest.Dial(t, pid, nettest.Mirror+":80"); !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("third: the previous list's destination: %v, want refused", err)
	}
	if n := conntrackOf(t, a.Address); n == 0 {
		t.Error("third: no connection tracking entry after a connection")
	}
	d, err = m.Denied(id)
	sum = 0
	for _, n := range d {
		sum += n
	}
	if err != nil || sum != 1 {
		t.Errorf("third: counts %v %v, want only its own refusal", d, err)
	}
	if err := m.Park(id, pid); err != nil {
		t.Fatal(err)
	}
	if n := conntrackOf(t, a.Address); n != 0 {
		t.Errorf("parked again: %d connection tracking entries left", n)
	}
}
