package sandboxnet

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
)

// Reasons a packet is refused: the UserData of the counting rules and the
// keys of api.SandboxNetwork.DeniedBy.
const (
	DenyNotAllowed = "not-allowed"
	DenyMetadata   = "metadata"
	DenyHost       = "host"
	DenySandbox    = "sandbox"
	DenySpoofed    = "spoofed"
	DenyIPv6       = "ipv6"
	DenyConnLimit  = "conn-limit"
	// DenyRateLimit: a packet over the sandbox's egress rate, dropped.
	DenyRateLimit = "rate-limit"
	// DenyPrivate: a private, loopback, shared or multicast address that
	// "internet" does not open (only an entry naming it does).
	DenyPrivate = "private"
)

// PrivatePrefixes are what "internet" leaves closed.
var PrivatePrefixes = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/8"), netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"), netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"), netip.MustParsePrefix("224.0.0.0/3")}

// DefaultMaxConns is a sandbox's limit of open connections (tracked by
// the host's conntrack) when the Manager sets none.
const DefaultMaxConns = 4096

const (
	chainForward = "forward"
	chainInbound = "forward-in"
	chainInput   = "input"
	chainNAT     = "postrouting"
)

func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

func nfproto(op expr.CmpOp, p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: []byte{p}}}
}

// ip4 matches the IPv4 source (offset 12) or destination (16) against p.
func ip4(offset uint32, op expr.CmpOp, p netip.Prefix) []expr.Any {
	a := p.Addr().As4()
	ex := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4}}
	if p.Bits() < 32 {
		mask := make([]byte, 4)
		for i := 0; i < p.Bits(); i++ {
			mask[i/8] |= 0x80 >> (i % 8)
		}
		ex = append(ex, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)})
	}
	return append(ex, &expr.Cmp{Op: op, Register: 1, Data: a[:]})
}

func established() []expr.Any {
	return []expr.Any{&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)}}
}

func isTCP() []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}}}
}

func rejectAdmin() expr.Any {
	return &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}
}

func verdict(k expr.VerdictKind) expr.Any { return &expr.Verdict{Kind: k} }

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// allowRules turns one egress rule into the expressions that accept it.
// A port without a protocol allows it on TCP and UDP.
func allowRules(r api.EgressRule) [][]expr.Any {
	dst := ip4(16, expr.CmpOpEq, r.Prefix)
	if r.Port == 0 && r.Proto == "" {
		return [][]expr.Any{cat(dst, []expr.Any{verdict(expr.VerdictAccept)})}
	}
	protos := []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP}
	switch r.Proto {
	case "tcp":
		protos = protos[:1]
	case "udp":
		protos = protos[1:]
	}
	var out [][]expr.Any
	for _, p := range protos {
		ex := cat(dst, []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}})
		if r.Port != 0 {
			ex = append(ex, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(r.Port)})
		}
		out = append(out, append(ex, verdict(expr.VerdictAccept)))
	}
	return out
}

// The edge's table (warren_<owner>, family inet) holds the hooks, shared
// by its sandboxes; each sandbox has regular chains of its own, reached
// through verdict maps keyed by its link's name, so a packet costs one
// lookup however many sandboxes run, and a start or stop adds or removes
// chains and map elements without hooking or unhooking anything (which
// waits for RCU).
const (
	mapOut   = "out_by_link"  // iifname -> jump o_<id>
	mapHost  = "host_by_link" // iifname -> jump h_<id>
	setLinks = "links"        // every sandbox link
)

func outChain(id string) string  { return "o_" + id }
func deniedSet(id string) string { return "d_" + id }

// MaxDeniedDestinations bounds a sandbox's record of refused destinations
// (one element per destination, protocol, port and reason, with a count);
// past it refusals are still counted by reason, not by destination.
const MaxDeniedDestinations = 1024

// Reason codes in the denied set's keys.
var reasonCodes = map[string]byte{DenyNotAllowed: 1, DenyMetadata: 2, DenySandbox: 3, DenyHost: 4, DenyPrivate: 5}

func deniedSetOf(t *nftables.Table, id string) *nftables.Set {
	return &nftables.Set{Table: t, Name: deniedSet(id), Concatenation: true, Dynamic: true, Counter: true,
		Size:    MaxDeniedDestinations,
		KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService, nftables.TypeMark)}
}

