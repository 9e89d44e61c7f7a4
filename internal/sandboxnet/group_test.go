package sandboxnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
)

// TestGroup: members of one group reach each other both ways; a sandbox of
// no group and one of another group reach neither and are reached by
// neither (refused as DenySandbox); a member's address leaves the group's
// set with it, also when it went in a crash (the sweep of a restarted
// manager), and the last member takes the set.
func TestGroup(t *testing.T) {
	needRoot(t)
	m := newManager(t, "10.213.136.0/24")
	pid := map[string]int{}
	addr := map[string]netip.Addr{}
	for _, n := range []struct{ name, group string }{{"a", "p\x00g"}, {"b", "p\x00g"}, {"c", ""}, {"d", "q\x00g"}} {
		id := fmt.Sprintf("sb-grp-%s%d", n.name, os.Getpid())
		pid[n.name] = nettest.NSProc(t)
		at, err := m.AttachWith(id, pid[n.name], nil, AttachOptions{Group: n.group})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Detach(id) })
		addr[n.name] = at.Address
		nettest.InNS(t, pid[n.name], func() {
			ln, err := net.Listen("tcp4", at.Address.String()+":7000")
			if err != nil {
				t.Error(err)
				return
			}
			t.Cleanup(func() { ln.Close() })
			go nettest.Serve(ln)
		})
	}
	dial := func(from, to string) error { return nettest.Dial(t, pid[from], addr[to].String()+":7000") }
	for _, p := range [][2]string{{"a", "b"}, {"b", "a"}} {
		if err := dial(p[0], p[1]); err != nil {
			t.Errorf("member %s -> member %s: %v", p[0], p[1], err)
		}
	}
	for _, p := range [][2]string{{"a", "c"}, {"c", "a"}, {"a", "d"}, {"d", "a"}, {"d", "b"}} {
		if err := dial(p[0], p[1]); !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("%s -> %s: %v, want ECONNREFUSED", p[0], p[1], err)
		}
	}
	if d, _ := m.Denied(fmt.Sprintf("sb-grp-c%d", os.Getpid())); d[DenySandbox] != 1 {
		t.Errorf("c's refusals: %v, want 1 sandbox", d)
	}
	members := func() map[string][]netip.Addr {
		g, err := m.groupSets()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	if g := members(); len(g) != 2 || len(g[groupSet("p\x00g")]) != 2 || len(g[groupSet("q\x00g")]) != 1 {
		t.Fatalf("group sets: %v", g)
	}
	// d leaves: its group's set goes with it.
	if err := m.Detach(fmt.Sprintf("sb-grp-d%d", os.Getpid())); err != nil {
		t.Fatal(err)
	}
	if g := members(); len(g) != 1 {
		t.Errorf("after the last member of q left: %v", g)
	}
	// b goes in a crash: its link is gone, its chains and membership stay
	// until a restarted manager sweeps them.
	bID := fmt.Sprintf("sb-grp-b%d", os.Getpid())
	if l, err := netlink.LinkByName(m.LinkName(bID)); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			t.Fatal(err)
		}
	}
	m2, err := New("10.213.136.0/24", t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Sweep(func(id string) bool { return id != bID }); err != nil {
		t.Fatal(err)
	}
	if g := members()[groupSet("p\x00g")]; len(g) != 1 || g[0] != addr["a"] {
		t.Errorf("after the sweep, group p/g holds %v, want [%s]", g, addr["a"])
	}
	if err := dial("a", "c"); !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("a -> c after the sweep: %v", err)
	}
	// The restarted manager knows a's group: a's list changes keep it.
	if err := m2.SetEgress(fmt.Sprintf("sb-grp-a%d", os.Getpid()), nil); err != nil {
		t.Fatal(err)
	}
	if err := m2.Detach(fmt.Sprintf("sb-grp-a%d", os.Getpid())); err != nil {
		t.Fatal(err)
	}
	if g := members(); len(g) != 0 {
		t.Errorf("after the last member of p left: %v", g)
	}
}

// TestGroupOldTable: an edge that finds the table of an earlier edge (made
// before groups, without forward-in's rule between links) adds the rule,
// and its grouped sandboxes reach each other.
func TestGroupOldTable(t *testing.T) {
	needRoot(t)
	m := newManager(t, "10.213.138.0/24")
	old := fmt.Sprintf("sb-old-%d", os.Getpid())
	if _, err := m.Attach(old, nettest.NSProc(t), nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(old) })
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	into := &nftables.Chain{Name: chainInbound, Table: m.table()}
	rules, err := c.GetRules(m.table(), into)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if string(r.UserData) == tagBetweenLinks {
			if err := c.DelRule(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	m2, err := New("10.213.138.0/24", t.Name())
	if err != nil {
		t.Fatal(err)
	}
	pid, addr := map[string]int{}, map[string]netip.Addr{}
	for _, n := range []string{"a", "b"} {
		id := fmt.Sprintf("sb-old-%s%d", n, os.Getpid())
		pid[n] = nettest.NSProc(t)
		at, err := m2.AttachWith(id, pid[n], nil, AttachOptions{Group: "p\x00g"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m2.Detach(id) })
		addr[n] = at.Address
	}
	nettest.InNS(t, pid["b"], func() {
		ln, err := net.Listen("tcp4", addr["b"].String()+":7000")
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { ln.Close() })
		go nettest.Serve(ln)
	})
	if err := nettest.Dial(t, pid["a"], addr["b"].String()+":7000"); err != nil {
		t.Errorf("members behind an earlier edge's table: %v", err)
	}
}
