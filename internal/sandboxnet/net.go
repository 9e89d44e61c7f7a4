// Package sandboxnet gives a networked sandbox its interface and enforces
// its egress allowlist in the host's kernel (docs/architecture.md,
// "Network").
//
// Each networked sandbox gets a veth pair: the host end (wn<hash>, its
// alias "<owner> <sandbox id>") holds the gateway address, the sandbox end
// ("eth0", created directly in the sandbox's network namespace) the
// sandbox's address, both of one /31 of a node-local pool. The policy
// lives in the edge's nftables table (warren_<owner>, family inet; chains
// o_<id>, h_<id>, a_<id> per sandbox, policy.go) in the host's network
// namespace, where root in the sandbox (no CAP_NET_ADMIN there)
// cannot change it: forwarded packets from the sandbox pass only to
// allowlisted destinations, never to link-local/metadata addresses or to
// other sandboxes; packets to the host itself are refused; everything
// refused is counted per rule; what passes is masqueraded.
//
// Lock order: Manager.listMu, then Manager.groupMu, then Manager.mu. mu
// is held across making and removing the edge's table (with the first networked sandbox, and at
// Close), so that no sandbox's chains go into a table being removed; a
// sandbox's own link and chains are made and removed without it. listMu
// orders a change of a list (SetEgress, held) against the resolver's
// admissions (read-held across matching a name and adding its addresses).
// groupMu is held across the transactions that change a network group's
// set (its making, its members, its removal with the last one: group.go).
package sandboxnet

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
)

// Names of what this package creates on the host; reconcile and the leak
// check look for them.
const (
	LinkPrefix  = "wn"
	TablePrefix = "warren_"
	// DefaultPool is the node-local pool of sandbox addresses.
	DefaultPool = "10.213.0.0/16"
	// SandboxLink is the sandbox's interface name.
	SandboxLink = "eth0"
)

// MetadataPrefix is never reachable from a sandbox (cloud metadata,
// link-local).
var MetadataPrefix = netip.MustParsePrefix("169.254.0.0/16")

// Manager attaches and detaches sandboxes' networks. Its owner tag (a
// hash of the edge's cgroup parent, i.e. of its data directory) is in the
// name of everything it makes, so that two edges on one host (tests) never
// sweep each other's networks.
type Manager struct {
	pool  netip.Prefix
	owner string
	// MaxConns is each sandbox's limit of open connections (set before
	// use; 0 = DefaultMaxConns).
	MaxConns uint32
	// EgressRateMbit is each sandbox's default egress rate limit, in
	// Mbit/s, where its AttachOptions set none (set before use; 0 = no
	// limit).
	EgressRateMbit int
	// IngressRateMbit is each sandbox's default ingress rate limit, in
	// Mbit/s, where its AttachOptions set none (set before use; 0 = no
	// limit).
	IngressRateMbit int
	// Upstream is where the resolver forwards allowed names (host:port;
	// "" = DefaultUpstream). Log is its logger. OnDNSDenial, when set,
	// hears of every refused name. All set before use.
	Upstream    string
	Log         *slog.Logger
	OnDNSDenial func(id string, d DNSDenial)
	// DNSRate and DNSBurst override the resolver's per-sandbox query
	// budget (0: DNSRate, DNSBurst).
	DNSRate, DNSBurst float64

	listMu  sync.RWMutex
	mu      sync.Mutex
	policy  map[string]dnsPolicy // by sandbox id: what the resolver needs
	groupMu sync.Mutex           // held across a grouped sandbox's install or removal
	groups  map[string]string    // by sandbox id: its group's set (g_<hash>)
	// carried: by sandbox id, the packet counts of its host end when its
	// link was made or last parked (reuse.go); none after a restart.
	carried map[string]linkCount
	// installed: by sandbox id, the policy its chains hold (policyKey),
	// so that a reuse with the same policy keeps its rules (reuse.go).
	installed map[string]string
	// baseAt: by sandbox id, its link's packet counts (carried) when its
	// rules' counters were last zero: while they have not moved, no
	// counter has either.
	baseAt  map[string]linkCount
	dns     *resolver      // from the first networked sandbox to Close
	used    map[int]string // /31 index -> sandbox id
	byID    map[string]int
	loaded  bool
	forward bool
	tableUp bool // the edge's table exists (removed with its last sandbox)
	// upgraded: the table has what this edge's createTable makes (it may
	// be an earlier edge's).
	upgraded bool
}

