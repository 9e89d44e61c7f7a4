package sandboxnet

import (
	"errors"
	"fmt"
	"net"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
)

// A recycled container keeps its network (docs/architecture.md, "Recycled
// containers"): making a network namespace's veth pair, its addresses and
// route costs more than the rest of a recycled create. Park, when the
// container is wiped, takes away its group membership and resolver state, the host's connection tracking entries of its address
// and the neighbour entries on both ends of its link. Reassign, when the
// container serves the next sandbox, installs that sandbox's policy on the
// same link and address, into the same chains and sets, emptied of every
// rule and element of the previous sandbox (its counters, refusal
// record, admitted addresses) in the same transaction, exactly as Attach
// would on a new one (without making chains, sets and map elements
// again); when the new sandbox's policy is the one its chains hold, it
// keeps the rules and only empties the sets and resets the counters
// (resetPolicy). Wipe has
// already refused a namespace that holds any socket. Root in a sandbox has
// no CAP_NET_ADMIN, so it could change neither the link's addresses nor
// its routes: they are as Attach left them.

// Park removes the policy and the kernel state of the network of id (a
// container whose every process but its agent is gone; pid is the agent's)
// and keeps its link and address for Reassign. Nothing runs behind a
// parked link to send.
func (m *Manager) Park(id string, pid int) error {
	m.mu.Lock()
	i, ok := m.byID[id]
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("sandboxnet: %s has no network here", id)
	}
	if err := m.parkPolicy(id); err != nil {
		return err
	}
	m.mu.Lock()
	delete(m.policy, id) // its names, budget and refused names
	m.mu.Unlock()
	_, addr := m.addrs(i)
	return m.scrub(id, pid, net.IP(addr.AsSlice()))
}

// parkPolicy takes a grouped id out of its group at once (its group's
// members must not reach a parked address): in one transaction with
// emptying its chains and sets and refusing everything from its link
// until Reassign. An id without a group keeps its rules until Reassign
// empties and refills them in its one transaction (nothing runs behind
// the link meanwhile), which saves a commit per reuse. The chains, sets
// and map elements stay for the next sandbox.
func (m *Manager) parkPolicy(id string) error {
	m.mu.Lock()
	_, grouped := m.groups[id]
	m.mu.Unlock()
	if !grouped {
		return nil
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	t := m.table()
	m.groupMu.Lock()
	defer m.groupMu.Unlock()
	leave, drop := m.leaveGroupSteps(c, t, id)
	if leave != nil {
		leave()
	}
	emptyPolicy(c, t, id)
	for _, ch := range []string{outChain(id), hostChain(id)} {
		c.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: ch, Table: t}, Exprs: []expr.Any{verdict(expr.VerdictDrop)}})
	}
	if drop != nil {
		drop() // after the chain that named the set was emptied
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("sandboxnet: park %s's policy: %w", id, err)
	}
	m.mu.Lock()
	delete(m.installed, id) // its chains now refuse everything
	m.mu.Unlock()
	return nil
}

// linkCount is what a host end has received and sent, in packets.
type linkCount struct{ rx, tx uint64 }

// scrub deletes the host's connection tracking entries to and from addr
// and the neighbour entries of the host's end of id's link and of the
// sandbox's (in pid's network namespace). The connection tracking table
// is read whole to find them (~10 ms under load with its 262,144
// buckets), so that is skipped when the link has carried no packet
// either way since it was made or last scrubbed: no entry can be its
// (IPv6 is off on both ends, so the kernel sends nothing on its own).
// Neither can a neighbour entry on either end (one is made only by
// resolving, which sends; root in the sandbox has no CAP_NET_ADMIN to
// add one), so a quiet link is not entered at all.
func (m *Manager) scrub(id string, pid int, addr net.IP) error {
	var errs []error
	link := m.LinkName(id)
	host, err := netlink.LinkByName(link)
	if err != nil {
		return fmt.Errorf("sandboxnet: find %s: %w", link, err)
	}
	var now linkCount
	if st := host.Attrs().Statistics; st != nil {
		now = linkCount{st.RxPackets, st.TxPackets}
	}
	m.mu.Lock()
	was, known := m.carried[id]
	m.mu.Unlock()
	if known && now == was && host.Attrs().Statistics != nil {
		return nil
	}
	var src, dst netlink.ConntrackFilter
	if err := errors.Join(src.AddIP(netlink.ConntrackOrigSrcIP, addr), dst.AddIP(netlink.ConntrackOrigDstIP, addr)); err != nil {
		return err
	}
	if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, &src, &dst); err != nil {
		errs = append(errs, fmt.Errorf("sandboxnet: connection tracking of %s: %w", addr, err))
	}
	if err := flushNeigh(nil, host.Attrs().Index); err != nil {
		errs = append(errs, err)
	}
	if err := flushSandboxNeigh(pid); err != nil {
		errs = append(errs, err)
	}
	m.mu.Lock()
	if len(errs) == 0 {
		m.carried[id] = now
	} else {
		delete(m.carried, id) // the next park cleans it whole again
	}
	m.mu.Unlock()
	return errors.Join(errs...)
}