// recordDenied adds (or counts again) the packet's destination, protocol,
// port and reason in the sandbox's denied set. A rule of its own before
// the refusal: when the set is full, this rule stops and the next still
// refuses.
func recordDenied(id, reason string) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 8, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
		&expr.Payload{DestRegister: 10, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Immediate{Register: 11, Data: []byte{reasonCodes[reason], 0, 0, 0}},
		&expr.Dynset{SrcRegKey: 8, SetName: deniedSet(id), Operation: unix.NFT_DYNSET_OP_UPDATE},
	}
}
func hostChain(id string) string    { return "h_" + id }
func allowedChain(id string) string { return "a_" + id }

func (m *Manager) table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: m.tableName()}
}

func (m *Manager) sets(t *nftables.Table) (out, host, links *nftables.Set) {
	out = &nftables.Set{Table: t, Name: mapOut, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
	host = &nftables.Set{Table: t, Name: mapHost, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
	links = &nftables.Set{Table: t, Name: setLinks, KeyType: nftables.TypeIFName}
	return out, host, links
}

// createTable makes the edge's table: its hooks and generic rules.
func (m *Manager) createTable() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	t := c.AddTable(m.table())
	out, host, links := m.sets(t)
	inm := inMap(t)
	for _, s := range []*nftables.Set{out, host, links, inm} {
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("sandboxnet: set %s: %w", s.Name, err)
		}
	}
	accept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: chainForward, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	// Into sandboxes runs after every sandbox's own outbound chain, so
	// that a sandbox reaching another is refused (and counted) as the
	// sender's, not silently dropped here.
	into := c.AddChain(&nftables.Chain{Name: chainInbound, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityRef(10), Policy: &accept})
	in := c.AddChain(&nftables.Chain{Name: chainInput, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	post := c.AddChain(&nftables.Chain{Name: chainNAT, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	add := func(ch *nftables.Chain, ex []expr.Any) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: ex}) }
	meta := func(k expr.MetaKey) expr.Any { return &expr.Meta{Key: k, Register: 1} }
	vmap := func(s *nftables.Set) expr.Any {
		return &expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: s.Name, SetID: s.ID}
	}
	member := func(s *nftables.Set, invert bool) expr.Any {
		return &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID, Invert: invert}
	}
	add(fwd, []expr.Any{meta(expr.MetaKeyIIFNAME), vmap(out)})
	// The resolver's port, reached through the redirect of port 53 (the
	// only destination NAT of the sandboxes' packets), before the host's
	// refusal.
	add(in, []expr.Any{meta(expr.MetaKeyIIFNAME), member(links, false),
		&expr.Ct{Register: 1, Key: expr.CtKeySTATUS},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(0x20), Xor: make([]byte, 4)}, // IPS_DST_NAT
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)}, verdict(expr.VerdictAccept)})
	add(in, []expr.Any{meta(expr.MetaKeyIIFNAME), vmap(host)})
	// Into a sandbox from another: what the sender's o_<id> let through
	// (its group; it refuses every other sandbox address). From anywhere
	// else: replies only. First, each sandbox's ingress rate.
	c.AddRule(inByLink(t, into, inm))
	c.AddRule(betweenLinks(t, into))
	add(into, cat([]expr.Any{meta(expr.MetaKeyOIFNAME), member(links, false)}, established(), []expr.Any{verdict(expr.VerdictAccept)}))
	add(into, []expr.Any{meta(expr.MetaKeyOIFNAME), member(links, false), verdict(expr.VerdictDrop)})
	// What leaves a sandbox through another interface leaves as the host.
	add(post, cat(nfproto(expr.CmpOpEq, unix.NFPROTO_IPV4), ip4(12, expr.CmpOpEq, m.pool),
		[]expr.Any{meta(expr.MetaKeyOIFNAME), member(links, true), &expr.Masq{}}))
	if err := c.Flush(); err != nil {
		return fmt.Errorf("sandboxnet: create table %s: %w", m.tableName(), err)
	}
	return nil
}

// tagBetweenLinks marks forward-in's rule that lets through what one
// sandbox link forwards to another (a table made before groups lacks it).
const tagBetweenLinks = "between-links"

