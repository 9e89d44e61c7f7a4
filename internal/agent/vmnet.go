package agent

// A networked VM's interface (internal/runtime/microvm/network.go): the
// host names its address, gateway and MAC in the kernel parameter
// VMParamNet, and the agent, before it serves anything, gives the
// interface with that MAC the address, brings it and loopback up, and
// routes everything through the gateway. IPv6 stays off on it: the host
// carries none for sandboxes. What the guest later changes here changes
// nothing on the host, where the sandbox's policy lives.

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
)

// VMParamNet is a networked VM's interface: "ADDRESS/BITS,GATEWAY,MAC".
const VMParamNet = "warren.net"

// vmNetwork configures the interface that param (VMParamNet's value)
// describes.
func vmNetwork(param string) error {
	f := strings.Split(param, ",")
	if len(f) != 3 {
		return fmt.Errorf("kernel parameter %s=%q: want ADDRESS/BITS,GATEWAY,MAC", VMParamNet, param)
	}
	addr, err := netlink.ParseAddr(f[0])
	gw := net.ParseIP(f[1])
	mac, merr := net.ParseMAC(f[2])
	if err != nil || gw == nil || merr != nil {
		return fmt.Errorf("kernel parameter %s=%q: want ADDRESS/BITS,GATEWAY,MAC", VMParamNet, param)
	}
	if lo, err := netlink.LinkByName("lo"); err == nil {
		_ = netlink.LinkSetUp(lo)
	}
	// The virtio-net driver was loaded with the modules; its interface
	// may take a moment to be registered.
	var link netlink.Link
	for deadline := time.Now().Add(5 * time.Second); link == nil; {
		links, err := netlink.LinkList()
		if err != nil {
			return fmt.Errorf("list links: %w", err)
		}
		for _, l := range links {
			if bytes.Equal(l.Attrs().HardwareAddr, mac) {
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
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/disable_ipv6", []byte("1"), 0o644)
	if err := netlink.AddrAdd(link, addr); err != nil {
		return fmt.Errorf("address %s on %s: %w", f[0], name, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("%s up: %w", name, err)
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: gw}); err != nil {
		return fmt.Errorf("default route via %s: %w", gw, err)
	}
	return nil
}