// New makes a Manager over pool (DefaultPool when empty) for the edge
// named by owner.
func New(pool, owner string) (*Manager, error) {
	if pool == "" {
		pool = DefaultPool
	}
	p, err := netip.ParsePrefix(pool)
	if err != nil || !p.Addr().Is4() || p.Bits() > 30 {
		return nil, fmt.Errorf("sandboxnet: pool %q: want an IPv4 CIDR of /30 or larger", pool)
	}
	h := sha256.Sum256([]byte(owner))
	return &Manager{pool: p.Masked(), owner: hex.EncodeToString(h[:4]), used: map[int]string{}, byID: map[string]int{},
		policy: map[string]dnsPolicy{}, groups: map[string]string{}, carried: map[string]linkCount{},
		installed: map[string]string{}, baseAt: map[string]linkCount{}}, nil
}

// Pool is the prefix sandbox addresses come from.
func (m *Manager) Pool() netip.Prefix { return m.pool }

// LinkName is the host end of id's veth pair.
func (m *Manager) LinkName(id string) string {
	h := sha256.Sum256([]byte(m.alias(id)))
	return LinkPrefix + hex.EncodeToString(h[:6])
}

func (m *Manager) alias(id string) string { return m.owner + " " + id }

// tableName is the edge's nftables table.
func (m *Manager) tableName() string { return TablePrefix + m.owner }

// Attachment is a sandbox's network as attached.
type Attachment struct {
	ID      string
	Link    string     // host end
	Address netip.Addr // the sandbox's
	Gateway netip.Addr // the host end's
	Egress  []api.EgressRule
	// MaxConns bounds the sandbox's open connections.
	MaxConns uint32
	// Group is the set of the sandbox's network group (g_<hash>; ""
	// none): its members' addresses, which it may reach and be reached
	// from.
	Group string
	// EgressRateMbit bounds what the sandbox sends (0: no limit).
	EgressRateMbit int
	// IngressRateMbit bounds what is forwarded into it (0: no limit).
	IngressRateMbit int
}

// AttachOptions are a sandbox's network settings beyond its list.
type AttachOptions struct {
	// Group is the key of its network group, unique on the node (project
	// and name; "" = none): it may reach the other members, and they it,
	// on any port and protocol.
	Group string
	// EgressRateMbit bounds what it sends, in Mbit/s (0: the Manager's
	// EgressRateMbit).
	EgressRateMbit int
	// IngressRateMbit bounds what it receives, in Mbit/s (0: the
	// Manager's IngressRateMbit).
	IngressRateMbit int
	// MaxConns bounds its open connections (0: the Manager's MaxConns).
	MaxConns int
}

func (m *Manager) addrs(i int) (gw, sb netip.Addr) {
	b := m.pool.Addr().As4()
	base := binary.BigEndian.Uint32(b[:]) + uint32(2*i)
	var g, s [4]byte
	binary.BigEndian.PutUint32(g[:], base)
	binary.BigEndian.PutUint32(s[:], base+1)
	return netip.AddrFrom4(g), netip.AddrFrom4(s)
}

func (m *Manager) size() int { return 1 << (32 - m.pool.Bits() - 1) }

// loadLocked learns the /31s of links that outlive a restart of the edge
// (adopted sandboxes keep theirs).
func (m *Manager) loadLocked() {
	if m.loaded {
		return
	}
	m.loaded = true
	if ts, err := listTables(); err == nil {
		for _, t := range ts {
			m.tableUp = m.tableUp || t == m.tableName()
		}
	}
	links, err := netlink.LinkList()
	if err != nil {
		return
	}
	for _, l := range links {
		a := l.Attrs()
		id, ok := strings.CutPrefix(a.Alias, m.owner+" ")
		if !strings.HasPrefix(a.Name, LinkPrefix) || !ok {
			continue
		}
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4)
		for _, ad := range addrs {
			ip, ok := netip.AddrFromSlice(ad.IP.To4())
			if !ok || !m.pool.Contains(ip) {
				continue
			}
			b := ip.As4()
			p := m.pool.Addr().As4()
			i := int(binary.BigEndian.Uint32(b[:])-binary.BigEndian.Uint32(p[:])) / 2
			m.used[i], m.byID[id] = id, i
		}
	}
	m.loadGroupsLocked()
}

