package sandboxnet

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
)

// A recycled container keeps its network (docs/architecture.md, "Recycled
// containers"): making a network namespace's veth pair, its addresses and
// route costs more than the rest of a recycled create. Park, when the
// container is wiped, takes away everything of its sandbox's network that
// is not the link itself: its chains, sets and map elements (so its
// counters, refusal record, admitted names and group membership), its
// resolver state, the host's connection tracking entries of its address
// and the neighbour entries on both ends of its link. Reassign, when the
// container serves the next sandbox, installs that sandbox's policy on the
// same link and address, exactly as Attach would on a new one. Wipe has
// already refused a namespace that holds any socket. Root in a sandbox has
// no CAP_NET_ADMIN, so it could change neither the link's addresses nor
// its routes: they are as Attach left them.

// Park removes the policy and the kernel state of the network of id (a
// container whose every process but its agent is gone; pid is the agent's)
// and keeps its link and address for Reassign. While parked, its link is
// in no set of the edge's table: nothing runs behind it to send.
func (m *Manager) Park(id string, pid int) error {
	m.mu.Lock()
	i, ok := m.byID[id]
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("sandboxnet: %s has no network here", id)
	}
	if err := m.removePolicy(id); err != nil {
		return err
	}
	m.mu.Lock()
	delete(m.policy, id) // its names, budget and refused names
	m.mu.Unlock()
	_, addr := m.addrs(i)
	return m.scrub(m.LinkName(id), pid, net.IP(addr.AsSlice()))
}

// scrub deletes the host's connection tracking entries to and from addr
// and the neighbour entries of the host's end of the link and of the
// sandbox's (in pid's network namespace).
func (m *Manager) scrub(link string, pid int, addr net.IP) error {
	var errs []error
	var src, dst netlink.ConntrackFilter
	if err := errors.Join(src.AddIP(netlink.ConntrackOrigSrcIP, addr), dst.AddIP(netlink.ConntrackOrigDstIP, addr)); err != nil {
		return err
	}
	if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, &src, &dst); err != nil {
		errs = append(errs, fmt.Errorf("sandboxnet: connection tracking of %s: %w", addr, err))
	}
	if host, err := netlink.LinkByName(link); err != nil {
		errs = append(errs, fmt.Errorf("sandboxnet: find %s: %w", link, err))
	} else if err := flushNeigh(nil, host.Attrs().Index); err != nil {
		errs = append(errs, err)
	}
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("sandboxnet: netns of %d: %w", pid, err))...)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("sandboxnet: netlink in netns of %d: %w", pid, err))...)
	}
	defer h.Close()
	in, err := h.LinkByName(SandboxLink)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("sandboxnet: find sandbox end: %w", err))...)
	}
	return errors.Join(append(errs, flushNeigh(h, in.Attrs().Index))...)
}

// flushNeigh deletes every neighbour entry of link index (h nil: the
// host's namespace).
func flushNeigh(h *netlink.Handle, index int) error {
	list, del := netlink.NeighList, netlink.NeighDel
	if h != nil {
		list, del = h.NeighList, h.NeighDel
	}
	ns, err := list(index, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("sandboxnet: neighbours: %w", err)
	}
	var errs []error
	for i := range ns {
		if err := del(&ns[i]); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("sandboxnet: delete neighbour %s: %w", ns[i].IP, err))
		}
	}
	return errors.Join(errs...)
}

// Reassign gives the parked network of id (Park) the policy of a new
// sandbox: egress and opts, as AttachWith would. On an error the caller
// destroys the container (Release).
func (m *Manager) Reassign(id string, egress []api.EgressRule, opts AttachOptions) (*Attachment, error) {
	m.mu.Lock()
	i, ok := m.byID[id]
	m.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("sandboxnet: %s has no network here", id)
	}
	a := m.attachment(id, i, egress, opts)
	m.setPolicy(id, egress)
	if err := m.ensureTable(); err != nil {
		return nil, err
	}
	if err := m.installPolicy(a); err != nil {
		return nil, err
	}
	return a, nil
}
