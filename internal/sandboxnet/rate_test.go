package sandboxnet

import (
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"

	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
)

// sendFor writes to the fake internet's sink (HoldPort) from pid's
// namespace for a second and then d, through a small send buffer, and
// answers how many bytes the kernel took in d: the first second fills the
// buffer and spends the burst, so what it takes after is what left.
func sendFor(t *testing.T, pid int, d time.Duration) int64 {
	t.Helper()
	var n int64
	atStart := int64(-1)
	nettest.InNS(t, pid, func() {
		c, err := net.DialTimeout("tcp4", nettest.Mirror+":"+nettest.HoldPort, 3*time.Second)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		_ = c.(*net.TCPConn).SetWriteBuffer(64 << 10)
		b := make([]byte, 32<<10)
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Read(b[:5]); err != nil {
			t.Error(err)
			return
		}
		start := time.Now().Add(time.Second)
		_ = c.SetWriteDeadline(start.Add(d))
		for {
			if atStart < 0 && time.Now().After(start) {
				atStart = n
			}
			w, err := c.Write(b[:4<<10])
			n += int64(w)
			if err != nil {
				return
			}
		}
	})
	return n - atStart
}

// TestEgressRate: a sandbox with an egress rate sends about that much
// (here 8 Mbit/s: 1 MB/s), one beside it without a limit far more, and the
// drops are counted as rate-limit refusals.
func TestEgressRate(t *testing.T) {
	needRoot(t)
	nettest.FakeInternet(t)
	m := newManager(t, "10.213.137.0/24")
	slowPid, fastPid := nettest.NSProc(t), nettest.NSProc(t)
	slow, fast := fmt.Sprintf("sb-rate-s%d", os.Getpid()), fmt.Sprintf("sb-rate-f%d", os.Getpid())
	if _, err := m.AttachWith(slow, slowPid, mustParse(t, nettest.Mirror), AttachOptions{EgressRateMbit: 8}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(slow) })
	if _, err := m.AttachWith(fast, fastPid, mustParse(t, nettest.Mirror), AttachOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(fast) })
	const d = 3 * time.Second
	s, f := sendFor(t, slowPid, d), sendFor(t, fastPid, d)
	t.Logf("in %v: limited to 8 Mbit/s %d bytes (%.1f Mbit/s), unlimited %d bytes (%.1f Mbit/s)",
		d, s, float64(s)*8/d.Seconds()/1e6, f, float64(f)*8/d.Seconds()/1e6)
	// 1 MB/s for 3 s (headers count against the rate: payload is less),
	// and slack for a loaded machine's timing.
	if limit := int64(3e6 * 1.25); s > limit {
		t.Errorf("limited sandbox sent %d bytes in %v, at most %d allowed", s, d, limit)
	}
	if s < 3e6/3 {
		t.Errorf("limited sandbox sent only %d bytes in %v: the limit starves it", s, d)
	}
	if f < 3*s {
		t.Errorf("unlimited sandbox sent %d bytes, limited %d: no difference", f, s)
	}
	if got, _ := m.Denied(slow); got[DenyRateLimit] == 0 {
		t.Errorf("no rate-limit drops counted: %v", got)
	}
	if got, _ := m.Denied(fast); got[DenyRateLimit] != 0 {
		t.Errorf("unlimited sandbox has rate-limit drops: %v", got)
	}
}

// receiveFor downloads from the fake internet's source (SourcePort) in
// pid's namespace for a second and then d, through a small receive
// buffer, and answers how many bytes it read in d.
func receiveFor(t *testing.T, pid int, d time.Duration) int64 {
	t.Helper()
	var n int64
	atStart := int64(-1)
	nettest.InNS(t, pid, func() {
		dl := net.Dialer{Timeout: 3 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10) })
		}}
		c, err := dl.Dial("tcp4", nettest.Mirror+":"+nettest.SourcePort)
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		b := make([]byte, 32<<10)
		start := time.Now().Add(time.Second)
		_ = c.SetReadDeadline(start.Add(d))
		for {
			if atStart < 0 && time.Now().After(start) {
				atStart = n
			}
			r, err := c.Read(b)
			n += int64(r)
			if err != nil {
				return
			}
		}
	})
	return n - atStart
}

