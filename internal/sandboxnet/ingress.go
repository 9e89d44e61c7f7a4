package sandboxnet

// Ingress rate: what is forwarded into a sandbox's link (from the
// internet, or from a member of its group) past its rate is dropped and
// counted (DenyIngressRate). Forward-in looks a packet's output link up in
// the verdict map in_by_link and jumps to the sandbox's i_<id>, which
// holds the limit (empty without one) and returns.

import (
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// DenyIngressRate: a packet into the sandbox over its ingress rate,
// dropped.
const DenyIngressRate = "ingress-rate-limit"

const (
	mapIn       = "in_by_link" // oifname -> jump i_<id>
	tagInByLink = "in-by-link" // forward-in's rule that looks it up
)

func inChain(id string) string { return "i_" + id }

func inMap(t *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: t, Name: mapIn, IsMap: true, KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
}

// inByLink is forward-in's first rule: into a sandbox link, its i_<id>.
func inByLink(t *nftables.Table, into *nftables.Chain, m *nftables.Set) *nftables.Rule {
	return &nftables.Rule{Table: t, Chain: into, UserData: []byte(tagInByLink), Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: m.Name, SetID: m.ID}}}
}

// ingressRule is i_<id>'s limit: bytes past rateMbit (and a burst of
// 100 ms of it, at least 64 KiB) are dropped and counted. TCP senders
// back off to the rate.
func ingressRule(t *nftables.Table, ch *nftables.Chain, rateMbit int) *nftables.Rule {
	rate := uint64(rateMbit) * 1000 * 1000 / 8
	return &nftables.Rule{Table: t, Chain: ch, UserData: []byte(DenyIngressRate), Exprs: []expr.Any{
		&expr.Limit{Type: expr.LimitTypePktBytes, Rate: rate, Over: true, Unit: expr.LimitTimeSecond,
			Burst: uint32(max(rate/10, 64<<10))}, &expr.Counter{}, verdict(expr.VerdictDrop)}}
}

// addIngress adds, in c's transaction, a's i_<id> and its map element;
// parked, it empties the chain of the previous sandbox's rule first (an
// edge before ingress rates made none: adding it first makes the flush
// valid either way).
func (m *Manager) addIngress(c *nftables.Conn, t *nftables.Table, a *Attachment, parked bool) error {
	ch := c.AddChain(&nftables.Chain{Name: inChain(a.ID), Table: t})
	if parked {
		c.FlushChain(ch)
	}
	if a.IngressRateMbit > 0 {
		c.AddRule(ingressRule(t, ch, a.IngressRateMbit))
	}
	return c.SetAddElements(inMap(t), []nftables.SetElement{{Key: ifname(a.Link),
		VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: inChain(a.ID)}}})
}
