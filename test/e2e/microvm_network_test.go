package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/sandboxnet/nettest"
)

// TestMicroVMNetwork: `network` on a microVM gives the guest an interface
// (virtio-net on a tap device of the host) under the same policy as a
// container's: it reaches what its list allows (in a fake internet this
// test makes: nothing leaves the machine), by address and by name through
// the node's resolver, and nothing else: not another port, not the
// metadata address, not the host. Root in the guest can change the
// guest's addresses and routes (it is a VM), which changes nothing on the
// host. Refusals are counted; the list can be changed; a pause to a
// memory snapshot and a resume keep the network; a kill -9 of warren and
// its restart adopt it; a fork from memory is refused (the children would
// share the address); delete leaves no tap, chain or table. The vm tier's
// VMs of layers have the same network.
func TestMicroVMNetwork(t *testing.T) {
	kdir := vmKernelDir(t)
	nettest.FakeInternet(t)
	pool := fmt.Sprintf("10.213.%d.0/24", 20+(os.Getpid()+13)%100)
	s := startServer(t, "--vm-kernel", kdir, "--net-pool", pool, "--dns-upstream", nettest.DNS)
	ctx := context.Background()

	sb := s.create(t, api.CreateSandboxRequest{Tier: api.TierMicroVM, MemoryMB: 256,
		Network: &api.NetworkSpec{Egress: []string{nettest.Mirror + "/32:443/tcp", nettest.MirrorName + ":80"}}})
	if sb.Tier != api.TierMicroVM || sb.Network == nil || len(sb.Network.Egress) != 2 {
		t.Fatalf("created: %+v", sb)
	}
	if !fromTemplate(t, s.dataDir, sb.ID) {
		t.Errorf("the networked microVM was booted, not restored from its shape's memory template")
	}
	if r := s.sh(t, sb.ID, "cat /sys/class/net/eth0/address"); r.Stdout == "" || strings.Contains(r.Stdout, "02:77:61:72:00:01") {
		t.Errorf("the guest's MAC: %q (the template's is 02:77:61:72:00:01)", r.Stdout)
	}
	n0, err := s.C.Network(ctx, sb.ID)
	if err != nil || !n0.Enabled || n0.Address == "" || n0.Gateway == "" {
		t.Fatalf("network: %+v %v", n0, err)
	}
	if r := s.sh(t, sb.ID, "cat /proc/net/dev; ip -4 addr show; cat /etc/resolv.conf"); !strings.Contains(r.Stdout, "eth0") ||
		!strings.Contains(r.Stdout, n0.Address+"/31") || !strings.Contains(r.Stdout, "nameserver "+n0.Gateway) {
		t.Fatalf("guest network: %q %q", r.Stdout, r.Stderr)
	}
	reach := func(dst string) *api.ExecResult { return s.sh(t, sb.ID, "nc -w 5 "+dst+" </dev/null") }
	if r := reach(nettest.Mirror + " 443"); r.ExitCode != 0 || r.Stdout != "hello" {
		t.Fatalf("allowed %s:443: exit %d %q %q\n%s", nettest.Mirror, r.ExitCode, r.Stdout, r.Stderr, tail(s.logs.String(), 20))
	}
	// By name: resolved through the node's resolver, then reachable on
	// the listed port.
	if r := reach(nettest.MirrorName + " 80"); r.ExitCode != 0 || r.Stdout != "hello" {
		t.Errorf("allowed name %s:80: exit %d %q %q", nettest.MirrorName, r.ExitCode, r.Stdout, r.Stderr)
	}
	hostPort := hostServer(t)
	for _, dst := range []string{nettest.Elsewhere + " 443", nettest.Metadata + " 80",
		fmt.Sprint(nettest.HostEnd, " ", hostPort), fmt.Sprint(n0.Gateway, " ", hostPort)} {
		if r := reach(dst); r.ExitCode == 0 || strings.Contains(r.Stdout, "hello") {
			t.Errorf("%s reachable: exit %d %q", dst, r.ExitCode, r.Stdout)
		}
	}
	// Root in the guest takes an address in the fake internet's prefix
	// (a route on its link with it) and routes the metadata prefix on its
	// link: the host's policy still refuses.
	if r := s.sh(t, sb.ID, "ip addr add 10.9.9.77/24 dev eth0 && ip route add 169.254.0.0/16 dev eth0 && echo changed"); r.Stdout != "changed\n" {
		t.Errorf("root in the guest changes its own network: %q %q", r.Stdout, r.Stderr)
	}
	for _, dst := range []string{nettest.Elsewhere + " 443", nettest.Metadata + " 80"} {
		if r := reach(dst); r.ExitCode == 0 || strings.Contains(r.Stdout, "hello") {
			t.Errorf("%s reachable after the guest's changes: exit %d %q", dst, r.ExitCode, r.Stdout)
		}
	}
	if r := s.sh(t, sb.ID, "ip route del 169.254.0.0/16 dev eth0 && ip addr del 10.9.9.77/24 dev eth0"); r.ExitCode != 0 {
		t.Errorf("undo: %q", r.Stderr)
	}
	n, err := s.C.Network(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if n.DeniedBy["not-allowed"] < 1 || n.DeniedBy["metadata"] < 1 || n.DeniedBy["host"] < 2 {
		t.Errorf("refusals counted: %+v", n.DeniedBy)
	}
	tried := map[string]string{}
	for _, d := range n.DeniedDestinations {
		tried[d.Destination] = d.Protocol + " " + d.Reason
	}
	if tried[nettest.Metadata+":80"] != "tcp metadata" || tried[nettest.Elsewhere+":443"] != "tcp not-allowed" {
		t.Errorf("denied destinations: %+v", n.DeniedDestinations)
	}
	// The list changes while the VM runs.
	if _, err := s.C.SetNetwork(ctx, sb.ID, []string{nettest.Elsewhere + ":443/tcp"}); err != nil {
		t.Fatal(err)
	}
	if r := reach(nettest.Elsewhere + " 443"); r.Stdout != "hello" {
		t.Errorf("newly allowed %s:443: exit %d %q %q", nettest.Elsewhere, r.ExitCode, r.Stdout, r.Stderr)
	}
	if r := reach(nettest.Mirror + " 443"); r.ExitCode == 0 {
		t.Errorf("%s:443 reachable after it left the list: %q", nettest.Mirror, r.Stdout)
	}

	// A fork from memory would clone the address: refused, nothing made.
	_, err = s.C.ForkMemory(ctx, sb.ID, 2)
	var ae *api.Error
	if !errors.As(err, &ae) || api.HTTPStatus(ae.Code) != 422 || !strings.Contains(ae.Message, "network") {
		t.Errorf("memory fork of a networked VM: %v, want a 422 naming the network", err)
	}

	// Pause to a memory snapshot (QEMU ends), resume: the tap is opened
	// again and the guest's interface carries on.
	if _, err := s.C.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if q := qemusOf(s.dataDir); strings.Contains(q, sb.ID) {
		t.Errorf("QEMU of the paused VM runs: %s", q)
	}
	if r := reach(nettest.Elsewhere + " 443"); r.Stdout != "hello" {
		t.Errorf("after pause and resume: exit %d %q %q\n%s", r.ExitCode, r.Stdout, r.Stderr, tail(s.logs.String(), 20))
	}

	// kill -9 and a restart: the VM and its network are adopted.
	s.kill9()
	s.start()
	if r := reach(nettest.Elsewhere + " 443"); r.Stdout != "hello" {
		t.Errorf("after a restart: exit %d %q %q\n%s", r.ExitCode, r.Stdout, r.Stderr, tail(s.logs.String(), 20))
	}
	if r := reach(nettest.Metadata + " 80"); r.ExitCode == 0 {
		t.Errorf("metadata reachable after a restart: %q", r.Stdout)
	}

	// The vm tier (q35, virtio-net on PCI) has the same network.
	full := s.create(t, api.CreateSandboxRequest{Tier: api.TierVM, MemoryMB: 256,
		Network: &api.NetworkSpec{Egress: []string{nettest.Mirror + "/32:443/tcp"}}})
	if r := s.sh(t, full.ID, "nc -w 5 "+nettest.Mirror+" 443 </dev/null"); r.ExitCode != 0 || r.Stdout != "hello" {
		t.Errorf("vm tier, allowed %s:443: exit %d %q %q", nettest.Mirror, r.ExitCode, r.Stdout, r.Stderr)
	}
	if r := s.sh(t, full.ID, "nc -w 5 "+nettest.Elsewhere+" 443 </dev/null"); r.ExitCode == 0 {
		t.Errorf("vm tier, %s:443 reachable: %q", nettest.Elsewhere, r.Stdout)
	}

	for _, id := range []string{sb.ID, full.ID} {
		if _, err := s.C.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	s.stop()
	assertNoLeaks(t, s)
	if q := qemusOf(s.dataDir); q != "" {
		t.Errorf("QEMU left after shutdown: %s", q)
	}
}
