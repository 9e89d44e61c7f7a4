package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
)

// TestNetworkPortScan: a networked sandbox scans ports 1..1000 of an
// address its list does not allow, round after round for a few seconds
// and at least ten rounds (10,000 SYNs).
// Every connect is refused at once (none hangs), every one is counted
// (GET …/network's counters and destinations, the bounded denial log, the
// node's metric), a neighbour's round trips to the mirror stay within
// noise meanwhile, and the scanner's entries in the host's connection
// tracking stay within its limit (--net-max-conns), also when it opens
// more connections than that to an allowed destination.
func TestNetworkPortScan(t *testing.T) {
	const (
		ports    = 1000
		maxConns = 64
	)
	nettest.FakeInternet(t)
	pool := fmt.Sprintf("10.213.%d.0/24", 230+os.Getpid()%20)
	s := startServer(t, "--net-pool", pool, "--net-max-conns", strconv.Itoa(maxConns))
	ctx := context.Background()
	hold := nettest.Mirror + ":" + nettest.HoldPort
	mirror := nettest.Mirror + ":80"
	scanner := s.create(t, api.CreateSandboxRequest{Network: &api.NetworkSpec{Egress: []string{hold + "/tcp"}}})
	neighbour := s.create(t, api.CreateSandboxRequest{Network: &api.NetworkSpec{Egress: []string{mirror + "/tcp"}}})
	probe, err := os.ReadFile(bins.probe)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{scanner.ID, neighbour.ID} {
		if _, err := s.C.WriteFileBytes(ctx, id, "/probe", probe, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sn, err := s.C.Network(ctx, scanner.ID)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.ParseIP(sn.Address)
	tracked := func() int { // the scanner's entries in the host's conntrack
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
		if err != nil {
			t.Fatalf("conntrack: %v", err)
		}
		n := 0
		for _, f := range flows {
			if f.Forward.SrcIP.Equal(addr) {
				n++
			}
		}
		return n
	}
	rtt := func() (p50 time.Duration, out string) {
		t.Helper()
		r := s.sh(t, neighbour.ID, "/probe rtt "+mirror+" 2")
		var n, failed, p50us, p99us int
		if _, err := fmt.Sscanf(r.Stdout, "n %d failed %d p50 %d p99 %d", &n, &failed, &p50us, &p99us); err != nil || n < 20 || failed > 0 {
			t.Fatalf("neighbour's round trips: %q %q (%v)", r.Stdout, r.Stderr, err)
		}
		return time.Duration(p50us) * time.Microsecond, strings.TrimSpace(r.Stdout)
	}
	before, beforeOut := rtt()

	if _, err := s.C.Exec(ctx, scanner.ID, api.ExecRequest{Background: true,
		Cmd: fmt.Sprintf("/probe scan %s %d 4 > /tmp/scan.part 2>&1; mv /tmp/scan.part /tmp/scan", nettest.Elsewhere, ports)}); err != nil {
		t.Fatal(err)
	}
	during, duringOut := rtt()
	duringTracked := tracked()
	var scan string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if r := s.sh(t, scanner.ID, "cat /tmp/scan 2>/dev/null"); r.ExitCode == 0 {
			scan = strings.TrimSpace(r.Stdout)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the scan did not end in 60 s: %q", s.sh(t, scanner.ID, "cat /tmp/scan.part").Stdout)
		}
	}
	t.Logf("scan: %s; neighbour before: %s; during: %s; scanner's conntrack entries during: %d", scan, beforeOut, duringOut, duringTracked)
	var rounds, refused, open, timeout, other int
	var roundMax string
	if _, err := fmt.Sscanf(scan, "rounds %d refused %d open %d timeout %d other %d round-max %s",
		&rounds, &refused, &open, &timeout, &other, &roundMax); err != nil {
		t.Fatalf("scan output %q: %v", scan, err)
	}
	attempts := int64(rounds * ports)
	if attempts < 10000 {
		t.Errorf("the scan made %d connects, want at least 10,000", attempts)
	}
	if refused != rounds*ports || open+timeout+other != 0 {
		t.Errorf("scan: %s; want all %d connects refused at once", scan, attempts)
	}
	if d, err := time.ParseDuration(roundMax); err != nil || d > 10*time.Second {
		t.Errorf("a round of %d connects took %s", ports, roundMax)
	}
	if limit := 3*before + 5*time.Millisecond; during > limit {
		t.Errorf("neighbour's round trips to the mirror: p50 %v before the scan, %v during it (> %v)", before, during, limit)
	}
	if duringTracked > maxConns {
		t.Errorf("the scanner held %d conntrack entries during the scan, its limit is %d", duringTracked, maxConns)
	}

	// Every attempt counted, every destination recorded.
	n, err := s.C.Network(ctx, scanner.ID)
	if err != nil {
		t.Fatal(err)
	}
	if n.DeniedBy["not-allowed"] != attempts || n.Denied != attempts {
		t.Errorf("counted %d refusals (%v), the scan made %d", n.Denied, n.DeniedBy, attempts)
	}
	dests := map[string]int64{}
	for _, d := range n.DeniedDestinations {
		if d.Reason == "not-allowed" && d.Protocol == "tcp" && strings.HasPrefix(d.Destination, nettest.Elsewhere+":") {
			dests[d.Destination] = d.Count
		}
	}
	for p := 1; p <= ports; p++ {
		if c := dests[fmt.Sprintf("%s:%d", nettest.Elsewhere, p)]; c != int64(rounds) {
			t.Errorf("port %d: recorded %d refusals, want %d (%d destinations recorded)", p, c, rounds, len(dests))
			break
		}
	}
	// The log is bounded (api.MaxDenialLog entries): each entry is a
	// destination whose count grew since the last read; what it drops it
	// counts.
	dl, err := s.C.NetworkDenials(ctx, scanner.ID)
	if err != nil {
		t.Fatal(err)
	}
	var logged int64
	for _, r := range dl.Denials {
		if r.Reason != "not-allowed" || r.Protocol != "tcp" || !strings.HasPrefix(r.Destination, nettest.Elsewhere+":") || r.Count < 1 {
			t.Errorf("denial log entry %+v", r)
			break
		}
		logged += r.Count
	}
	if len(dl.Denials) > api.MaxDenialLog || int64(len(dl.Denials))+dl.Dropped < ports ||
		logged > attempts || (dl.Dropped == 0 && logged != attempts) {
		t.Errorf("denial log: %d entries (%d packets), %d dropped; the scan made %d attempts to %d destinations",
			len(dl.Denials), logged, dl.Dropped, attempts, ports)
	}
	metric := regexp.MustCompile(`warren_network_denied_total\{node="[^"]*",reason="not-allowed"\} (\d+)`)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(250 * time.Millisecond) {
		_, body := s.rawRequest(t, "GET", "/metrics", "", nil, nil)
		m := metric.FindStringSubmatch(body)
		if m != nil && m[1] == strconv.FormatInt(attempts, 10) {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("warren_network_denied_total{reason=not-allowed}: %v, want %d", m, attempts)
			break
		}
	}

	// More connections than its limit to an allowed destination: the
	// limit holds, in the kernel's connection tracking too. (Those past
	// it are refused with an ICMP error, which the kernel rate-limits: a
	// connect whose refusal was not sent retries and times out.)
	const want = 4 * maxConns
	if _, err := s.C.Exec(ctx, scanner.ID, api.ExecRequest{Background: true,
		Cmd: fmt.Sprintf("/probe conns %s %d 20 > /tmp/conns 2>&1", hold, want)}); err != nil {
		t.Fatal(err)
	}
	var conns string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if r := s.sh(t, scanner.ID, "cat /tmp/conns"); strings.Contains(r.Stdout, "greeted") {
			conns = strings.TrimSpace(r.Stdout[strings.Index(r.Stdout, "greeted"):])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the connections were not all answered in 30 s: %q", s.sh(t, scanner.ID, "cat /tmp/conns").Stdout)
		}
	}
	heldTracked := tracked()
	t.Logf("%d connections at once: %s; the scanner's conntrack entries: %d", want, conns, heldTracked)
	var greeted int
	if _, err := fmt.Sscanf(conns, "greeted %d", &greeted); err != nil || greeted < 1 || greeted > maxConns {
		t.Errorf("%d connections at once with a limit of %d: %q", want, maxConns, conns)
	}
	if heldTracked > maxConns || heldTracked < greeted {
		t.Errorf("the scanner holds %d connections and has %d conntrack entries; its limit is %d", greeted, heldTracked, maxConns)
	}
	if n, err := s.C.Network(ctx, scanner.ID); err != nil || n.DeniedBy["conn-limit"] == 0 {
		t.Errorf("connections past the limit not counted: %+v %v", n, err)
	}
	if r := s.sh(t, neighbour.ID, "nc -w 5 "+nettest.Mirror+" 80 </dev/null"); r.Stdout != "hello" {
		t.Errorf("neighbour cannot reach the mirror while the scanner is at its limit: %q %q", r.Stdout, r.Stderr)
	}
	for _, id := range []string{scanner.ID, neighbour.ID} {
		if _, err := s.C.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	s.stop()
	assertNoLeaks(t, s)
}