func betweenLinks(t *nftables.Table, into *nftables.Chain) *nftables.Rule {
	return &nftables.Rule{Table: t, Chain: into, UserData: []byte(tagBetweenLinks), Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, &expr.Lookup{SourceRegister: 1, SetName: setLinks},
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1}, &expr.Lookup{SourceRegister: 1, SetName: setLinks},
		verdict(expr.VerdictAccept)}}
}

// upgradeTable adds to a table made by an earlier edge (it outlives
// restarts with its sandboxes) what this one's createTable makes and it
// lacks: forward-in's rule between links, and before it the lookup of
// ingress rates (with its map).
func (m *Manager) upgradeTable() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	t := m.table()
	into := &nftables.Chain{Name: chainInbound, Table: t}
	rules, err := c.GetRules(t, into)
	if err != nil {
		return fmt.Errorf("sandboxnet: read %s/%s: %w", t.Name, chainInbound, err)
	}
	has := map[string]bool{}
	for _, r := range rules {
		has[string(r.UserData)] = true
	}
	if has[tagBetweenLinks] && has[tagInByLink] {
		return nil
	}
	if !has[tagBetweenLinks] {
		c.InsertRule(betweenLinks(t, into))
	}
	if !has[tagInByLink] { // inserted first: before between-links
		inm := inMap(t)
		if err := c.AddSet(inm, nil); err != nil {
			return fmt.Errorf("sandboxnet: set %s: %w", inm.Name, err)
		}
		c.InsertRule(inByLink(t, into, inm))
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("sandboxnet: upgrade %s: %w", t.Name, err)
	}
	return nil
}

// installPolicy adds a's chains and map elements in one transaction.
func (m *Manager) installPolicy(a *Attachment) error { return m.writePolicy(a, false) }

// writePolicy writes a's policy in one transaction: into new chains, sets
// and map elements, or (parked) into the chains and sets that Park
// emptied, which the map elements name already.
func (m *Manager) writePolicy(a *Attachment, parked bool) error {
	if a.Group != "" {
		m.groupMu.Lock()
		defer m.groupMu.Unlock()
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	t := m.table()
	fwd, in, allowed, err := policyChains(c, t, a.ID, parked)
	if err != nil {
		return err
	}
	allowedRules(c, allowed, a)
	if a.Group != "" {
		if err := m.joinGroup(c, t, a); err != nil {
			return err
		}
	}
	m.outRules(c, fwd, a.ID, a.Address, a.Group, a.Egress)
	if err := m.addIngress(c, t, a, parked); err != nil {
		return fmt.Errorf("sandboxnet: map %s: %w", mapIn, err)
	}

	// The host itself (every address it has, the gateway too) is never
	// reachable. IPv6 (the kernel's own neighbour discovery) is dropped
	// uncounted: the host end has no IPv6.
	addRule(c, in, "", cat(nfproto(expr.CmpOpNeq, unix.NFPROTO_IPV4), []expr.Any{verdict(expr.VerdictDrop)}))
	addRule(c, in, "", recordDenied(a.ID, DenyHost))
	refuseRules(c, in, DenyHost)

	if parked {
		if err := c.Flush(); err != nil {
			return fmt.Errorf("sandboxnet: write %s's chains: %w", a.ID, err)
		}
		m.joined(a)
		m.written(a)
		return nil
	}
	if err := m.addLink(c, t, a); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("sandboxnet: install %s's chains: %w", a.ID, err)
	}
	m.joined(a)
	m.written(a)
	return nil
}

// policyChains returns sandbox id's chains (o_, h_ and a_) in the
// transaction c: added with its sets (denied, admitted), or (parked)
// emptied with them.
func policyChains(c *nftables.Conn, t *nftables.Table, id string, parked bool) (fwd, in, allowed *nftables.Chain, err error) {
	ap, aa := admitSets(t, id)
	fwd = &nftables.Chain{Name: outChain(id), Table: t}
	in = &nftables.Chain{Name: hostChain(id), Table: t}
	allowed = &nftables.Chain{Name: allowedChain(id), Table: t}
	if parked {
		emptyPolicy(c, t, id)
		return fwd, in, allowed, nil
	}
	fwd, in, allowed = c.AddChain(fwd), c.AddChain(in), c.AddChain(allowed)
	for _, s := range []*nftables.Set{deniedSetOf(t, id), ap, aa} {
		if err := c.AddSet(s, nil); err != nil {
			return nil, nil, nil, fmt.Errorf("sandboxnet: set %s: %w", s.Name, err)
		}
	}
	return fwd, in, allowed, nil
}

