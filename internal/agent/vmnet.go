package agent

// A networked VM's interface (internal/runtime/microvm/network.go): the
// host names its address, gateway and MAC in setup (SetupConfig.Net), and
// the agent gives the interface with that MAC the address, brings it and
// loopback up, and routes everything through the gateway. The same in a
// microVM (the agent is PID 1) and in a VM that boots its own system (the
// agent is its service; the interface may still be on its way there:
// udev loads the driver). IPv6 stays off on it: the host
// carries none for sandboxes. What the guest later changes here changes
// nothing on the host, where the sandbox's policy lives.

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/warrenhq/warren/internal/agentproto"
)

// vmNetwork configures the interface that n describes.
func vmNetwork(n *agentproto.VMNet) error {
	addr, err := netlink.ParseAddr(n.Address)
	gw := net.ParseIP(n.Gateway)
	mac, merr := net.ParseMAC(n.MAC)
	if err != nil || gw == nil || merr != nil {
		return fmt.Errorf("bad interface %+v", *n)
	}
	if lo, err := netlink.LinkByName("lo"); err == nil {
		_ = netlink.LinkSetUp(lo)
	}
	// The virtio-net driver was loaded with the modules; its interface
	// may take a moment to be registered. A VM restored from a memory
	// template has one interface, with the template's MAC: it gets the
	// VM's (virtio-net's control queue tells the device, which then takes
	// frames for it).
	match := func(l netlink.Link) bool { return bytes.Equal(l.Attrs().HardwareAddr, mac) }
	if vmTemplate.restored {
		match = func(l netlink.Link) bool { return l.Type() == "device" && len(l.Attrs().HardwareAddr) == 6 }
	}
	var link netlink.Link
	for deadline := time.Now().Add(20 * time.Second); link == nil; {
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("list links: %w", err)
		}
		for _, l := range links {
			if match(l) {
				link = l
			}
		}
		if link == nil {
			if time.Now().After(deadline) {
				return fmt.Errorf("no interface with MAC %s", mac)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	name := link.Attrs().Name
	if !bytes.Equal(link.Attrs().HardwareAddr, mac) {
		if err := netlink.LinkSetHardwareAddr(link, mac); err != nil {
			return fmt.Errorf("MAC %s on %s: %w", mac, name, err)
		}
	}
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0o644)
	if err := netlink.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("address %s on %s: %w", n.Address, name, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("%s up: %w", name, err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw}); err != nil {
		return fmt.Errorf("default route via %s: %w", gw, err)
	}
	return nil
}
