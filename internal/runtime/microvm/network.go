package microvm

// A VM's network (docs/network.md): the node's sandboxnet.Manager (the
// container tier's, shared) gives the sandbox its /31, its policy and a
// tap device as the host end (sandboxnet/tap.go). QEMU gets a descriptor
// of the tap (spawn's withFDSets opens it by the name in "-netdev
// tap,ifname=…", so a restore from a memory snapshot opens it again), the
// guest a virtio-net interface with the sandbox's MAC, and the agent the
// address, gateway and MAC in setup (agentproto.SetupConfig.Net), with
// which it configures the interface before Start returns: in a microVM
// and in a VM booted from its own disk alike. The resolver is the
// gateway's, as for a container.

import (
	"fmt"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/sandboxnet"
)

// nic is a VM's network interface: nil for a VM without network.
type nic struct {
	link, mac, address, gateway string
}

// attachNetwork gives spec's sandbox its network (none when it asks for
// none).
func (r *Runtime) attachNetwork(spec *runtime.Spec) (*nic, error) {
	if spec.Network == nil {
		return nil, nil // Start refused a network without r.cfg.Net
	}
	n := spec.Network
	a, err := r.cfg.Net.AttachTap(spec.ID, n.Egress, sandboxnet.AttachOptions{Group: n.Group,
		EgressRateMbit: n.EgressRateMbit, IngressRateMbit: n.IngressRateMbit, MaxConns: n.MaxConns})
	if err != nil {
		return nil, fmt.Errorf("microvm: network: %w", err)
	}
	return &nic{link: a.Link, mac: r.cfg.Net.MAC(spec.ID).String(), address: a.Address.String(), gateway: a.Gateway.String()}, nil
}

// args are QEMU's arguments for n (bus: the virtio device suffix of the
// machine). An interface without a link has no host end (a memory
// template's: template.go).
func (n *nic) args(bus string) []string {
	if n == nil {
		return nil
	}
	if n.link == "" {
		return []string{"-device", "virtio-net" + bus + ",mac=" + n.mac}
	}
	return []string{
		"-netdev", "tap,id=net0,ifname=" + n.link,
		"-device", "virtio-net" + bus + ",netdev=net0,mac=" + n.mac,
	}
}

// setup is n as the agent's setup names it.
func (n *nic) setup() *agentproto.VMNet {
	if n == nil {
		return nil
	}
	return &agentproto.VMNet{Address: n.address + "/31", Gateway: n.gateway, MAC: n.mac}
}

// tapOf is the tap named by a "-netdev" value ("tap,…,ifname=NAME,…"),
// "" when it names none.
func tapOf(netdev string) string {
	kvs := strings.Split(netdev, ",")
	if kvs[0] != "tap" {
		return ""
	}
	for _, kv := range kvs[1:] {
		if name, ok := strings.CutPrefix(kv, "ifname="); ok {
			return name
		}
	}
	return ""
}

// detachNetwork removes sandbox id's network, if it has one here.
func (r *Runtime) detachNetwork(h runtime.Handle) error {
	if r.cfg.Net == nil || (h.Net == nil && !r.cfg.Net.Attached(h.ID)) {
		return nil
	}
	return r.cfg.Net.Detach(h.ID)
}

// NetworkDenied reads what a networked VM's policy refused so far.
func (r *Runtime) NetworkDenied(h runtime.Handle) (map[string]int64, error) {
	if h.Net == nil || r.cfg.Net == nil {
		return nil, nil
	}
	return r.cfg.Net.Denied(h.ID)
}

// NetworkDeniedDestinations reads a networked VM's record of refused
// destinations.
func (r *Runtime) NetworkDeniedDestinations(h runtime.Handle) ([]api.NetworkDenial, error) {
	if h.Net == nil || r.cfg.Net == nil {
		return nil, nil
	}
	return r.cfg.Net.Denials(h.ID)
}

// SetEgress replaces a networked VM's egress list.
func (r *Runtime) SetEgress(h runtime.Handle, egress []api.EgressRule) error {
	if h.Net == nil || r.cfg.Net == nil {
		return fmt.Errorf("microvm: sandbox %s has no network", h.ID)
	}
	return r.cfg.Net.SetEgress(h.ID, egress)
}

var (
	_ runtime.NetworkReporter = (*Runtime)(nil)
	_ runtime.NetworkSetter   = (*Runtime)(nil)
)