// allowedRules writes a_<id>, where allowed destinations jump: replies
// pass, and a new connection passes one rule that counts the sandbox's
// open connections (its own list, so a scan or a flood fills its share of
// the host's connection tracking, not the host's). With an egress rate,
// what goes past it is dropped first.
func allowedRules(c *nftables.Conn, allowed *nftables.Chain, a *Attachment) {
	if a.EgressRateMbit > 0 {
		// What the sandbox sends past its rate (and a burst of 100 ms of
		// it, at least 64 KiB) is dropped: TCP backs off to the rate.
		rate := uint64(a.EgressRateMbit) * 1000 * 1000 / 8
		addRule(c, allowed, DenyRateLimit, []expr.Any{&expr.Limit{Type: expr.LimitTypePktBytes, Rate: rate, Over: true,
			Unit: expr.LimitTimeSecond, Burst: uint32(max(rate/10, 64<<10))}, &expr.Counter{}, verdict(expr.VerdictDrop)})
	}
	addRule(c, allowed, "", cat(established(), []expr.Any{verdict(expr.VerdictAccept)}))
	addRule(c, allowed, DenyConnLimit, []expr.Any{&expr.Connlimit{Count: a.MaxConns, Flags: expr.NFT_CONNLIMIT_F_INV},
		&expr.Counter{}, rejectAdmin()})
	addRule(c, allowed, "", []expr.Any{verdict(expr.VerdictAccept)})
}

// addLink adds a's link to the transaction c: the forward and host maps'
// elements that jump to its chains, and its entry in the set of links.
func (m *Manager) addLink(c *nftables.Conn, t *nftables.Table, a *Attachment) error {
	outMap, hostMap, links := m.sets(t)
	key := ifname(a.Link)
	if err := c.SetAddElements(outMap, []nftables.SetElement{{Key: key,
		VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: outChain(a.ID)}}}); err != nil {
		return fmt.Errorf("sandboxnet: map %s: %w", mapOut, err)
	}
	if err := c.SetAddElements(hostMap, []nftables.SetElement{{Key: key,
		VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: hostChain(a.ID)}}}); err != nil {
		return fmt.Errorf("sandboxnet: map %s: %w", mapHost, err)
	}
	if err := c.SetAddElements(links, []nftables.SetElement{{Key: key}}); err != nil {
		return fmt.Errorf("sandboxnet: set %s: %w", setLinks, err)
	}
	return nil
}

// addRule adds a rule of exprs ex to ch (in ch's table) in the
// transaction c, named by reason (its user data) unless reason is empty.
func addRule(c *nftables.Conn, ch *nftables.Chain, reason string, ex []expr.Any) {
	r := &nftables.Rule{Table: ch.Table, Chain: ch, Exprs: ex}
	if reason != "" {
		r.UserData = []byte(reason)
	}
	c.AddRule(r)
}

// counted puts a counter before ex.
func counted(ex ...expr.Any) []expr.Any { return append([]expr.Any{&expr.Counter{}}, ex...) }

// refuseRules adds to ch the rules that count and refuse what match
// selects: a TCP connect with a reset (never rate-limited, unlike ICMP
// errors, so a refused connect is not retried and counts once), anything
// else with an ICMP administratively-prohibited.
func refuseRules(c *nftables.Conn, ch *nftables.Chain, reason string, match ...[]expr.Any) {
	m := cat(match...)
	addRule(c, ch, reason, cat(m, isTCP(), counted(&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})))
	addRule(c, ch, reason, cat(m, counted(rejectAdmin())))
}

// joined records a's group (none: nothing).
func (m *Manager) joined(a *Attachment) {
	if a.Group != "" {
		m.mu.Lock()
		m.groups[a.ID] = a.Group
		m.mu.Unlock()
	}
}

