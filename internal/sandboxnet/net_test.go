package sandboxnet

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
)

func needRoot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root (veth pairs, nftables)")
	}
}

func TestEgressAllowlist(t *testing.T) {
	needRoot(t)
	nettest.FakeInternet(t)
	m := newManager(t, "10.213.128.0/24") // a corner of the pool of its own: tests run beside an edge
	sbPid, otherPid := nettest.NSProc(t), nettest.NSProc(t)
	id, other := fmt.Sprintf("sb-test-a%d", os.Getpid()), fmt.Sprintf("sb-test-b%d", os.Getpid())
	a, err := m.Attach(id, sbPid, mustParse(t, "10.1.2.0/24:443/tcp"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(id) })
	b, err := m.Attach(other, otherPid, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(other) })
	nettest.InNS(t, otherPid, func() {
		ln, err := net.Listen("tcp4", b.Address.String()+":443")
		if err != nil {
			t.Error(err)
			return
		}
		t.Cleanup(func() { ln.Close() })
		go nettest.Serve(ln)
	})
	// A host listener on every address.
	hl, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Close()
	go nettest.Serve(hl)
	hostPort := hl.Addr().(*net.TCPAddr).Port

	if err := nettest.Dial(t, sbPid, "10.1.2.3:443"); err != nil {
		t.Fatalf("allowed 10.1.2.3:443: %v", err)
	}
	denied := map[string]string{
		"10.1.2.3:80":               DenyNotAllowed,
		"10.9.9.9:443":              DenyNotAllowed,
		"169.254.169.254:80":        DenyMetadata,
		b.Address.String() + ":443": DenySandbox,
		a.Gateway.String() + fmt.Sprint(":", hostPort): DenyHost,
		fmt.Sprint("10.1.2.1:", hostPort):              DenyHost,
	}
	for addr, why := range denied {
		err := nettest.Dial(t, sbPid, addr)
		if err == nil {
			t.Errorf("%s (%s) reachable", addr, why)
			continue
		}
		if !errors.Is(err, unix.ECONNREFUSED) {
			t.Errorf("%s (%s): %v, want ECONNREFUSED (refused at once)", addr, why, err)
		}
	}
	got, err := m.Denied(id)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{DenyNotAllowed: 2, DenyMetadata: 1, DenySandbox: 1, DenyHost: 2}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("denied[%s] = %d, want %d (all %v)", k, got[k], v, got)
		}
	}

	dd, err := m.DeniedDestinations(id)
	if err != nil {
		t.Fatal(err)
	}
	gotDD := map[string]string{}
	for _, d := range dd {
		gotDD[d.Destination+"/"+d.Protocol] = fmt.Sprint(d.Reason, " ", d.Count)
	}
	for addr, why := range denied {
		if gotDD[addr+"/tcp"] != why+" 1" {
			t.Errorf("denied destination %s: %q, want %q (all %v)", addr, gotDD[addr+"/tcp"], why+" 1", dd)
		}
	}

	// A scan: every refused connect counts once (a reset is never
	// rate-limited, so none is retried).
	for i := 0; i < 50; i++ {
		if err := nettest.Dial(t, sbPid, fmt.Sprintf("10.9.9.9:%d", 1000+i)); !errors.Is(err, unix.ECONNREFUSED) {
			t.Fatalf("scan port %d: %v", 1000+i, err)
		}
	}
	if got2, _ := m.Denied(id); got2[DenyNotAllowed] != got[DenyNotAllowed]+50 {
		t.Errorf("after 50 refused connects denied[not-allowed] = %d, want %d", got2[DenyNotAllowed], got[DenyNotAllowed]+50)
	}

	// A forged source (here: a second address, which a sandbox's root
	// could not add, but could forge with a raw socket) is dropped.
	nettest.InNS(t, sbPid, func() {
		l, _ := netlink.LinkByName(SandboxLink)
		if err := netlink.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("10.1.2.77"), Mask: net.CIDRMask(32, 32)}}); err != nil {
			t.Error(err)
			return
		}
		d := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("10.1.2.77")}}
		if c, err := d.Dial("tcp4", nettest.Mirror+":443"); err == nil {
			c.Close()
			t.Error("a connection from a forged source went through")
		}
	})
	if got3, _ := m.Denied(id); got3[DenySpoofed] == 0 {
		t.Errorf("forged source not counted: %v", got3)
	}

	// Root inside the sandbox's namespace flushes every table it can see:
	// the policy lives in the host's namespace and holds.
	nettest.InNS(t, sbPid, func() {
		c, err := nftables.New()
		if err != nil {
			t.Error(err)
			return
		}
		ts, _ := c.ListTables()
		if len(ts) != 0 {
			t.Errorf("sandbox sees %d nftables tables", len(ts))
		}
		c.FlushRuleset()
		_ = c.Flush()
	})
	if err := nettest.Dial(t, sbPid, "10.9.9.9:443"); err == nil {
		t.Error("10.9.9.9:443 reachable after the sandbox flushed its ruleset")
	}
	// IPv6 is closed: the host end has none, and nothing answers from it.
	if b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + a.Link + "/disable_ipv6"); err == nil && strings.TrimSpace(string(b)) != "1" {
		t.Errorf("the host end %s has IPv6", a.Link)
	}
	nettest.InNS(t, sbPid, func() {
		if c, err := net.DialTimeout("tcp6", "[ff02::1%eth0]:80", time.Second); err == nil {
			c.Close()
			t.Error("an IPv6 connection from the sandbox went through")
		}
		if c, err := net.DialTimeout("tcp6", "[2001:db8::1]:443", time.Second); err == nil {
			c.Close()
			t.Error("an IPv6 connection from the sandbox went through")
		}
	})
	// Its interfaces: lo and eth0 only.
	nettest.InNS(t, sbPid, func() {
		ls, _ := netlink.LinkList()
		var names []string
		for _, l := range ls {
			names = append(names, l.Attrs().Name)
		}
		if strings.Join(names, ",") != "lo,eth0" {
			t.Errorf("sandbox links %v, want lo,eth0", names)
		}
	})

	for _, x := range []string{id, other} {
		if err := m.Detach(x); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	assertGone(t, m, id, other)
}

