package sandboxnet

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"syscall"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
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
)

// DefaultMaxConns is a sandbox's limit of open connections (tracked by
// the host's conntrack) when the Manager sets none.
const DefaultMaxConns = 4096

const (
	chainForward = "forward"
	chainInbound = "forward-in"
	chainInput   = "input"
	chainNAT     = "postrouting"
	chainAllowed = "allowed"
)

func ifname(n string) []byte {
	b := make([]byte, 16)
	copy(b, n)
	return b
}

func iif(op expr.CmpOp, name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: ifname(name)}}
}

func oif(op expr.CmpOp, name string) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: ifname(name)}}
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

// installPolicy writes a's table in one transaction.
func installPolicy(a *Attachment, pool netip.Prefix) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: a.Table})
	accept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: chainForward, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	// Into the sandbox runs after every sandbox's own outbound chain, so
	// that a sandbox reaching another is refused (and counted) as the
	// sender's, not silently dropped as the receiver's.
	into := c.AddChain(&nftables.Chain{Name: chainInbound, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityRef(10), Policy: &accept})
	in := c.AddChain(&nftables.Chain{Name: chainInput, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	post := c.AddChain(&nftables.Chain{Name: chainNAT, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	add := func(ch *nftables.Chain, reason string, ex []expr.Any) {
		r := &nftables.Rule{Table: t, Chain: ch, Exprs: ex}
		if reason != "" {
			r.UserData = []byte(reason)
		}
		c.AddRule(r)
	}
	counted := func(ex ...expr.Any) []expr.Any { return append([]expr.Any{&expr.Counter{}}, ex...) }
	// refuse counts and refuses what match selects: a TCP connect with a
	// reset (never rate-limited, unlike ICMP errors, so a refused connect
	// is not retried and counts once), anything else with an ICMP
	// administratively-prohibited.
	refuse := func(ch *nftables.Chain, reason string, match ...[]expr.Any) {
		m := cat(match...)
		add(ch, reason, cat(m, isTCP(), counted(&expr.Reject{Type: unix.NFT_REJECT_TCP_RST})))
		add(ch, reason, cat(m, counted(rejectAdmin())))
	}
	self := netip.PrefixFrom(a.Address, 32)

	// Into the sandbox: replies only.
	add(into, "", cat(oif(expr.CmpOpEq, a.Link), established(), []expr.Any{verdict(expr.VerdictAccept)}))
	add(into, "", cat(oif(expr.CmpOpEq, a.Link), []expr.Any{verdict(expr.VerdictDrop)}))
	// Out of it: everything else in this chain is about the sandbox's packets.
	add(fwd, "", cat(iif(expr.CmpOpNeq, a.Link), []expr.Any{verdict(expr.VerdictReturn)}))
	add(fwd, DenyIPv6, cat(nfproto(expr.CmpOpNeq, unix.NFPROTO_IPV4), counted(rejectAdmin())))
	add(fwd, DenySpoofed, cat(ip4(12, expr.CmpOpNeq, self), counted(verdict(expr.VerdictDrop))))
	add(fwd, "", cat(established(), []expr.Any{verdict(expr.VerdictAccept)}))
	refuse(fwd, DenyMetadata, ip4(16, expr.CmpOpEq, MetadataPrefix))
	refuse(fwd, DenySandbox, ip4(16, expr.CmpOpEq, pool))
	// Allowed destinations jump to one rule that counts the sandbox's
	// open connections (its own list, so a scan or a flood fills its
	// share of the host's connection tracking, not the host's).
	allowed := c.AddChain(&nftables.Chain{Name: chainAllowed, Table: t})
	add(allowed, DenyConnLimit, []expr.Any{&expr.Connlimit{Count: a.MaxConns, Flags: expr.NFT_CONNLIMIT_F_INV},
		&expr.Counter{}, rejectAdmin()})
	add(allowed, "", []expr.Any{verdict(expr.VerdictAccept)})
	for _, r := range a.Egress {
		for _, ex := range allowRules(r) {
			ex[len(ex)-1] = &expr.Verdict{Kind: expr.VerdictJump, Chain: chainAllowed}
			add(fwd, "", ex)
		}
	}
	refuse(fwd, DenyNotAllowed)

	// The host itself (every address it has, the gateway too) is never
	// reachable. IPv6 (the kernel's own neighbour discovery) is dropped
	// uncounted: the host end has no IPv6.
	add(in, "", cat(iif(expr.CmpOpEq, a.Link), nfproto(expr.CmpOpNeq, unix.NFPROTO_IPV4), []expr.Any{verdict(expr.VerdictDrop)}))
	refuse(in, DenyHost, iif(expr.CmpOpEq, a.Link))

	// What leaves through any other interface leaves as the host.
	add(post, "", cat(nfproto(expr.CmpOpEq, unix.NFPROTO_IPV4), ip4(12, expr.CmpOpEq, self),
		oif(expr.CmpOpNeq, a.Link), []expr.Any{&expr.Masq{}}))
	if err := c.Flush(); err != nil {
		return fmt.Errorf("sandboxnet: install table %s: %w", a.Table, err)
	}
	return nil
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
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: m.TableName(id)}
	out := map[string]int64{}
	for _, ch := range []string{chainForward, chainInput, chainAllowed} {
		rules, err := c.GetRules(t, &nftables.Chain{Name: ch, Table: t})
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
	return out, nil
}