// emptyPolicy empties id's chains and sets in the transaction c.
func emptyPolicy(c *nftables.Conn, t *nftables.Table, id string) {
	for _, ch := range []string{outChain(id), hostChain(id), allowedChain(id)} {
		c.FlushChain(&nftables.Chain{Name: ch, Table: t})
	}
	ap, aa := admitSets(t, id)
	for _, s := range []*nftables.Set{deniedSetOf(t, id), ap, aa} {
		c.FlushSet(s)
	}
}

// outRules writes o_<id>: what leaves the sandbox. Every packet of it,
// not only a connection's first, must be allowed by the list, so that a
// connection to a destination taken off the list (SetEgress) is cut at
// its next packet.
func (m *Manager) outRules(c *nftables.Conn, fwd *nftables.Chain, id string, addr netip.Addr, group string, egress []api.EgressRule) {
	add := func(reason string, ex []expr.Any) { addRule(c, fwd, reason, ex) }
	refuse := func(reason string, match ...[]expr.Any) {
		m := cat(match...)
		add("", cat(m, recordDenied(id, reason)))
		refuseRules(c, fwd, reason, m)
	}
	add(DenyIPv6, cat(nfproto(expr.CmpOpNeq, unix.NFPROTO_IPV4), counted(rejectAdmin())))
	add(DenySpoofed, cat(ip4(12, expr.CmpOpNeq, netip.PrefixFrom(addr, 32)), counted(verdict(expr.VerdictDrop))))
	refuse(DenyMetadata, ip4(16, expr.CmpOpEq, MetadataPrefix))
	if group != "" {
		add("", groupRule(id, group))
	}
	refuse(DenySandbox, ip4(16, expr.CmpOpEq, m.pool))
	var hosts []api.EgressRule
	internet := false
	for _, r := range egress {
		switch {
		case r.Host != "":
			hosts = append(hosts, r)
			add(markHost+r.String(), nfproto(expr.CmpOpEq, 255)) // matches nothing: the name kept
			continue
		case r.Internet:
			internet = true
			continue
		case r.Rule != "":
			continue // expanded by the edge
		}
		for _, ex := range allowRules(r) {
			ex[len(ex)-1] = &expr.Verdict{Kind: expr.VerdictJump, Chain: allowedChain(id)}
			add("", ex)
		}
	}
	if len(hosts) > 0 {
		for _, ex := range dnsRules(id, hosts) {
			add("", ex)
		}
	}
	if internet {
		add(markInternet, nfproto(expr.CmpOpEq, 255))
		for _, p := range PrivatePrefixes {
			refuse(DenyPrivate, ip4(16, expr.CmpOpEq, p))
		}
		add("", []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: allowedChain(id)}})
	}
	refuse(DenyNotAllowed)
}

// SetEgress replaces a running sandbox's allowlist in one transaction:
// new connections obey it when this returns, and a connection to a
// destination no longer listed is refused (a TCP reset) at its next
// packet. The counters of the old rules carry over.
func (m *Manager) SetEgress(id string, egress []api.EgressRule) error {
	// No admission of resolved addresses runs across the change: one
	// matched against the old names would land after the flush.
	m.listMu.Lock()
	defer m.listMu.Unlock()
	m.mu.Lock()
	i, ok := m.byID[id]
	group := m.groups[id]
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("sandboxnet: %s has no network here", id)
	}
	_, addr := m.addrs(i)
	before, err := m.Denied(id)
	if err != nil {
		return err
	}
	oldHosts, _ := m.hostsOf(id)
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	fwd := &nftables.Chain{Name: outChain(id), Table: m.table()}
	c.FlushChain(fwd)
	m.setPolicy(id, egress)
	if newHosts, _ := m.hostsOf(id); string(dnsTag(newHosts)) != string(dnsTag(oldHosts)) {
		// Names no longer listed: what they admitted goes now.
		ap, aa := admitSets(m.table(), id)
		c.FlushSet(ap)
		c.FlushSet(aa)
	}
	m.outRules(c, fwd, id, addr, group, egress)
	// The old counts go into a rule that matches nothing, so that Denied
	// keeps summing them.
	for reason, n := range before {
		if n > 0 && reason != DenyConnLimit && reason != DenyRateLimit && reason != DenyIngressRate && reason != DenyHost && reason != DenyDNS && reason != DenyDNSRate {
			c.AddRule(&nftables.Rule{Table: fwd.Table, Chain: fwd, UserData: []byte(reason),
				Exprs: cat(nfproto(expr.CmpOpEq, 255), []expr.Any{&expr.Counter{Packets: uint64(n)}})})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("sandboxnet: set %s's egress: %w", id, err)
	}
	m.mu.Lock()
	delete(m.installed, id) // o_<id> holds another list now
	m.mu.Unlock()
	return nil
}