// newManager is a Manager of the test's own; when the test ends (after
// its sandboxes' cleanups) its table is removed, and none may be left.
func newManager(t *testing.T, pool string) *Manager {
	t.Helper()
	m, err := New(pool, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
		if l, err := Owned(t.Name()); err != nil || len(l) > 0 {
			t.Errorf("left on the host: %v %v", l, err)
		}
	})
	return m
}

func assertGone(t *testing.T, m *Manager, ids ...string) {
	t.Helper()
	tables, err := listTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if _, err := netlink.LinkByName(m.LinkName(id)); err == nil {
			t.Errorf("link %s of %s left", m.LinkName(id), id)
		}
		for _, tb := range tables {
			if tb == m.tableName() {
				t.Errorf("table %s left", tb)
			}
		}
	}
}

func TestSweepRemovesLeftovers(t *testing.T) {
	needRoot(t)
	m, err := New("10.213.129.0/24", t.Name())
	if err != nil {
		t.Fatal(err)
	}
	pid := nettest.NSProc(t)
	id := fmt.Sprintf("sb-test-c%d", os.Getpid())
	if _, err := m.Attach(id, pid, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(id) })
	// A new manager (an edge after kill -9) learns the address in use.
	m2, _ := New("10.213.129.0/24", t.Name())
	i, err := m2.alloc("sb-test-other")
	if err != nil || i == 0 {
		t.Errorf("a restarted manager reuses a live /31: index %d, %v", i, err)
	}
	_ = m2.release("sb-test-other")
	// Another edge on this host (another owner) leaves it alone.
	m3, _ := New("10.213.129.0/24", "another edge")
	if gone, err := m3.Sweep(func(string) bool { return false }); err != nil || len(gone) != 0 {
		t.Errorf("another owner swept %v (%v)", gone, err)
	}
	if i, err := m3.alloc("sb-x"); err != nil || i == 0 {
		t.Errorf("another owner takes a /31 in use on the host: index %d, %v", i, err)
	}
	gone, err := m2.Sweep(func(x string) bool { return x != id })
	if err != nil {
		t.Fatal(err)
	}
	if len(gone) != 1 || gone[0] != id {
		t.Errorf("swept %v, want [%s]", gone, id)
	}
	assertGone(t, m2, id)
}