// alloc picks a free /31 for id: one no sandbox of this manager holds and
// no address of the host is in (another edge's sandboxes on this host).
func (m *Manager) alloc(id string) (int, error) {
	taken := map[netip.Addr]bool{}
	if addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4); err == nil {
		for _, ad := range addrs {
			if ip, ok := netip.AddrFromSlice(ad.IP.To4()); ok && m.pool.Contains(ip) {
				taken[ip] = true
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.loadLocked()
	if i, ok := m.byID[id]; ok {
		return i, nil
	}
	for i := 0; i < m.size(); i++ {
		gw, sb := m.addrs(i)
		if _, ok := m.used[i]; !ok && !taken[gw] && !taken[sb] {
			m.used[i], m.byID[id] = id, i
			return i, nil
		}
	}
	return 0, fmt.Errorf("sandboxnet: address pool %s is exhausted", m.pool)
}

// release frees id's /31.
func (m *Manager) release(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i, ok := m.byID[id]; ok {
		delete(m.used, i)
		delete(m.byID, id)
	}
	delete(m.policy, id)
	delete(m.carried, id)
	delete(m.installed, id)
	delete(m.baseAt, id)
	return nil
}

// Close removes the edge's table when no sandbox of it has a network left
// (the edge stops). The table lives from the first networked sandbox to
// here: making and removing it (hooks, RCU) with every sandbox would cost
// more than the sandbox's own chains.
func (m *Manager) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.loadLocked()
	if len(m.byID) > 0 {
		return nil
	}
	if m.dns != nil {
		m.dns.close()
		m.dns = nil
	}
	if !m.tableUp {
		return nil
	}
	m.tableUp = false
	return deleteTable(m.tableName())
}

// ensureTable makes the edge's table unless it exists.
func (m *Manager) ensureTable() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.loadLocked()
	if !m.tableUp {
		if err := m.createTable(); err != nil {
			return err
		}
		m.tableUp, m.upgraded = true, true
	}
	if !m.upgraded {
		if err := m.upgradeTable(); err != nil {
			return err
		}
		m.upgraded = true
	}
	return m.ensureResolverLocked()
}

// Adopt makes ready what a sandbox that outlived a restart of the edge
// needs of this process: its resolver.
func (m *Manager) Adopt(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.loadLocked()
	if _, ok := m.byID[id]; !ok || !m.tableUp {
		return nil
	}
	return m.ensureResolverLocked()
}

// enableForwarding turns on IPv4 forwarding on the host once.
func (m *Manager) enableForwarding() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.forward {
		return nil
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return fmt.Errorf("sandboxnet: enable forwarding: %w", err)
	}
	m.forward = true
	return nil
}

// Attach gives the sandbox whose network namespace is pid's an interface,
// an address and a default route, and installs its policy. On an error
// nothing of it is left.
func (m *Manager) Attach(id string, pid int, egress []api.EgressRule) (a *Attachment, err error) {
	return m.AttachWith(id, pid, egress, AttachOptions{})
}

// AttachWith is Attach with the settings of opts.
func (m *Manager) AttachWith(id string, pid int, egress []api.EgressRule, opts AttachOptions) (*Attachment, error) {
	return m.attach(id, egress, opts, func(a *Attachment) error { return m.link(a, pid) })
}

// attach allocates id's /31, installs its policy and then makes its link
// with link (a veth pair, or a VM's tap: tap.go). On an error nothing of
// it is left.
func (m *Manager) attach(id string, egress []api.EgressRule, opts AttachOptions, link func(*Attachment) error) (a *Attachment, err error) {
	if err := m.enableForwarding(); err != nil {
		return nil, err
	}
	i, err := m.alloc(id)
	if err != nil {
		return nil, err
	}
	a = m.attachment(id, i, egress, opts)
	defer func() {
		if err != nil {
			_ = m.Detach(id)
		}
	}()
	m.setPolicy(id, egress)
	// The policy comes first: the sandbox's end is never up without it.
	if err := m.ensureTable(); err != nil {
		return nil, err
	}
	if err := m.installPolicy(a); err != nil {
		return nil, err
	}
	if err := link(a); err != nil {
		return nil, err
	}
	return a, nil
}

