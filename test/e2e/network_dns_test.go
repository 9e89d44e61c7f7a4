package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
)

// TestNetworkDNS: a sandbox that lists a name resolves it through the
// node's resolver (forwarding to the fake internet's DNS server) and
// reaches its address on the listed port, and only after resolving it;
// an unlisted name is NXDOMAIN and recorded; another sandbox does not
// inherit what the first resolved.
func TestNetworkDNS(t *testing.T) {
	nettest.FakeInternet(t)
	pool := fmt.Sprintf("10.213.%d.0/24", 20+(os.Getpid()+7)%100)
	s := startServer(t, "--net-pool", pool, "--dns-upstream", nettest.DNS)

	sb := s.create(t, api.CreateSandboxRequest{Network: &api.NetworkSpec{Egress: []string{nettest.MirrorName + ":443", "*.nothing.test"}}})
	if sb.Network == nil || strings.Join(sb.Network.Egress, ",") != nettest.MirrorName+":443,*.nothing.test" {
		t.Errorf("created sandbox's network: %+v", sb.Network)
	}
	n, err := s.C.Network(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r := s.sh(t, sb.ID, "cat /etc/resolv.conf"); !strings.Contains(r.Stdout, "nameserver "+n.Gateway) {
		t.Errorf("resolv.conf: %q, want the gateway %s", r.Stdout, n.Gateway)
	}
	// The address alone, not resolved: refused.
	if r := s.sh(t, sb.ID, "nc -w 5 "+nettest.Mirror+" 443 </dev/null"); r.ExitCode == 0 || strings.Contains(r.Stdout, "hello") {
		t.Errorf("the mirror's address reachable before its name was resolved: %q", r.Stdout)
	}
	if r := s.sh(t, sb.ID, "nc -w 5 "+nettest.MirrorName+" 443 </dev/null"); r.ExitCode != 0 || r.Stdout != "hello" {
		t.Fatalf("allowed name %s:443: exit %d %q %q\n%s", nettest.MirrorName, r.ExitCode, r.Stdout, r.Stderr, tail(s.logs.String(), 20))
	}
	// Resolved, the address is allowed for the record's TTL, on the
	// listed port only.
	if r := s.sh(t, sb.ID, "nc -w 5 "+nettest.Mirror+" 443 </dev/null"); r.Stdout != "hello" {
		t.Errorf("the resolved address: %q %q", r.Stdout, r.Stderr)
	}
	if r := s.sh(t, sb.ID, "nc -w 5 "+nettest.MirrorName+" 80 </dev/null"); r.ExitCode == 0 || strings.Contains(r.Stdout, "hello") {
		t.Errorf("an unlisted port of an allowed name reachable: %q", r.Stdout)
	}
	// Other names: NXDOMAIN, recorded, nothing admitted.
	for _, name := range []string{nettest.ElsewhereName, nettest.FilesName, "nothing.test"} {
		r := s.sh(t, sb.ID, "nslookup "+name)
		if r.ExitCode == 0 || !strings.Contains(r.Stdout+r.Stderr, "NXDOMAIN") {
			t.Errorf("unlisted %s: exit %d %q %q, want NXDOMAIN", name, r.ExitCode, r.Stdout, r.Stderr)
		}
	}
	if r := s.sh(t, sb.ID, "nc -w 5 "+nettest.Elsewhere+" 443 </dev/null"); r.ExitCode == 0 {
		t.Errorf("an unlisted name's address reachable: %q", r.Stdout)
	}
	n, err = s.C.Network(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if n.DeniedBy["dns"] < 3 {
		t.Errorf("refused names counted %d, want >= 3: %+v", n.DeniedBy["dns"], n.DeniedBy)
	}
	names := map[string]bool{}
	for _, d := range n.DeniedDestinations {
		if d.Protocol == "dns" && d.Reason == "dns" {
			names[d.Destination] = true
		}
	}
	for _, name := range []string{nettest.ElsewhereName, nettest.FilesName, "nothing.test"} {
		if !names[name] {
			t.Errorf("refused name %s not recorded: %+v", name, n.DeniedDestinations)
		}
	}

	// The log: each refused name with its time, and the refused packets.
	dl, err := s.C.NetworkDenials(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	logged := map[string]bool{}
	for _, d := range dl.Denials {
		if d.Time.IsZero() || d.Count < 1 {
			t.Errorf("denial without time or count: %+v", d)
		}
		logged[d.Protocol+" "+d.Destination+" "+d.Reason] = true
	}
	for _, want := range []string{"dns " + nettest.ElsewhereName + " dns", "dns nothing.test dns",
		"tcp " + nettest.Mirror + ":443 not-allowed", "tcp " + nettest.Elsewhere + ":443 not-allowed"} {
		if !logged[want] {
			t.Errorf("denial log lacks %q: %+v", want, dl.Denials)
		}
	}
	// The same refusals are in the sandbox's audit (kind denied).
	auditUntil(t, s.C, sb.ID, "the refusals", func(recs []api.AuditRecord) bool {
		got := map[string]bool{}
		for _, r := range recs {
			if r.Kind == api.AuditKindDenied {
				got[r.Op+" "+r.Dest+" "+r.Reason] = true
			}
		}
		return got["dns nothing.test dns"] && got["tcp "+nettest.Elsewhere+":443 not-allowed"]
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs, err := s.C.Events(t.Context(), 0, 1000, 0)
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, ev := range evs.Events {
			found = found || (ev.Type == api.EventSandboxNetworkDenied && ev.Sandbox == sb.ID)
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("no %s event for %s: %+v", api.EventSandboxNetworkDenied, sb.ID, evs.Events)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The metric, from the node's heartbeat.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, body := s.rawRequest(t, "GET", "/metrics", "", nil, nil)
		if strings.Contains(body, `warren_network_denied_total{node=`) && strings.Contains(body, `reason="dns"}`) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("no warren_network_denied_total for refused names on /metrics")
			break
		}
	}

	// Another sandbox, the mirror's address listed by name nowhere: what
	// the first resolved is not its.
	other := s.create(t, api.CreateSandboxRequest{Network: &api.NetworkSpec{Egress: []string{nettest.Elsewhere + ":443"}}})
	if r := s.sh(t, other.ID, "nc -w 5 "+nettest.Mirror+" 443 </dev/null"); r.ExitCode == 0 || strings.Contains(r.Stdout, "hello") {
		t.Errorf("another sandbox reaches what the first resolved: %q", r.Stdout)
	}
	if r := s.sh(t, other.ID, "nslookup "+nettest.MirrorName); r.ExitCode == 0 {
		t.Errorf("another sandbox resolves an unlisted name: %q", r.Stdout)
	}
	// Taking the name off the list cuts what it admitted.
	if _, err := s.C.SetNetwork(t.Context(), sb.ID, []string{nettest.Elsewhere + ":443"}); err != nil {
		t.Fatal(err)
	}
	if r := s.sh(t, sb.ID, "nc -w 5 "+nettest.Mirror+" 443 </dev/null"); r.ExitCode == 0 || strings.Contains(r.Stdout, "hello") {
		t.Errorf("the address admitted for a name no longer listed still reachable: %q", r.Stdout)
	}
	for _, id := range []string{sb.ID, other.ID} {
		if _, err := s.C.Delete(t.Context(), id); err != nil {
			t.Fatal(err)
		}
	}
	s.stop()
	assertNoLeaks(t, s)
}
