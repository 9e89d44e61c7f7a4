package sandboxnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
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

	// A fourth sandbox with the third's very policy: its rules stay (no
	// rule is written, so the kernel validates nothing), and what the
	// third left goes all the same: its counts and its refusal record.
	before := ruleHandles(t, m, outChain(id))
	if _, err := m.Reassign(id, mustParse(t, nettest.Mirror+":443/tcp"), AttachOptions{}); err != nil {
		t.Fatal(err)
	}
	if after := ruleHandles(t, m, outChain(id)); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("fourth, same policy: rules rewritten (handles %v, were %v)", after, before)
	}
	if d, err := m.Denied(id); err != nil || sumOf(d) != 0 {
		t.Errorf("fourth: counts %v %v, want none (the third's are not its)", d, err)
	}
	if dd, err := m.DeniedDestinations(id); err != nil || len(dd) != 0 {
		t.Errorf("fourth: refusal record %+v %v, want empty", dd, err)
	}
	if err := nettest.Dial(t, pid, nettest.Mirror+":443"); err != nil {
		t.Errorf("fourth: its list's destination: %v", err)
	}
	if err := nettest.Dial(t, pid, nettest.Mirror+":80"); !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("fourth: outside its list: %v, want refused", err)
	}
	if d, err := m.Denied(id); err != nil || d[DenyNotAllowed] != 1 || sumOf(d) != 1 {
		t.Errorf("fourth: counts %v %v, want its one refusal", d, err)
	}
	// A list change keeps its count (and only its).
	if err := m.SetEgress(id, mustParse(t, nettest.Mirror+":80/tcp")); err != nil {
		t.Fatal(err)
	}
	if err := nettest.Dial(t, pid, nettest.Mirror+":443"); !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("fourth, changed: %v, want refused", err)
	}
	if d, err := m.Denied(id); err != nil || d[DenyNotAllowed] != 2 || sumOf(d) != 2 {
		t.Errorf("fourth, changed: counts %v %v, want 2 refusals", d, err)
	}
	if err := m.Park(id, pid); err != nil {
		t.Fatal(err)
	}
}

func sumOf(d map[string]int64) (n int64) {
	for _, v := range d {
		n += v
	}
	return n
}

// exprsIn lists the expressions of type E in chain's rules.
func exprsIn[E expr.Any](t *testing.T, m *Manager, chain string) []E {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := c.GetRules(m.table(), &nftables.Chain{Name: chain, Table: m.table()})
	if err != nil {
		t.Fatal(err)
	}
	var out []E
	for _, r := range rules {
		for _, e := range r.Exprs {
			if x, ok := e.(E); ok {
				out = append(out, x)
			}
		}
	}
	return out
}

// ruleHandles lists the handles of chain's rules in m's table.
func ruleHandles(t *testing.T, m *Manager, chain string) []uint64 {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	rules, err := c.GetRules(m.table(), &nftables.Chain{Name: chain, Table: m.table()})
	if err != nil {
		t.Fatal(err)
	}
	var hs []uint64
	for _, r := range rules {
		hs = append(hs, r.Handle)
	}
	return hs
}

// TestReassignOptions: a reused network takes the new sandbox's
// connection limit and ingress rate (not the node's defaults), and its
// ingress chain holds that rate's one rule, not the previous sandbox's
// beside it.
func TestReassignOptions(t *testing.T) {
	needRoot(t)
	m := newManager(t, "10.213.141.0/24")
	pid := nettest.NSProc(t)
	id := fmt.Sprintf("sb-test-o%d", os.Getpid())
	if _, err := m.AttachWith(id, pid, mustParse(t, "10.1.2.0/24"), AttachOptions{MaxConns: 3, IngressRateMbit: 5}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(id) })
	check := func(when string, conns uint32, rateMbit int) {
		t.Helper()
		if got := exprsIn[*expr.Connlimit](t, m, allowedChain(id)); len(got) != 1 || got[0].Count != conns {
			t.Errorf("%s: connection limits %+v, want one of %d", when, got, conns)
		}
		if got := exprsIn[*expr.Limit](t, m, inChain(id)); len(got) != 1 || got[0].Rate != uint64(rateMbit)*1000*1000/8 {
			t.Errorf("%s: ingress limits %+v, want one of %d Mbit/s", when, got, rateMbit)
		}
	}
	check("attached", 3, 5)
	for i, opts := range []AttachOptions{{MaxConns: 3, IngressRateMbit: 5}, {MaxConns: 9, IngressRateMbit: 7}} {
		if err := m.Park(id, pid); err != nil {
			t.Fatal(err)
		}
		// Another list: the rules are written again.
		if _, err := m.Reassign(id, mustParse(t, fmt.Sprintf("10.1.%d.0/24", 3+i)), opts); err != nil {
			t.Fatal(err)
		}
		check(fmt.Sprintf("reused %d", i+1), uint32(opts.MaxConns), opts.IngressRateMbit)
	}
}

// TestSamePolicyReuseCounts: reuses with the policy the chains hold keep
// the rules, and each new sandbox counts from zero: after a sandbox that
// was refused, after one that sent nothing (its link quiet, the baseline
// kept without reading the counters), and after one that was refused
// again; and a restarted edge reads the same.
func TestSamePolicyReuseCounts(t *testing.T) {
	needRoot(t)
	nettest.FakeInternet(t)
	m := newManager(t, "10.213.142.0/24")
	pid := nettest.NSProc(t)
	id := fmt.Sprintf("sb-test-q%d", os.Getpid())
	list := mustParse(t, nettest.Mirror+":443/tcp")
	if _, err := m.Attach(id, pid, list); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(id) })
	refused := func(when string) {
		t.Helper()
		if err := nettest.Dial(t, pid, nettest.Elsewhere+":443"); !errors.Is(err, unix.ECONNREFUSED) {
			t.Fatalf("%s: %v, want refused", when, err)
		}
	}
	counts := func(when string, want int64) {
		t.Helper()
		if d, err := m.Denied(id); err != nil || sumOf(d) != want {
			t.Errorf("%s: counts %v %v, want %d in all", when, d, err, want)
		}
	}
	reuse := func() {
		t.Helper()
		if err := m.Park(id, pid); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Reassign(id, list, AttachOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	refused("first")
	counts("first", 1)
	reuse()
	counts("second, before anything", 0)
	reuse() // the second sent nothing
	counts("third, before anything", 0)
	refused("third")
	counts("third", 1)
	reuse()
	counts("fourth, before anything", 0)
	if err := nettest.Dial(t, pid, nettest.Mirror+":443"); err != nil {
		t.Errorf("fourth: its list's destination: %v", err)
	}
	refused("fourth")
	reuse()
	// The edge restarts: a new Manager over the same table sees none of
	// the fourth's counts (the reset is in the kernel, not in memory).
	m2, err := New("10.213.142.0/24", t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if d, err := m2.Denied(id); err != nil || sumOf(d) != 0 {
		t.Errorf("fifth, read by a restarted edge: counts %v %v, want none", d, err)
	}
}
