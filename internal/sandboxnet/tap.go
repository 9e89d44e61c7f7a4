package sandboxnet

import (
	"crypto/sha256"
	"fmt"
	"net"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
)

// A virtual machine's network is the same as a container's, but its host
// end is a tap device instead of a veth pair: the tap (named and aliased
// as a veth host end would be, holding the gateway address) stays in the
// host's network namespace, where the policy matches it by name, and the
// VM's QEMU is handed a descriptor of it (OpenTap). The guest's agent
// gives its interface the sandbox's address and a default route through
// the gateway (kernel parameter, internal/agent). The tap is persistent:
// it outlives a QEMU ended by a pause to a memory snapshot, and a
// restored QEMU opens it again. Root in the guest can change the guest's
// address and routes, but not the tap or the host's rules: whatever it
// sends enters the host through the tap and meets the same policy as a
// container's packets.

// tapFlags are the tap's flags at creation and at every open: Ethernet
// frames without the packet-information header or a virtio-net header.
const tapFlags = unix.IFF_TAP | unix.IFF_NO_PI

// AttachTap gives sandbox id a network whose host end is a tap device
// (for a VM: OpenTap hands QEMU its descriptor) and installs its policy.
// On an error nothing of it is left.
func (m *Manager) AttachTap(id string, egress []api.EgressRule, opts AttachOptions) (*Attachment, error) {
	return m.attach(id, egress, opts, m.tapLink)
}

// tapLink makes a's host end a persistent tap device.
func (m *Manager) tapLink(a *Attachment) error {
	if err := makeTap(a.Link); err != nil {
		return err
	}
	host, err := netlink.LinkByName(a.Link)
	if err != nil {
		return fmt.Errorf("sandboxnet: find %s: %w", a.Link, err)
	}
	if err := m.hostEnd(a, host); err != nil {
		return err
	}
	m.mu.Lock()
	m.carried[a.ID] = linkCount{}
	m.mu.Unlock()
	return nil
}

// makeTap creates the persistent tap device name.
func makeTap(name string) error {
	f, err := OpenTap(name)
	if err != nil {
		return err
	}
	defer f.Close()
	// Not persistent yet, the tap goes with f if this fails.
	if err := unix.IoctlSetInt(int(f.Fd()), unix.TUNSETPERSIST, 1); err != nil {
		return fmt.Errorf("sandboxnet: make tap %s persistent: %w", name, err)
	}
	return nil
}

// OpenTap opens the tap device name (creating it, not persistent, if it
// does not exist) and returns its queue: the descriptor QEMU reads and
// writes the guest's frames on.
func OpenTap(name string) (*os.File, error) {
	if len(name) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("sandboxnet: tap name %q too long", name)
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("sandboxnet: open /dev/net/tun: %w", err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sandboxnet: tap %s: %w", name, err)
	}
	ifr.SetUint16(tapFlags)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sandboxnet: tap %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "/dev/net/tun:"+name), nil
}

// IsTap says whether id's host end is a tap device (a VM's network).
func (m *Manager) IsTap(id string) bool {
	l, err := netlink.LinkByName(m.LinkName(id))
	if err != nil {
		return false
	}
	_, ok := l.(*netlink.Tuntap)
	return ok
}

// MAC is the guest interface's address for sandbox id: locally
// administered, unicast, stable per sandbox.
func (m *Manager) MAC(id string) net.HardwareAddr {
	h := sha256.Sum256([]byte(m.alias(id)))
	return net.HardwareAddr{0x02, 0x77, h[6], h[7], h[8], h[9]}
}