// attachment is the network of id on the /31 of index i.
func (m *Manager) attachment(id string, i int, egress []api.EgressRule, opts AttachOptions) *Attachment {
	gw, addr := m.addrs(i)
	a := &Attachment{ID: id, Link: m.LinkName(id), Address: addr, Gateway: gw, Egress: egress,
		MaxConns: m.MaxConns, Group: groupSet(opts.Group), EgressRateMbit: opts.EgressRateMbit}
	if a.EgressRateMbit == 0 {
		a.EgressRateMbit = m.EgressRateMbit
	}
	if a.MaxConns == 0 {
		a.MaxConns = DefaultMaxConns
	}
	a.IngressRateMbit = cmp.Or(opts.IngressRateMbit, m.IngressRateMbit)
	if opts.MaxConns > 0 {
		a.MaxConns = uint32(opts.MaxConns)
	}
	return a
}

func (m *Manager) link(a *Attachment, pid int) error {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: a.Link},
		PeerName: SandboxLink, PeerNamespace: netlink.NsPid(pid)}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("sandboxnet: add veth %s: %w", a.Link, err)
	}
	host, err := netlink.LinkByName(a.Link)
	if err != nil {
		return fmt.Errorf("sandboxnet: find %s: %w", a.Link, err)
	}
	if err := m.hostEnd(a, host); err != nil {
		return err
	}
	ns, err := netns.GetFromPid(pid)
	if err != nil {
		return fmt.Errorf("sandboxnet: netns of %d: %w", pid, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE) // one socket, not one per family
	if err != nil {
		return fmt.Errorf("sandboxnet: netlink in netns of %d: %w", pid, err)
	}
	defer h.Close()
	in, err := h.LinkByName(SandboxLink)
	if err != nil {
		return fmt.Errorf("sandboxnet: find sandbox end: %w", err)
	}
	// No IPv6 on the sandbox's end either: its IPv6 is closed, and its
	// link carries nothing (no router solicitation, no MLD report) that
	// the sandbox did not send (Park reads that).
	if err := disableIPv6In(int(ns), SandboxLink); err != nil {
		return err
	}
	if err := h.AddrAdd(in, &netlink.Addr{IPNet: ipnet(a.Address, 31)}); err != nil {
		return fmt.Errorf("sandboxnet: sandbox address: %w", err)
	}
	if err := h.LinkSetUp(in); err != nil {
		return fmt.Errorf("sandboxnet: sandbox end up: %w", err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: in.Attrs().Index, Gw: net.IP(a.Gateway.AsSlice())}); err != nil {
		return fmt.Errorf("sandboxnet: default route: %w", err)
	}
	m.mu.Lock()
	m.carried[a.ID] = linkCount{} // a new link has carried nothing
	m.mu.Unlock()
	return nil
}

// hostEnd sets up the host end of a's link: its alias (how Sweep and
// Owned find it), the gateway address, no IPv6, up.
func (m *Manager) hostEnd(a *Attachment, host netlink.Link) error {
	// No IPv6 on the host end: the sandbox's IPv6 is closed.
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+a.Link+"/disable_ipv6", []byte("1"), 0o644)
	if err := netlink.LinkSetAlias(host, m.alias(a.ID)); err != nil {
		return fmt.Errorf("sandboxnet: alias %s: %w", a.Link, err)
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipnet(a.Gateway, 31)}); err != nil {
		return fmt.Errorf("sandboxnet: address %s: %w", a.Link, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("sandboxnet: up %s: %w", a.Link, err)
	}
	return nil
}

