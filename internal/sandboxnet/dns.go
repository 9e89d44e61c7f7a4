package sandboxnet

// The node's resolver for networked sandboxes (docs/network.md): one UDP
// and one TCP socket on a port of the host, which every sandbox reaches
// as its gateway's port 53 (a redirect in the edge's table, so the
// sandbox's /etc/resolv.conf names its gateway). A query is answered only
// for names the sandbox's host entries allow (exact or "*.suffix"), or
// any name when it has "internet"; the answer comes from the upstream
// resolver, and its A records are admitted to the sandbox's allowlist
// (its n_/na_ sets, elements that time out with the record's TTL) before
// the answer goes back. Every other name gets NXDOMAIN and is recorded
// as a denial. AAAA queries of allowed names are answered empty (IPv6 is
// closed).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
)

// DenyDNS is the reason of a refused name.
const DenyDNS = "dns"

// MaxDNSDenials bounds a sandbox's record of refused names.
const MaxDNSDenials = 256

// A sandbox's queries are answered at DNSRate a second on average, bursts
// of DNSBurst (Manager.DNSRate, DNSBurst when set); past that, REFUSED
// (counted, reason DenyDNSRate), so that a flood of queries costs the
// node little and its neighbours nothing.
const (
	DNSRate     = 200
	DNSBurst    = 400
	DenyDNSRate = "dns-rate"
)

// minAdmit is the shortest an admitted address stays allowed: a record of
// TTL 0 is still connectable right after its answer.
const minAdmit = 2 * time.Second

// DefaultUpstream is the host's resolver (the first nameserver of
// /etc/resolv.conf), or "" when it has none.
func DefaultUpstream() string {
	c, err := dns.ClientConfigFromFile("/etc/resolv.conf")
	if err != nil || len(c.Servers) == 0 {
		return ""
	}
	return net.JoinHostPort(c.Servers[0], c.Port)
}

// DNSDenial is one refused name.
type DNSDenial struct {
	Time time.Time
	Name string
	Type string // "A", "AAAA", …
}

// resolver is the node's DNS server for sandboxes. Its sockets live from
// the first networked sandbox to Manager.Close.
type resolver struct {
	m        *Manager
	upstream string
	port     int
	log      *slog.Logger
	udp, tcp *dns.Server
}

func nameOfSets(id string) (addrPort, addrOnly string) { return "n_" + id, "na_" + id }

func admitSets(t *nftables.Table, id string) (ap, a *nftables.Set) {
	n, na := nameOfSets(id)
	ap = &nftables.Set{Table: t, Name: n, Concatenation: true, HasTimeout: true,
		KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeInetProto, nftables.TypeInetService)}
	a = &nftables.Set{Table: t, Name: na, HasTimeout: true, KeyType: nftables.TypeIPAddr}
	return ap, a
}

// dnsTag is the conntrack mark of connections opened to addresses the
// resolver admitted under one list of host entries: they stay allowed
// after the admission times out, until the list changes.
func dnsTag(hosts []api.EgressRule) []byte {
	h := fnv.New32a()
	for _, r := range hosts {
		h.Write([]byte(r.String() + "\n"))
	}
	return binaryutil.NativeEndian.PutUint32(0x57000000 | h.Sum32()&0xffffff)
}

// dnsRules are o_<id>'s rules that pass what the resolver admitted.
func dnsRules(id string, hosts []api.EgressRule) [][]expr.Any {
	tag := dnsTag(hosts)
	n, na := nameOfSets(id)
	setMark := []expr.Any{&expr.Immediate{Register: 1, Data: tag},
		&expr.Ct{Key: expr.CtKeyMARK, Register: 1, SourceRegister: true},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: allowedChain(id)}}
	return [][]expr.Any{
		cat(established(), []expr.Any{&expr.Ct{Key: expr.CtKeyMARK, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: tag},
			&expr.Verdict{Kind: expr.VerdictJump, Chain: allowedChain(id)}}),
		cat([]expr.Any{
			&expr.Payload{DestRegister: 8, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 9},
			&expr.Payload{DestRegister: 10, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 8, SetName: n}}, setMark),
		cat([]expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: na}}, setMark),
	}
}

