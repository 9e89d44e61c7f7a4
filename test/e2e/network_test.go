package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
)

// TestNetworkEgress: a sandbox created without network has loopback only;
// one created with an egress allowlist reaches what it lists (in a fake
// internet this test makes: nothing leaves the machine) and nothing else:
// not another port, not the metadata address, not the host; every refusal
// is counted in GET …/network; deleting it leaves no veth or table.
func TestNetworkEgress(t *testing.T) {
	nettest.FakeInternet(t)
	pool := fmt.Sprintf("10.213.%d.0/24", 20+os.Getpid()%100)
	s := startServer(t, "--net-pool", pool)

	plain := s.create(t, api.CreateSandboxRequest{})
	if r := s.sh(t, plain.ID, "cat /proc/net/dev"); strings.Contains(r.Stdout, "eth0") || !strings.Contains(r.Stdout, "lo:") {
		t.Errorf("a sandbox without network has interfaces:\n%s", r.Stdout)
	}
	code, body := s.rawRequest(t, "GET", "/v1/sandboxes/"+plain.ID+"/network", "", nil, nil)
	if code != 200 || !strings.Contains(body, `"enabled":false`) {
		t.Errorf("network of a plain sandbox: %d %s", code, body)
	}

	// Bad entries are the client's error, with the entry in the message.
	for _, bad := range []string{"10.1.2.0/33", "10.1.2.3:0", "10.1.2.3:70000/tcp", "::1"} {
		b, _ := json.Marshal(map[string]any{"image": "busybox", "network": map[string]any{"egress": []string{bad}}})
		code, body := s.rawRequest(t, "POST", "/v1/sandboxes", "", b, map[string]string{"Content-Type": "application/json"})
		if code != 422 || !strings.Contains(body, bad) {
			t.Errorf("egress %q: %d %s, want 422 naming it", bad, code, body)
		}
	}

	sb := s.create(t, api.CreateSandboxRequest{Network: &api.NetworkSpec{Egress: []string{nettest.Mirror + "/24:443/tcp"}}})
	if sb.Network == nil || len(sb.Network.Egress) != 1 || sb.Network.Egress[0] != "10.1.2.0/24:443/tcp" {
		t.Errorf("created sandbox's network: %+v", sb.Network)
	}
	if r := s.sh(t, sb.ID, "cat /proc/net/dev"); !strings.Contains(r.Stdout, "eth0") {
		t.Errorf("a networked sandbox has no eth0:\n%s", r.Stdout)
	}
	if r := s.sh(t, sb.ID, "nc -w 5 "+nettest.Mirror+" 443 </dev/null"); r.ExitCode != 0 || r.Stdout != "hello" {
		t.Fatalf("allowed %s:443: exit %d, %q %q", nettest.Mirror, r.ExitCode, r.Stdout, r.Stderr)
	}
	hostPort := hostServer(t)
	var deadline time.Time
	n0, err := s.C.Network(t.Context(), sb.ID) // the Go SDK
	if err != nil || !n0.Enabled || n0.Address == "" || n0.Gateway == "" || n0.Denied != 0 {
		t.Fatalf("network: %+v %v", n0, err)
	}
	n := *n0
	for _, dst := range []string{nettest.Mirror + " 80", nettest.Elsewhere + " 443", nettest.Metadata + " 80",
		fmt.Sprint(nettest.HostEnd, " ", hostPort), fmt.Sprint(n.Gateway, " ", hostPort)} {
		if r := s.sh(t, sb.ID, "nc -w 5 "+dst+" </dev/null"); r.ExitCode == 0 || strings.Contains(r.Stdout, "hello") {
			t.Errorf("%s reachable: exit %d %q", dst, r.ExitCode, r.Stdout)
		}
	}
	// Root inside has no CAP_NET_ADMIN, even over its own namespace: it
	// cannot take another address or change its link.
	for _, cmd := range []string{"ip addr add 10.1.2.77/24 dev eth0", "ip link set eth0 down", "ip route del default"} {
		if r := s.sh(t, sb.ID, cmd); r.ExitCode == 0 || !strings.Contains(r.Stderr, "not permitted") {
			t.Errorf("root inside: %q: exit %d %q, want EPERM", cmd, r.ExitCode, r.Stderr)
		}
	}
	if r := s.sh(t, sb.ID, "nc -w 5 "+nettest.Mirror+" 443 </dev/null"); r.Stdout != "hello" {
		t.Errorf("allowed destination lost after the attempts: %q %q", r.Stdout, r.Stderr)
	}
	code, body = s.rawRequest(t, "GET", "/v1/sandboxes/"+sb.ID+"/network", "", nil, nil)
	if code != 200 || json.Unmarshal([]byte(body), &n) != nil {
		t.Fatalf("network: %d %s", code, body)
	}
	want := map[string]int64{"not-allowed": 2, "metadata": 1, "host": 2}
	for k, v := range want {
		if n.DeniedBy[k] != v {
			t.Errorf("denied_by[%s] = %d, want %d: %s", k, n.DeniedBy[k], v, body)
		}
	}
	if n.Denied != 5 {
		t.Errorf("denied = %d, want 5: %s", n.Denied, body)
	}
	tried := map[string]string{}
	for _, d := range n.DeniedDestinations {
		tried[d.Destination] = d.Protocol + " " + d.Reason
	}
	if tried[nettest.Metadata+":80"] != "tcp metadata" || tried[nettest.Elsewhere+":443"] != "tcp not-allowed" || len(tried) != 5 {
		t.Errorf("denied destinations: %+v", n.DeniedDestinations)
	}
	// Setup → solving: the mirror allowed, then nothing. A download open
	// across the switch is cut at its next packet.
	hold := nettest.Mirror + " " + nettest.HoldPort
	if r := s.sh(t, sb.ID, "nc -w 3 "+hold+" </dev/null"); r.ExitCode == 0 {
		t.Errorf("hold port reachable before it was allowed: %q", r.Stdout)
	}
	if _, err := s.C.SetNetwork(t.Context(), plain.ID, []string{"10.0.0.0/8"}); err == nil || !strings.Contains(err.Error(), "without network") {
		t.Errorf("setting a plain sandbox's network: %v, want 409", err)
	}
	if _, err := s.C.SetNetwork(t.Context(), sb.ID, []string{"10.1.2.0/33"}); err == nil || !strings.Contains(err.Error(), "10.1.2.0/33") {
		t.Errorf("a bad entry: %v, want 422", err)
	}
	after, err := s.C.SetNetwork(t.Context(), sb.ID, []string{nettest.Mirror + ":" + nettest.HoldPort + "/tcp"})
	if err != nil || len(after.Egress) != 1 || after.Denied < n.Denied {
		t.Fatalf("set network: %+v %v (counts before %d)", after, err, n.Denied)
	}
	// nc sends its next bytes 8 s after it connected.
	if _, err := s.C.Exec(t.Context(), sb.ID, api.ExecRequest{Cmd: "(sleep 8; echo more) | nc " + hold + " > /tmp/held 2>&1; echo exit $? >> /tmp/held", Background: true}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for !strings.Contains(s.sh(t, sb.ID, "cat /tmp/held").Stdout, "hello") {
		if time.Now().After(deadline) {
			t.Fatalf("no download over the newly allowed port: %q", s.sh(t, sb.ID, "cat /tmp/held").Stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r := s.sh(t, sb.ID, "nc -w 5 "+nettest.Mirror+" 443 </dev/null"); r.ExitCode == 0 {
		t.Errorf("443 reachable after it was taken off the list: %q", r.Stdout)
	}
	if _, err := s.C.SetNetwork(t.Context(), sb.ID, nil); err != nil {
		t.Fatal(err)
	}
	if r := s.sh(t, sb.ID, "nc -w 5 "+hold+" </dev/null"); r.ExitCode == 0 {
		t.Errorf("hold port reachable after the list was emptied: %q", r.Stdout)
	}
	mid, err := s.C.Network(t.Context(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	held := ""
	for held = s.sh(t, sb.ID, "cat /tmp/held").Stdout; !strings.Contains(held, "exit"); held = s.sh(t, sb.ID, "cat /tmp/held").Stdout {
		if time.Now().After(deadline) {
			t.Fatalf("the open download did not end: %q", held)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// busybox nc ends quietly on a reset; the refusal of its bytes after
	// the switch is what shows the cut.
	if end, err := s.C.Network(t.Context(), sb.ID); err != nil || end.DeniedBy["not-allowed"] <= mid.DeniedBy["not-allowed"] {
		t.Errorf("the open download's bytes after the switch were not refused: %d then %d (%v); nc: %q",
			mid.DeniedBy["not-allowed"], end.DeniedBy["not-allowed"], err, held)
	}
	if got, _ := s.C.Get(t.Context(), sb.ID); got == nil || got.Network == nil || len(got.Network.Egress) != 0 {
		t.Errorf("sandbox view after the change: %+v", got)
	}
	if _, err := s.C.Delete(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	next := s.create(t, api.CreateSandboxRequest{})
	if r := s.sh(t, next.ID, "cat /proc/net/dev"); strings.Contains(r.Stdout, "eth0") {
		t.Errorf("a sandbox created after a networked one has its interface:\n%s", r.Stdout)
	}
	// Its chains and sets go with the delete; the veth pair with the
	// sandbox's namespace, which the kernel tears down right after. When
	// its container is kept for the next networked sandbox of its shape
	// (TestNetworkRecycledContainer), its link and emptied chains and sets
	// wait with it. The edge's table goes when the server stops.
	left := func(x string) bool {
		return !strings.HasPrefix(x, "nftables table") && !strings.HasPrefix(x, "link ") && !strings.HasSuffix(x, "_"+sb.ID) && x != "nftables chains of "+sb.ID
	}
	deadline = time.Now().Add(5 * time.Second)
	for l := netLeaks(s.dataDir); slices.ContainsFunc(l, left); l = netLeaks(s.dataDir) {
		if time.Now().After(deadline) {
			t.Fatalf("deleted networked sandbox left: %v", l)
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.stop()
	assertNoLeaks(t, s)
}

// TestNetworkRestart: after kill -9 of the edge, a live networked sandbox
// is adopted with its network working, a dead one's link and table are
// swept, a new sandbox gets another address, and stopping leaves nothing.
func TestNetworkRestart(t *testing.T) {
	nettest.FakeInternet(t)
	pool := fmt.Sprintf("10.213.%d.0/24", 130+os.Getpid()%100)
	s := startServer(t, "--net-pool", pool, "--dns-upstream", nettest.DNS)
	spec := api.CreateSandboxRequest{Network: &api.NetworkSpec{Egress: []string{nettest.Mirror + ":443/tcp", nettest.MirrorName + ":80"}}}
	alive, doomed := s.create(t, spec), s.create(t, spec)
	doomedPid := agentPid(t, s, doomed.ID)
	s.kill9()
	if err := syscall.Kill(doomedPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	s.start()
	if r := s.sh(t, alive.ID, "nc -w 5 "+nettest.Mirror+" 443 </dev/null"); r.Stdout != "hello" {
		t.Fatalf("adopted sandbox lost its network: %q %q\n%s", r.Stdout, r.Stderr, tail(s.logs.String(), 30))
	}
	// Its names too: the restarted edge's resolver knows its list.
	if r := s.sh(t, alive.ID, "nc -w 5 "+nettest.MirrorName+" 80 </dev/null"); r.Stdout != "hello" {
		t.Errorf("adopted sandbox lost its names: %q %q\n%s", r.Stdout, r.Stderr, tail(s.logs.String(), 30))
	}
	if r := s.sh(t, alive.ID, "nslookup "+nettest.ElsewhereName); r.ExitCode == 0 {
		t.Errorf("adopted sandbox resolves an unlisted name: %q", r.Stdout)
	}
	left := netLeaks(s.dataDir)
	for _, l := range left {
		if strings.Contains(l, doomed.ID) {
			t.Errorf("dead sandbox's network not swept: %v", left)
		}
	}
	var a api.SandboxNetwork
	code, body := s.rawRequest(t, "GET", "/v1/sandboxes/"+alive.ID+"/network", "", nil, nil)
	if code != 200 || json.Unmarshal([]byte(body), &a) != nil || a.Address == "" {
		t.Fatalf("network of the adopted sandbox: %d %s", code, body)
	}
	fresh := s.create(t, spec)
	var f api.SandboxNetwork
	_, body = s.rawRequest(t, "GET", "/v1/sandboxes/"+fresh.ID+"/network", "", nil, nil)
	if json.Unmarshal([]byte(body), &f) != nil || f.Address == "" || f.Address == a.Address {
		t.Errorf("new sandbox after the restart got %q; the adopted one has %q", f.Address, a.Address)
	}
	if r := s.sh(t, fresh.ID, "nc -w 5 "+nettest.Mirror+" 443 </dev/null"); r.Stdout != "hello" {
		t.Errorf("new sandbox after the restart: %q %q", r.Stdout, r.Stderr)
	}
	s.stop()
	assertNoLeaks(t, s)
}

// hostServer serves nettest's greeting on every address of the host, on a
// port it returns, until the test ends: what a sandbox must not reach.
func hostServer(t *testing.T) int {
	t.Helper()
	hl, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hl.Close() })
	go nettest.Serve(hl)
	return hl.Addr().(*net.TCPAddr).Port
}