// removePolicy removes id's map elements and chains (missing ones are no
// error).
func (m *Manager) removePolicy(id string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	t := m.table()
	outMap, hostMap, links := m.sets(t)
	key := ifname(m.LinkName(id))
	m.groupMu.Lock()
	defer m.groupMu.Unlock()
	leave, drop := m.leaveGroupSteps(c, t, id)
	// One transaction; when it fails (something of it is gone already:
	// a sweep after a crash), each step alone, so that one missing part
	// does not keep the others.
	steps := []func(){
		func() { _ = c.SetDeleteElements(outMap, []nftables.SetElement{{Key: key}}) },
		func() { _ = c.SetDeleteElements(hostMap, []nftables.SetElement{{Key: key}}) },
		func() { _ = c.SetDeleteElements(links, []nftables.SetElement{{Key: key}}) },
		func() { _ = c.SetDeleteElements(inMap(t), []nftables.SetElement{{Key: key}}) },
		func() {
			for _, ch := range []string{outChain(id), hostChain(id), allowedChain(id), inChain(id)} {
				c.FlushChain(&nftables.Chain{Name: ch, Table: t})
			}
		},
		func() {
			for _, ch := range []string{outChain(id), hostChain(id), allowedChain(id)} {
				c.DelChain(&nftables.Chain{Name: ch, Table: t})
			}
		},
		func() { c.DelChain(&nftables.Chain{Name: inChain(id), Table: t}) }, // none before ingress rates
		func() {
			n, na := nameOfSets(id)
			for _, s := range []string{deniedSet(id), n, na} {
				c.DelSet(&nftables.Set{Table: t, Name: s})
			}
		},
	}
	if leave != nil {
		steps = append([]func(){leave}, steps...)
	}
	if drop != nil {
		steps = append(steps, drop)
	}
	for _, step := range steps {
		step()
	}
	if err := c.Flush(); err == nil {
		return nil
	}
	var errs []error
	for _, step := range steps {
		step()
		if err := c.Flush(); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("sandboxnet: remove %s's policy: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

// chainIDs lists the sandboxes that have chains in the edge's table.
func (m *Manager) chainIDs() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("sandboxnet: list chains: %w", err)
	}
	var ids []string
	for _, ch := range chains {
		if ch.Table.Name == m.tableName() && strings.HasPrefix(ch.Name, "o_") {
			ids = append(ids, strings.TrimPrefix(ch.Name, "o_"))
		}
	}
	return ids, nil
}

// sandboxSets lists the per-sandbox sets (d_, n_, na_) in the edge's
// table.
func (m *Manager) sandboxSets() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	sets, err := c.GetSets(m.table())
	if err != nil {
		return nil, fmt.Errorf("sandboxnet: list sets: %w", err)
	}
	var out []string
	for _, s := range sets {
		if strings.HasPrefix(s.Name, "d_") || strings.HasPrefix(s.Name, "n_") || strings.HasPrefix(s.Name, "na_") {
			out = append(out, s.Name)
		}
	}
	return out, nil
}

func deleteTable(name string) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: name})
	if err := c.Flush(); err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("sandboxnet: delete table %s: %w", name, err)
	}
	return nil
}

func listTables() ([]string, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("sandboxnet: list tables: %w", err)
	}
	var out []string
	for _, t := range ts {
		if strings.HasPrefix(t.Name, TablePrefix) {
			out = append(out, t.Name)
		}
	}
	return out, nil
}