func TestParseEgress(t *testing.T) {
	for in, want := range map[string]string{
		"10.1.2.0/24:443/tcp": "10.1.2.0/24:443/tcp",
		"10.1.2.9/24":         "10.1.2.0/24",
		"10.1.2.3":            "10.1.2.3/32",
		"10.1.2.3:53/udp":     "10.1.2.3/32:53/udp",
		"10.0.0.0/8:443":      "10.0.0.0/8:443",
	} {
		r, err := api.ParseEgress(in)
		if err != nil || r.String() != want {
			t.Errorf("%s: %v %v, want %s", in, r, err, want)
		}
	}
	for _, bad := range []string{"", "10.1.2.0/33", "10.1.2.3:0", "10.1.2.3:70000", "::1", "10.0.0.0/8/tcp", "x:1", "10.1.2.3:http"} {
		if _, err := api.ParseEgress(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func mustParse(t *testing.T, s ...string) []api.EgressRule {
	var out []api.EgressRule
	for _, e := range s {
		r, err := api.ParseEgress(e)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	return out
}

// benchRules is the benchmarks' egress list.
func benchRules() []api.EgressRule {
	var rules []api.EgressRule
	for _, e := range []string{"10.1.2.0/24:443/tcp", "10.9.0.0/16"} {
		r, _ := api.ParseEgress(e)
		rules = append(rules, r)
	}
	return rules
}

// BenchmarkAttachDetach is what a network adds to a sandbox's start and
// stop (veth pair, addresses, route, nftables table, and their removal).
func BenchmarkAttachDetach(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("SKIP: needs root")
	}
	m, err := New("10.213.130.0/24", b.Name())
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	rules := benchRules()
	pid := nettest.NSProc(b)
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("sb-bench-%d", i)
		if _, err := m.Attach(id, pid, rules); err != nil {
			b.Fatal(err)
		}
		if err := m.Detach(id); err != nil {
			b.Fatal(err)
		}
	}
}

// TestConnLimit: a sandbox's open connections are bounded by its own
// conntrack list; one past the limit is refused and counted, and closing
// one makes room.
func TestConnLimit(t *testing.T) {
	needRoot(t)
	nettest.FakeInternet(t)
	m := newManager(t, "10.213.132.0/24")
	m.MaxConns = 3
	pid := nettest.NSProc(t)
	id := fmt.Sprintf("sb-test-d%d", os.Getpid())
	if _, err := m.Attach(id, pid, mustParse(t, nettest.Mirror)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(id) })
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	dialHold := func() (net.Conn, error) {
		var c net.Conn
		var err error
		nettest.InNS(t, pid, func() {
			c, err = net.DialTimeout("tcp4", nettest.Mirror+":"+nettest.HoldPort, 3*time.Second)
			if err == nil {
				b := make([]byte, 5)
				_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
				if _, err = c.Read(b); err != nil {
					c.Close()
				}
			}
		})
		return c, err
	}
	for i := 0; i < 3; i++ {
		c, err := dialHold()
		if err != nil {
			t.Fatalf("connection %d of 3: %v", i+1, err)
		}
		conns = append(conns, c)
	}
	if c, err := dialHold(); err == nil {
		c.Close()
		t.Fatal("a 4th connection past a limit of 3 went through")
	}
	if d, _ := m.Denied(id); d[DenyConnLimit] == 0 {
		t.Errorf("conn-limit refusal not counted: %v", d)
	}
	conns[0].Close()
	conns = conns[1:]
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := dialHold()
		if err == nil {
			conns = append(conns, c)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("closing a connection made no room: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestConcurrentAttach: sandboxes started and stopped at once get distinct
// addresses, all work, and the last one out removes the edge's table.
func TestConcurrentAttach(t *testing.T) {
	needRoot(t)
	nettest.FakeInternet(t)
	m := newManager(t, "10.213.133.0/24")
	const n = 12
	pids := make([]int, n)
	for i := range pids {
		pids[i] = nettest.NSProc(t)
	}
	addrs := make([]string, n)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			a, err := m.Attach(fmt.Sprintf("sb-conc-%d", i), pids[i], mustParse(t, nettest.Mirror+":443/tcp"))
			if err != nil {
				errs <- err
				return
			}
			addrs[i] = a.Address.String()
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i, a := range addrs {
		if seen[a] {
			t.Errorf("address %s given twice", a)
		}
		seen[a] = true
		if err := nettest.Dial(t, pids[i], nettest.Mirror+":443"); err != nil {
			t.Errorf("sandbox %d: %v", i, err)
		}
	}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if err := m.Detach(fmt.Sprintf("sb-conc-%d", i)); err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("sb-conc-%d", i)
	}
	assertGone(t, m, ids...)
}

// TestSetEgress: replacing the list takes effect for new connections when
// it returns, cuts an open connection to a destination no longer listed,
// and keeps the counts.
func TestSetEgress(t *testing.T) {
	needRoot(t)
	nettest.FakeInternet(t)
	m := newManager(t, "10.213.134.0/24")
	pid := nettest.NSProc(t)
	id := fmt.Sprintf("sb-test-e%d", os.Getpid())
	if _, err := m.Attach(id, pid, mustParse(t, nettest.Mirror+":"+nettest.HoldPort+"/tcp")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(id) })
	var held net.Conn
	var err error
	nettest.InNS(t, pid, func() {
		held, err = net.DialTimeout("tcp4", nettest.Mirror+":"+nettest.HoldPort, 3*time.Second)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	b := make([]byte, 5)
	_ = held.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := held.Read(b); err != nil {
		t.Fatal(err)
	}
	if err := nettest.Dial(t, pid, nettest.Mirror+":443"); !errors.Is(err, unix.ECONNREFUSED) {
		t.Fatalf("443 before the change: %v", err)
	}
	if err := m.SetEgress(id, mustParse(t, nettest.Mirror+":443/tcp")); err != nil {
		t.Fatal(err)
	}
	if err := nettest.Dial(t, pid, nettest.Mirror+":443"); err != nil {
		t.Errorf("443 after the change: %v", err)
	}
	// The open connection's next packet is refused with a reset.
	_, _ = held.Write([]byte("more"))
	_ = held.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := held.Read(b); !errors.Is(err, unix.ECONNRESET) {
		t.Errorf("connection to a destination taken off the list: read %v, want ECONNRESET", err)
	}
	d, err := m.Denied(id)
	if err != nil || d[DenyNotAllowed] < 2 {
		t.Errorf("counts after the change: %v %v (want the refusal before it and the cut)", d, err)
	}
	if err := nettest.Dial(t, pid, nettest.Mirror+":"+nettest.HoldPort); !errors.Is(err, unix.ECONNREFUSED) {
		t.Errorf("%s after it was taken off: %v", nettest.HoldPort, err)
	}
}

// BenchmarkParkReassign is what a network adds to a recycled container's
// wipe and reuse (Park, then Reassign with a new list), with others
// sandboxes' chains in the table beside it: the kernel validates the
// table at each commit that adds rules.
func BenchmarkParkReassign(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("SKIP: needs root")
	}
	for _, others := range []int{0, 32, 96} {
		b.Run(fmt.Sprintf("others=%d", others), func(b *testing.B) {
			m, err := New("10.213.131.0/24", b.Name())
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			rules := benchRules()
			var ids []string
			defer func() {
				for _, id := range ids {
					_ = m.Detach(id)
				}
			}()
			for i := 0; i < others; i++ {
				id := fmt.Sprintf("sb-bench-o%d-%d", i, b.N)
				if _, err := m.Attach(id, nettest.NSProc(b), rules); err != nil {
					b.Fatal(err)
				}
				ids = append(ids, id)
			}
			pid := nettest.NSProc(b)
			id := fmt.Sprintf("sb-bench-r%d", b.N)
			if _, err := m.Attach(id, pid, rules); err != nil {
				b.Fatal(err)
			}
			ids = append(ids, id)
			b.ResetTimer()
			var park, reassign time.Duration
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if err := m.Park(id, pid); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if _, err := m.Reassign(id, rules, AttachOptions{}); err != nil {
					b.Fatal(err)
				}
				park, reassign = park+t1.Sub(t0), reassign+time.Since(t1)
			}
			b.StopTimer() // the deferred removal of the others is not the figure
			b.ReportMetric(float64(park.Microseconds())/float64(b.N), "park-µs/op")
			b.ReportMetric(float64(reassign.Microseconds())/float64(b.N), "reassign-µs/op")
		})
	}
}