// disableIPv6In turns IPv6 off on link in the network namespace nsfd
// (its /proc/sys/net is the namespace of the thread that opens it).
func disableIPv6In(nsfd int, link string) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("sandboxnet: own network namespace: %w", err)
			return
		}
		defer unix.Close(home)
		if err := unix.Setns(nsfd, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("sandboxnet: enter the sandbox's network namespace: %w", err)
			return
		}
		err = os.WriteFile("/proc/sys/net/ipv6/conf/"+link+"/disable_ipv6", []byte("1"), 0o644)
		if errors.Is(err, os.ErrNotExist) {
			err = nil // no IPv6 in this kernel
		}
		if unix.Setns(home, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread() // else the thread ends with the goroutine
		}
		if err != nil {
			err = fmt.Errorf("sandboxnet: disable IPv6 of the sandbox's end: %w", err)
		}
		errc <- err
	}()
	return <-errc
}

func ipnet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}
}

// Detach removes id's veth pair and table and frees its address. Missing
// parts are no error.
func (m *Manager) Detach(id string) error {
	var errs []error
	if l, err := netlink.LinkByName(m.LinkName(id)); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("sandboxnet: delete %s: %w", m.LinkName(id), err))
		}
	}
	if err := m.removePolicy(id); err != nil {
		errs = append(errs, err)
	}
	if err := m.release(id); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Release is Detach for a sandbox whose network namespace has no process
// left: the kernel removes the veth pair with the namespace (its cleanup
// is batched and off this path, where deleting the link here waits ~30 ms
// for RCU), so only its chains go here. The /31 is free at once: alloc
// skips any pair whose address a host link still holds.
func (m *Manager) Release(id string) error {
	return errors.Join(m.removePolicy(id), m.release(id))
}

// Attached says whether id has a network here.
func (m *Manager) Attached(id string) bool {
	_, err := netlink.LinkByName(m.LinkName(id))
	return err == nil
}

// Sweep removes every warren link and table whose sandbox id live does not
// hold (reconcile at start). It returns the ids it removed.
func (m *Manager) Sweep(live func(id string) bool) ([]string, error) {
	seen := map[string]bool{}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("sandboxnet: list links: %w", err)
	}
	var errs []error
	var gone []string
	for _, l := range links {
		a := l.Attrs()
		id, ok := strings.CutPrefix(a.Alias, m.owner+" ")
		if !ok || a.Name != m.LinkName(id) || live(id) {
			continue
		}
		if err := m.Detach(id); err != nil {
			errs = append(errs, err)
		}
		seen[id] = true
		gone = append(gone, id)
	}
	ids, err := m.chainIDs()
	if err != nil {
		return gone, errors.Join(append(errs, err)...)
	}
	for _, id := range ids {
		if seen[id] || live(id) {
			continue
		}
		if err := m.Detach(id); err != nil {
			errs = append(errs, err)
		}
		gone = append(gone, id)
	}
	if err := m.sweepGroups(); err != nil {
		errs = append(errs, err)
	}
	// A table left without sandboxes (a crash after the last one went).
	if err := m.Close(); err != nil {
		errs = append(errs, err)
	}
	return gone, errors.Join(errs...)
}

// Owned lists the host links and nftables tables that the edge named by
// owner has made and not removed (leak checks).
func Owned(owner string) ([]string, error) {
	m, err := New("", owner)
	if err != nil {
		return nil, err
	}
	var out []string
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("sandboxnet: list links: %w", err)
	}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Alias, m.owner+" ") {
			out = append(out, "link "+l.Attrs().Name+" ("+l.Attrs().Alias+")")
		}
	}
	tables, err := listTables()
	if err != nil {
		return out, err
	}
	for _, t := range tables {
		if t == m.tableName() {
			out = append(out, "nftables table "+t)
			ids, err := m.chainIDs()
			if err != nil {
				return out, err
			}
			for _, id := range ids {
				out = append(out, "nftables chains of "+id)
			}
			sets, err := m.sandboxSets()
			if err != nil {
				return out, err
			}
			for _, s := range sets {
				out = append(out, "nftables set "+s)
			}
			groups, err := m.groupSets()
			if err != nil {
				return out, err
			}
			for name, addrs := range groups {
				l := "nftables set " + name + " ("
				for _, a := range addrs {
					l += " " + a.String()
				}
				out = append(out, l+" )")
			}
		}
	}
	return out, nil
}