// Denied reads id's refusal counters by reason (packets).
func (m *Manager) Denied(id string) (map[string]int64, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	t := m.table()
	out := map[string]int64{}
	for _, ch := range []string{outChain(id), hostChain(id), allowedChain(id), inChain(id)} {
		rules, err := c.GetRules(t, &nftables.Chain{Name: ch, Table: t})
		if err != nil && ch == inChain(id) {
			continue // made by an edge before ingress rates
		}
		if err != nil {
			return nil, fmt.Errorf("sandboxnet: read %s/%s: %w", t.Name, ch, err)
		}
		for _, r := range rules {
			if len(r.UserData) == 0 {
				continue
			}
			for _, e := range r.Exprs {
				if cn, ok := e.(*expr.Counter); ok {
					out[string(r.UserData)] += int64(cn.Packets)
				}
			}
		}
	}
	if _, n := m.DNSDenials(id); n > 0 {
		out[DenyDNS] = n
	}
	if n := m.DNSLimited(id); n > 0 {
		out[DenyDNSRate] = n
	}
	return out, nil
}

// resetCounters zeroes the counters of id's rules in the kernel:
// NFT_MSG_GETRULE_RESET dumps a chain's rules and resets their stateful
// expressions, rule by rule, without a transaction (nothing is
// validated, nothing but the counts changes). google/nftables has no call
// for it, so the message goes through the netlink library it uses.
func (m *Manager) resetCounters(id string) error {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return fmt.Errorf("sandboxnet: netfilter socket: %w", err)
	}
	defer conn.Close()
	for _, ch := range []string{outChain(id), hostChain(id), allowedChain(id), inChain(id)} {
		attrs, err := netlink.MarshalAttributes([]netlink.Attribute{
			{Type: unix.NFTA_RULE_TABLE, Data: []byte(m.tableName() + "\x00")},
			{Type: unix.NFTA_RULE_CHAIN, Data: []byte(ch + "\x00")},
		})
		if err != nil {
			return err
		}
		msg := netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETRULE_RESET),
				Flags: netlink.Request | netlink.Dump},
			// nfgenmsg: family, version, resource id (big endian).
			Data: append([]byte{unix.NFPROTO_INET, unix.NFNETLINK_V0, 0, 0}, attrs...),
		}
		if _, err := conn.Execute(msg); err != nil {
			if ch == inChain(id) && errors.Is(err, unix.ENOENT) {
				continue // made by an edge before ingress rates
			}
			return fmt.Errorf("sandboxnet: reset the counters of %s: %w", ch, err)
		}
	}
	return nil
}

// DeniedDestinations reads id's record of refused destinations, most
// refused first.
func (m *Manager) DeniedDestinations(id string) ([]api.NetworkDenial, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	els, err := c.GetSetElements(deniedSetOf(m.table(), id))
	if err != nil {
		return nil, fmt.Errorf("sandboxnet: read %s: %w", deniedSet(id), err)
	}
	reasons := map[byte]string{}
	for r, code := range reasonCodes {
		reasons[code] = r
	}
	var out []api.NetworkDenial
	for _, el := range els {
		k := el.Key
		if len(k) < 13 {
			continue
		}
		d := api.NetworkDenial{Reason: reasons[k[12]]}
		ip := netip.AddrFrom4([4]byte(k[0:4]))
		switch k[4] {
		case unix.IPPROTO_TCP, unix.IPPROTO_UDP:
			d.Protocol = map[byte]string{unix.IPPROTO_TCP: "tcp", unix.IPPROTO_UDP: "udp"}[k[4]]
			d.Destination = netip.AddrPortFrom(ip, binary.BigEndian.Uint16(k[8:10])).String()
		case unix.IPPROTO_ICMP:
			d.Protocol, d.Destination = "icmp", ip.String()
		default:
			d.Protocol, d.Destination = strconv.Itoa(int(k[4])), ip.String()
		}
		if el.Counter != nil {
			d.Count = int64(el.Counter.Packets)
		}
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Destination < out[j].Destination
	})
	return out, nil
}

// Denials is sandbox id's record of refused destinations (DeniedDestinations)
// followed by the names its resolver refused, each with its count.
func (m *Manager) Denials(id string) ([]api.NetworkDenial, error) {
	out, err := m.DeniedDestinations(id)
	if err != nil {
		return nil, err
	}
	names, _ := m.DNSDenials(id)
	at := map[string]int{}
	for _, d := range names {
		i, ok := at[d.Name]
		if !ok {
			i, at[d.Name] = len(out), len(out)
			out = append(out, api.NetworkDenial{Destination: d.Name, Protocol: "dns", Reason: DenyDNS})
		}
		out[i].Count++
	}
	return out, nil
}
