package sandboxnet

import (
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
)

// query asks the sandbox's resolver (its gateway's port 53) from inside
// its namespace.
func query(t *testing.T, pid int, gw, name string, qtype uint16, network string) (*dns.Msg, error) {
	var resp *dns.Msg
	var err error
	nettest.InNS(t, pid, func() {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		c := &dns.Client{Net: network, Timeout: 3 * time.Second}
		resp, _, err = c.Exchange(m, net.JoinHostPort(gw, "53"))
	})
	return resp, err
}

// TestResolver: the sandbox's resolver answers listed names (exact and
// wildcard, UDP and TCP) and admits their addresses for the listed port
// only; other names are NXDOMAIN and recorded; another sandbox gets
// nothing of it; a changed list takes away what the old names admitted.
func TestResolver(t *testing.T) {
	needRoot(t)
	nettest.FakeInternet(t)
	m := newManager(t, "10.213.131.0/24")
	m.Upstream = nettest.DNS
	pid, otherPid := nettest.NSProc(t), nettest.NSProc(t)
	id, other := fmt.Sprintf("sb-test-d%d", os.Getpid()), fmt.Sprintf("sb-test-e%d", os.Getpid())
	a, err := m.Attach(id, pid, mustParse(t, nettest.MirrorName+":443/tcp", "*.mirror.test:80"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(id) })
	b, err := m.Attach(other, otherPid, mustParse(t, nettest.Elsewhere+":443"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(other) })
	gw := a.Gateway.String()

	if err := nettest.Dial(t, pid, nettest.Mirror+":443"); err == nil {
		t.Errorf("the mirror's address reachable before its name was resolved")
	}
	for _, network := range []string{"udp", "tcp"} {
		resp, err := query(t, pid, gw, nettest.MirrorName, dns.TypeA, network)
		if err != nil || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 1 || resp.Answer[0].(*dns.A).A.String() != nettest.Mirror {
			t.Fatalf("%s query for %s: %v %v", network, nettest.MirrorName, resp, err)
		}
	}
	if err := nettest.Dial(t, pid, nettest.Mirror+":443"); err != nil {
		t.Errorf("resolved address on the listed port: %v", err)
	}
	if err := nettest.Dial(t, pid, nettest.Mirror+":80"); err == nil {
		t.Errorf("resolved address on an unlisted port reachable")
	}
	// The wildcard admits port 80 of what its names resolve to.
	if resp, err := query(t, pid, gw, nettest.FilesName, dns.TypeA, "udp"); err != nil || resp.Rcode != dns.RcodeSuccess {
		t.Fatalf("wildcard name: %v %v", resp, err)
	}
	if err := nettest.Dial(t, pid, nettest.Mirror+":80"); err != nil {
		t.Errorf("wildcard name's address on its port: %v", err)
	}
	if resp, err := query(t, pid, gw, nettest.MirrorName, dns.TypeAAAA, "udp"); err != nil || resp.Rcode != dns.RcodeSuccess || len(resp.Answer) != 0 {
		t.Errorf("AAAA of an allowed name: %v %v, want an empty answer", resp, err)
	}
	for _, name := range []string{nettest.ElsewhereName, "mirror.test.evil", "xmirror.test"} {
		if resp, err := query(t, pid, gw, name, dns.TypeA, "udp"); err != nil || resp.Rcode != dns.RcodeNameError {
			t.Errorf("unlisted %s: %v %v, want NXDOMAIN", name, resp, err)
		}
	}
	if d, n := m.DNSDenials(id); n != 3 || len(d) != 3 || d[0].Name != nettest.ElsewhereName || d[0].Time.IsZero() {
		t.Errorf("refused names recorded: %d %+v", n, d)
	}
	if by, err := m.Denied(id); err != nil || by[DenyDNS] != 3 {
		t.Errorf("denied by reason: %v %v", by, err)
	}
	// The other sandbox: its own list, nothing of the first's.
	if err := nettest.Dial(t, otherPid, nettest.Mirror+":443"); err == nil {
		t.Errorf("another sandbox reaches what the first resolved")
	}
	if resp, err := query(t, otherPid, b.Gateway.String(), nettest.MirrorName, dns.TypeA, "udp"); err != nil || resp.Rcode != dns.RcodeNameError {
		t.Errorf("another sandbox resolves an unlisted name: %v %v", resp, err)
	}
	// A new list without the names: what they admitted goes.
	if err := m.SetEgress(id, mustParse(t, nettest.Elsewhere+":443")); err != nil {
		t.Fatal(err)
	}
	if err := nettest.Dial(t, pid, nettest.Mirror+":443"); err == nil {
		t.Errorf("admitted address reachable after its name was taken off")
	}
	if resp, err := query(t, pid, gw, nettest.MirrorName, dns.TypeA, "udp"); err != nil || resp.Rcode != dns.RcodeNameError {
		t.Errorf("a name taken off still answered: %v %v", resp, err)
	}
	// A flood of queries: past the budget, REFUSED and counted; the
	// other sandbox is answered meanwhile.
	refused := 0
	m.mu.Lock()
	m.DNSRate, m.DNSBurst = 10, 20 // a small budget: a sequential flood goes over it
	m.mu.Unlock()
	nettest.InNS(t, pid, func() {
		c := &dns.Client{Net: "udp", Timeout: time.Second}
		for i := 0; i < 60; i++ {
			m := new(dns.Msg)
			m.SetQuestion(dns.Fqdn(nettest.Mirror), dns.TypeA)
			if resp, _, err := c.Exchange(m, net.JoinHostPort(gw, "53")); err == nil && resp.Rcode == dns.RcodeRefused {
				refused++
			}
		}
	})
	if refused == 0 || m.DNSLimited(id) != int64(refused) {
		t.Errorf("a flood of 60 queries: %d refused, %d counted", refused, m.DNSLimited(id))
	}
	if resp, err := query(t, otherPid, b.Gateway.String(), nettest.ElsewhereName, dns.TypeA, "udp"); err != nil || resp.Rcode != dns.RcodeNameError {
		t.Errorf("the other sandbox during the flood: %v %v", resp, err)
	}
	m.mu.Lock()
	m.DNSRate, m.DNSBurst = 1e6, 1e6
	m.mu.Unlock()
	// "internet": names resolve, private addresses stay closed.
	if err := m.SetEgress(id, []api.EgressRule{{Internet: true}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := query(t, pid, gw, nettest.ElsewhereName, dns.TypeA, "udp"); err != nil || resp.Rcode != dns.RcodeSuccess {
		t.Errorf("internet: name not answered: %v %v", resp, err)
	}
	if err := nettest.Dial(t, pid, nettest.Elsewhere+":443"); err == nil {
		t.Errorf("internet reaches a private address")
	}
	if by, err := m.Denied(id); err != nil || by[DenyPrivate] == 0 {
		t.Errorf("internet's refusal of a private address: %v %v", by, err)
	}
}

func TestParseEgressNames(t *testing.T) {
	for in, want := range map[string]api.EgressRule{
		"github.com:443":             {Host: "github.com", Port: 443},
		"*.PythonHosted.org:443/tcp": {Host: "*.pythonhosted.org", Port: 443, Proto: "tcp"},
		"pypi":                       {Rule: "pypi"},
		"internet":                   {Internet: true},
	} {
		r, err := api.ParseEgress(in)
		if err != nil || r != want {
			t.Errorf("%s: %+v %v, want %+v", in, r, err, want)
		}
	}
	for _, bad := range []string{"a..b", "-x.com", "*.*.x.com", "x.com:0", "Pypi", "x.1", "*.com.", "pypi:443"} {
		if r, err := api.ParseEgress(bad); err == nil {
			t.Errorf("%q accepted: %+v", bad, r)
		}
	}
	for pattern, names := range map[string][2][]string{
		"*.mirror.test": {{"a.mirror.test", "a.b.mirror.test"}, {"mirror.test", "xmirror.test", "mirror.test.evil"}},
		"mirror.test":   {{"mirror.test"}, {"a.mirror.test"}},
	} {
		for _, n := range names[0] {
			if !api.MatchHost(pattern, n) {
				t.Errorf("%s does not match %s", pattern, n)
			}
		}
		for _, n := range names[1] {
			if api.MatchHost(pattern, n) {
				t.Errorf("%s matches %s", pattern, n)
			}
		}
	}
}