// startResolver opens the resolver's sockets (a port free for both UDP
// and TCP) and serves.
func (m *Manager) startResolver() (*resolver, error) {
	r := &resolver{m: m, upstream: m.Upstream, log: m.Log}
	if r.log == nil {
		r.log = slog.Default()
	}
	if r.upstream == "" {
		r.upstream = DefaultUpstream()
	}
	var errs []error
	for try := 0; try < 20; try++ {
		pc, err := net.ListenPacket("udp4", "0.0.0.0:0")
		if err != nil {
			return nil, fmt.Errorf("sandboxnet: resolver: %w", err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp4", "0.0.0.0:"+strconv.Itoa(port))
		if err != nil {
			pc.Close()
			errs = append(errs, err)
			continue
		}
		r.port = port
		r.udp = &dns.Server{PacketConn: pc, Handler: r}
		r.tcp = &dns.Server{Listener: ln, Handler: r}
		started := make(chan struct{}, 2)
		for _, s := range []*dns.Server{r.udp, r.tcp} {
			s.NotifyStartedFunc = func() { started <- struct{}{} }
			go func() { _ = s.ActivateAndServe() }()
		}
		<-started
		<-started
		return r, nil
	}
	return nil, fmt.Errorf("sandboxnet: resolver: no port free for UDP and TCP: %w", errors.Join(errs...))
}

func (r *resolver) close() {
	_ = r.udp.Shutdown()
	_ = r.tcp.Shutdown()
}

// redirectRules points the sandboxes' port 53 (any address of the pool:
// their gateways) at the resolver's port.
func redirectRules(t *nftables.Table, ch *nftables.Chain, links *nftables.Set, pool netip.Prefix, port int) []*nftables.Rule {
	var out []*nftables.Rule
	for _, p := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		out = append(out, &nftables.Rule{Table: t, Chain: ch, Exprs: cat(
			[]expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
				&expr.Lookup{SourceRegister: 1, SetName: links.Name}},
			nfproto(expr.CmpOpEq, unix.NFPROTO_IPV4), ip4(16, expr.CmpOpEq, pool),
			[]expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(53)},
				&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(uint16(port))},
				&expr.Redir{RegisterProtoMin: 1}})})
	}
	return out
}

const chainDNS = "dns"