// TestIngressRate: a sandbox with an ingress rate receives about that
// much (8 Mbit/s: 1 MB/s), one beside it without a limit far more, and
// the drops are counted as ingress-rate-limit refusals.
func TestIngressRate(t *testing.T) {
	needRoot(t)
	nettest.FakeInternet(t)
	m := newManager(t, "10.213.139.0/24")
	slowPid, fastPid := nettest.NSProc(t), nettest.NSProc(t)
	slow, fast := fmt.Sprintf("sb-irate-s%d", os.Getpid()), fmt.Sprintf("sb-irate-f%d", os.Getpid())
	if _, err := m.AttachWith(slow, slowPid, mustParse(t, nettest.Mirror), AttachOptions{IngressRateMbit: 8}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(slow) })
	if _, err := m.AttachWith(fast, fastPid, mustParse(t, nettest.Mirror), AttachOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(fast) })
	const d = 3 * time.Second
	s, f := receiveFor(t, slowPid, d), receiveFor(t, fastPid, d)
	t.Logf("in %v: limited to 8 Mbit/s %d bytes (%.1f Mbit/s), unlimited %d bytes (%.1f Mbit/s)",
		d, s, float64(s)*8/d.Seconds()/1e6, f, float64(f)*8/d.Seconds()/1e6)
	if limit := int64(3e6 * 1.25); s > limit {
		t.Errorf("limited sandbox received %d bytes in %v, at most %d allowed", s, d, limit)
	}
	if s < 3e6/3 {
		t.Errorf("limited sandbox received only %d bytes in %v: the limit starves it", s, d)
	}
	if f < 3*s {
		t.Errorf("unlimited sandbox received %d bytes, limited %d: no difference", f, s)
	}
	if got, _ := m.Denied(slow); got[DenyIngressRate] == 0 {
		t.Errorf("no ingress-rate-limit drops counted: %v", got)
	}
	if got, _ := m.Denied(fast); got[DenyIngressRate] != 0 || got[DenyRateLimit] != 0 {
		t.Errorf("unlimited sandbox has rate-limit drops: %v", got)
	}
	// The list changes, the rate stays.
	if err := m.SetEgress(slow, mustParse(t, nettest.Mirror+":"+nettest.SourcePort+"/tcp")); err != nil {
		t.Fatal(err)
	}
	if s := receiveFor(t, slowPid, d); s > int64(3e6*1.25) {
		t.Errorf("after a change of the list, the limited sandbox received %d bytes in %v", s, d)
	}
}

// TestIngressOldTable: an edge that finds the table of an earlier edge
// (made before ingress rates: no in_by_link, no i_<id> chains) adds the
// map and its rule; the old sandbox's counts still read and it detaches
// without leftovers, and a new one's ingress rate holds.
func TestIngressOldTable(t *testing.T) {
	needRoot(t)
	nettest.FakeInternet(t)
	m := newManager(t, "10.213.140.0/24")
	old := fmt.Sprintf("sb-iold-%d", os.Getpid())
	a, err := m.Attach(old, nettest.NSProc(t), mustParse(t, nettest.Mirror))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(old) })
	// Make it an earlier edge's table: the rule, the map, the chain gone.
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tb := m.table()
	rules, err := c.GetRules(tb, &nftables.Chain{Name: chainInbound, Table: tb})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if string(r.UserData) == tagInByLink {
			if err := c.DelRule(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := c.SetDeleteElements(inMap(tb), []nftables.SetElement{{Key: ifname(a.Link)}}); err != nil {
		t.Fatal(err)
	}
	c.DelChain(&nftables.Chain{Name: inChain(old), Table: tb})
	c.DelSet(inMap(tb))
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	m2, err := New("10.213.140.0/24", t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m2.Denied(old); err != nil {
		t.Errorf("counts of an earlier edge's sandbox: %v", err)
	}
	id, pid := fmt.Sprintf("sb-inew-%d", os.Getpid()), nettest.NSProc(t)
	if _, err := m2.AttachWith(id, pid, mustParse(t, nettest.Mirror), AttachOptions{IngressRateMbit: 8}); err != nil {
		t.Fatalf("attach behind an earlier edge's table: %v", err)
	}
	t.Cleanup(func() { _ = m2.Detach(id) })
	if n := receiveFor(t, pid, 2*time.Second); n > int64(2e6*1.25) {
		t.Errorf("behind an earlier edge's table, 8 Mbit/s received %d bytes in 2 s", n)
	}
	if err := m2.Detach(old); err != nil {
		t.Errorf("detach an earlier edge's sandbox: %v", err)
	}
	if err := m2.Detach(id); err != nil {
		t.Errorf("detach: %v", err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if ch.Table.Name == tb.Name && strings.HasSuffix(ch.Name, fmt.Sprint(os.Getpid())) {
			t.Errorf("chain %s left", ch.Name)
		}
	}
}