// flushSandboxNeigh deletes the neighbour entries of the sandbox's end of
// its link, in pid's network namespace.
func flushSandboxNeigh(pid int) error {
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return fmt.Errorf("sandboxnet: netns of %d: %w", pid, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("sandboxnet: netlink in netns of %d: %w", pid, err)
	}
	defer h.Close()
	in, err := h.LinkByName(SandboxLink)
	if err != nil {
		return fmt.Errorf("sandboxnet: find sandbox end: %w", err)
	}
	return flushNeigh(h, in.Attrs().Index)
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
	m.mu.Lock()
	same := m.installed[id] != "" && m.installed[id] == policyKey(a)
	m.mu.Unlock()
	if same && m.resetPolicy(id) == nil {
		return a, nil
	}
	// Otherwise (another policy, or a kernel without the counters'
	// reset) the rules are written again.
	if err := m.writePolicy(a, true); err != nil {
		return nil, err
	}
	return a, nil
}

// policyKey is everything of a that its chains' rules are written from.
func policyKey(a *Attachment) string {
	return fmt.Sprintf("%s|%s|%d|%d|%d|%+v", a.Address, a.Group, a.MaxConns, a.EgressRateMbit, a.IngressRateMbit, a.Egress)
}

// written records that id's chains hold a's policy, with fresh counters.
// A new link has carried nothing; a parked one what Park saw (nothing
// runs behind it since).
func (m *Manager) written(a *Attachment) {
	m.mu.Lock()
	m.installed[a.ID] = policyKey(a)
	if n, ok := m.carried[a.ID]; ok {
		m.baseAt[a.ID] = n
	} else {
		delete(m.baseAt, a.ID)
	}
	m.mu.Unlock()
}

// resetPolicy is a reuse whose new sandbox has the policy that id's
// chains hold already (the common case: the same task's next sandbox).
// Writing ~30 rules is most of a reuse's cost (a commit that adds rules
// also makes the kernel validate the table), so the rules stay; what
// the previous sandbox left in them goes: its refusal record
// and admitted addresses (sets, emptied in a transaction that adds no
// rule and hence validates nothing), and its counts (the kernel resets
// the rules' counters, resetCounters). The rules' rate-limit buckets
// carry over; they hold no data of the previous user.
func (m *Manager) resetPolicy(id string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	t := m.table()
	ap, aa := admitSets(t, id)
	for _, s := range []*nftables.Set{deniedSetOf(t, id), ap, aa} {
		c.FlushSet(s)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("sandboxnet: reset %s's sets: %w", id, err)
	}
	// Every packet a counter counts crossed the link: while its counts
	// (as Park read them) have not moved since the counters were zero,
	// they still are.
	m.mu.Lock()
	now, known := m.carried[id]
	at, zeroed := m.baseAt[id]
	m.mu.Unlock()
	if known && zeroed && now == at {
		return nil
	}
	if err := m.resetCounters(id); err != nil {
		return err
	}
	m.mu.Lock()
	if known {
		m.baseAt[id] = now
	} else {
		delete(m.baseAt, id)
	}
	m.mu.Unlock()
	return nil
}