// ensureResolverLocked starts the resolver (once) and points the table's
// redirect at it (again after a restart of the edge: the port changes).
// m.mu is held; the table exists.
func (m *Manager) ensureResolverLocked() error {
	if m.dns != nil {
		return nil
	}
	r, err := m.startResolver()
	if err != nil {
		return err
	}
	c, err := nftables.New()
	if err != nil {
		r.close()
		return fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	t := m.table()
	_, _, links := m.sets(t)
	ch := c.AddChain(&nftables.Chain{Name: chainDNS, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	c.FlushChain(ch)
	for _, rule := range redirectRules(t, ch, links, m.pool, r.port) {
		c.AddRule(rule)
	}
	if err := c.Flush(); err != nil {
		r.close()
		return fmt.Errorf("sandboxnet: resolver redirect: %w", err)
	}
	m.dns = r
	return nil
}

// sandboxAt is the id of the sandbox whose address is a.
func (m *Manager) sandboxAt(a netip.Addr) string {
	if !a.Is4() || !m.pool.Contains(a) {
		return ""
	}
	b, p := a.As4(), m.pool.Addr().As4()
	off := binary.BigEndian.Uint32(b[:]) - binary.BigEndian.Uint32(p[:])
	if off%2 != 1 {
		return ""
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used[int(off/2)]
}

// ServeDNS answers one query of a sandbox.
func (r *resolver) ServeDNS(w dns.ResponseWriter, q *dns.Msg) {
	src, _ := netip.ParseAddrPort(w.RemoteAddr().String())
	id := r.m.sandboxAt(src.Addr().Unmap())
	fail := func(code int) {
		out := new(dns.Msg)
		out.SetRcode(q, code)
		_ = w.WriteMsg(out)
	}
	if id == "" {
		fail(dns.RcodeRefused)
		return
	}
	if !r.m.allowQuery(id) {
		fail(dns.RcodeRefused)
		return
	}
	if len(q.Question) != 1 {
		fail(dns.RcodeFormatError)
		return
	}
	qs := q.Question[0]
	name := strings.ToLower(strings.TrimSuffix(qs.Name, "."))
	hosts, internet := r.m.hostsOf(id)
	var matched []api.EgressRule
	for _, h := range hosts {
		if api.MatchHost(h.Host, name) {
			matched = append(matched, h)
		}
	}
	if len(matched) == 0 && !internet {
		r.m.recordDNSDenial(id, DNSDenial{Time: time.Now(), Name: name, Type: dns.TypeToString[qs.Qtype]})
		fail(dns.RcodeNameError)
		return
	}
	if qs.Qtype == dns.TypeAAAA {
		out := new(dns.Msg)
		out.SetReply(q)
		_ = w.WriteMsg(out)
		return
	}
	resp, err := r.forward(q, w.RemoteAddr().Network())
	if err != nil {
		r.log.Debug("sandboxnet: resolver upstream", "id", id, "name", name, "err", err)
		fail(dns.RcodeServerFailure)
		return
	}
	if len(matched) > 0 {
		if err := r.m.admitIfListed(id, name, resp.Answer); err != nil {
			r.log.Warn("sandboxnet: admit resolved addresses", "id", id, "name", name, "err", err)
			fail(dns.RcodeServerFailure)
			return
		}
	}
	resp.Id = q.Id
	if w.LocalAddr().Network() == "udp" {
		size := dns.MinMsgSize
		if o := q.IsEdns0(); o != nil {
			size = int(o.UDPSize())
		}
		resp.Truncate(size) // the client asks again over TCP
	}
	_ = w.WriteMsg(resp)
}

func (r *resolver) forward(q *dns.Msg, network string) (*dns.Msg, error) {
	if r.upstream == "" {
		return nil, errors.New("no upstream resolver")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := &dns.Client{Net: "udp"}
	if strings.HasPrefix(network, "tcp") {
		c.Net = "tcp"
	}
	resp, _, err := c.ExchangeContext(ctx, q, r.upstream)
	if err == nil && resp.Truncated && c.Net == "udp" {
		c.Net = "tcp"
		resp, _, err = c.ExchangeContext(ctx, q, r.upstream)
	}
	return resp, err
}

// admitIfListed admits the answer's addresses for the entries of id's
// list that match name now (under listMu: the list cannot change in
// between; an answer to a name taken off meanwhile admits nothing).
func (m *Manager) admitIfListed(id, name string, answer []dns.RR) error {
	m.listMu.RLock()
	defer m.listMu.RUnlock()
	hosts, _ := m.hostsOf(id)
	var matched []api.EgressRule
	for _, h := range hosts {
		if api.MatchHost(h.Host, name) {
			matched = append(matched, h)
		}
	}
	if len(matched) == 0 {
		return nil
	}
	return m.admit(id, matched, answer)
}

// admit adds the answer's A addresses to id's sets for the records' TTL,
// for every matched entry's port and protocol.
func (m *Manager) admit(id string, matched []api.EgressRule, answer []dns.RR) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	ap, a := admitSets(m.table(), id)
	var apEls, aEls []nftables.SetElement
	for _, rr := range answer {
		rec, ok := rr.(*dns.A)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(rec.A.To4())
		if !ok || MetadataPrefix.Contains(ip) || m.pool.Contains(ip) {
			continue // never reachable, whatever a name says
		}
		ttl := max(time.Duration(rec.Hdr.Ttl)*time.Second, minAdmit)
		b := ip.As4()
		for _, h := range matched {
			if h.Port == 0 {
				aEls = append(aEls, nftables.SetElement{Key: b[:], Timeout: ttl})
				continue
			}
			protos := []byte{unix.IPPROTO_TCP, unix.IPPROTO_UDP}
			switch h.Proto {
			case "tcp":
				protos = protos[:1]
			case "udp":
				protos = protos[1:]
			}
			for _, p := range protos {
				k := make([]byte, 12)
				copy(k, b[:])
				k[4] = p
				binary.BigEndian.PutUint16(k[8:], h.Port)
				apEls = append(apEls, nftables.SetElement{Key: k, Timeout: ttl})
			}
		}
	}
	if len(apEls)+len(aEls) == 0 {
		return nil
	}
	// An element admitted before keeps its first timeout when added
	// again: delete and add renews it. Deleting one that is not there
	// fails the transaction, so without the deletes on a failure.
	for _, renew := range []bool{true, false} {
		if renew {
			_ = c.SetDeleteElements(ap, apEls)
			_ = c.SetDeleteElements(a, aEls)
		}
		if len(apEls) > 0 {
			if err := c.SetAddElements(ap, apEls); err != nil {
				return fmt.Errorf("sandboxnet: admit: %w", err)
			}
		}
		if len(aEls) > 0 {
			if err := c.SetAddElements(a, aEls); err != nil {
				return fmt.Errorf("sandboxnet: admit: %w", err)
			}
		}
		if err = c.Flush(); err == nil {
			return nil
		}
	}
	return fmt.Errorf("sandboxnet: admit %s's addresses: %w", id, err)
}

// hostsOf is id's host entries and whether it has "internet" (read from
// its chain after a restart of the edge).
func (m *Manager) hostsOf(id string) ([]api.EgressRule, bool) {
	m.mu.Lock()
	p, ok := m.policy[id]
	m.mu.Unlock()
	if ok {
		return p.hosts, p.internet
	}
	c, err := nftables.New()
	if err != nil {
		return nil, false
	}
	t := m.table()
	rules, err := c.GetRules(t, &nftables.Chain{Name: outChain(id), Table: t})
	if err != nil {
		return nil, false
	}
	var pol dnsPolicy
	for _, r := range rules {
		u := string(r.UserData)
		if h, ok := strings.CutPrefix(u, markHost); ok {
			if e, err := api.ParseEgress(h); err == nil && e.Host != "" {
				pol.hosts = append(pol.hosts, e)
			}
		}
		pol.internet = pol.internet || u == markInternet
	}
	m.mu.Lock()
	if _, ok := m.byID[id]; ok {
		m.policy[id] = pol
	}
	m.mu.Unlock()
	return pol.hosts, pol.internet
}

// dnsPolicy is what the resolver needs of a sandbox's list.
type dnsPolicy struct {
	hosts    []api.EgressRule
	internet bool
	denials  []DNSDenial // the last MaxDNSDenials
	denied   int64
	// The query budget (DNSRate, DNSBurst) and what went over it.
	tokens  float64
	refill  time.Time
	limited int64
}

// allowQuery takes one query from id's budget.
func (m *Manager) allowQuery(id string) bool {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.policy[id]
	if !ok {
		return true // known from the kernel on the next query (hostsOf)
	}
	rate, burst := float64(DNSRate), float64(DNSBurst)
	if m.DNSRate > 0 {
		rate, burst = m.DNSRate, m.DNSBurst
	}
	if p.refill.IsZero() {
		p.tokens = burst
	} else {
		p.tokens = min(burst, p.tokens+now.Sub(p.refill).Seconds()*rate)
	}
	p.refill = now
	allowed := p.tokens >= 1
	if allowed {
		p.tokens--
	} else {
		p.limited++
	}
	m.policy[id] = p
	return allowed
}

// UserData of o_<id>'s rules that match nothing and keep the list's
// names in the kernel, for the resolver after a restart of the edge.
const (
	markHost     = "host "
	markInternet = "internet"
)

func (m *Manager) setPolicy(id string, egress []api.EgressRule) {
	var pol dnsPolicy
	for _, e := range egress {
		switch {
		case e.Host != "":
			pol.hosts = append(pol.hosts, e)
		case e.Internet:
			pol.internet = true
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.policy[id]
	pol.denials, pol.denied = old.denials, old.denied
	pol.tokens, pol.refill, pol.limited = old.tokens, old.refill, old.limited
	m.policy[id] = pol
}

func (m *Manager) recordDNSDenial(id string, d DNSDenial) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p, ok := m.policy[id]
	if !ok {
		return
	}
	p.denied++
	p.denials = append(p.denials, d)
	if len(p.denials) > MaxDNSDenials {
		p.denials = p.denials[len(p.denials)-MaxDNSDenials:]
	}
	m.policy[id] = p
	if m.OnDNSDenial != nil {
		go m.OnDNSDenial(id, d)
	}
}

// DNSLimited is how many of id's queries went over its budget.
func (m *Manager) DNSLimited(id string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.policy[id].limited
}

// DNSDenials is id's record of refused names, oldest first, and how many
// were refused in all.
func (m *Manager) DNSDenials(id string) ([]DNSDenial, int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.policy[id]
	return append([]DNSDenial(nil), p.denials...), p.denied
}

// ResolverPort is the host port the resolver serves on (0 before the
// first networked sandbox).
func (m *Manager) ResolverPort() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dns == nil {
		return 0
	}
	return m.dns.port
}
