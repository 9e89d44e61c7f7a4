package sandboxnet

import (
	"fmt"
	"os"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
)

// TestTap: a VM's network has a persistent tap as its host end, holding
// the gateway address under the sandbox's alias, so that the policy,
// Owned and Sweep treat it as a veth host end. Its queue can be opened
// again after its opener closed it (a QEMU restored from a memory
// snapshot); a sweep that keeps taps keeps it; Detach removes all of it.
func TestTap(t *testing.T) {
	needRoot(t)
	m := newManager(t, "10.213.129.0/24")
	id := fmt.Sprintf("sb-tap-%d", os.Getpid())
	a, err := m.AttachTap(id, mustParse(t, "10.1.2.0/24:443/tcp"), AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Detach(id) })
	l, err := netlink.LinkByName(a.Link)
	if err != nil {
		t.Fatal(err)
	}
	if l.Type() != "tuntap" || l.Attrs().Alias != m.alias(id) || !m.IsTap(id) || !m.Attached(id) {
		t.Errorf("host end: type %s alias %q, IsTap %v", l.Type(), l.Attrs().Alias, m.IsTap(id))
	}
	addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
	if len(addrs) != 1 || !addrs[0].IP.Equal(a.Gateway.AsSlice()) {
		t.Errorf("host end's addresses %v, want the gateway %s", addrs, a.Gateway)
	}
	for i := range 2 {
		f, err := OpenTap(a.Link)
		if err != nil {
			t.Fatalf("open %d: %v", i, err)
		}
		f.Close()
	}
	if !m.Attached(id) {
		t.Fatal("the tap went with its last opener: not persistent")
	}
	if mac := m.MAC(id); mac[0]&1 != 0 || mac[0]&2 == 0 || mac.String() != m.MAC(id).String() {
		t.Errorf("MAC %s: want a stable, locally administered unicast address", mac)
	}
	gone, err := m.Sweep(m.IsTap)
	if err != nil || len(gone) != 0 || !m.Attached(id) {
		t.Errorf("a sweep that keeps taps removed %v (%v)", gone, err)
	}
	if err := m.Detach(id); err != nil {
		t.Fatal(err)
	}
	if m.Attached(id) {
		t.Error("tap left after Detach")
	}
	if l, _ := Owned(t.Name()); slices.Contains(l, a.Link) {
		t.Errorf("left: %v", l)
	}
}
