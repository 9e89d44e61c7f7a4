package api

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// NetworkSpec is the create request's opt-in network (docs/api.md,
// "Network"). Absent, a sandbox has loopback only. Present, it gets an
// interface, an address and a default route, and may open connections to
// the destinations of Egress only: everything else is refused in the
// host's kernel and counted.
type NetworkSpec struct {
	// Egress lists the allowed destinations: "CIDR[:PORT][/PROTO]",
	// "ADDR[:PORT][/PROTO]", "HOST[:PORT][/PROTO]" (a DNS name, or
	// "*.suffix" for every name under suffix: the sandbox's resolver
	// answers it and admits its addresses), the name of a network rule
	// ("pypi", PUT /v1/network-rules/{name}) or "internet"; PROTO "tcp"
	// or "udp" (default any), PORT 1-65535 (default any). Empty: nothing
	// but the interface. In JSON, the string "internet" alone stands for
	// ["internet"].
	Egress []string `json:"egress"`
	// Group, when set, names the sandbox's network group: sandboxes of
	// one project created with the same group reach each other on any
	// port and protocol, both ways, and no other sandbox. A group lives
	// on one node: placement sends every member to the node that holds
	// the group's first (503 with reason network_group when that node
	// cannot take one more). Set at create only; a list change
	// (PUT …/network) keeps it.
	Group string `json:"group,omitempty"`
	// EgressRateMbit bounds what the sandbox sends, in Mbit/s (0: the
	// node's default, --net-egress-rate-mbit; none without it). Set at
	// create only.
	EgressRateMbit int `json:"egress_rate_mbit,omitempty"`
	// IngressRateMbit bounds what is forwarded into the sandbox (its
	// downloads, what its group sends it), in Mbit/s (0: the node's
	// default, --net-ingress-rate-mbit; none without it). Set at create
	// only.
	IngressRateMbit int `json:"ingress_rate_mbit,omitempty"`
	// MaxConns bounds the sandbox's open connections (0: the node's
	// --net-max-conns, 4096 without it); past it a new connection is
	// refused (conn-limit). Set at create only.
	MaxConns int `json:"max_conns,omitempty"`
}

// MaxNetConns bounds NetworkSpec.MaxConns.
const MaxNetConns = 65536

// MaxEgressRateMbit bounds NetworkSpec.EgressRateMbit and
// NetworkSpec.IngressRateMbit.
const MaxEgressRateMbit = 100000

// NetworkGroupKey is how a node's view (Node.NetworkGroups) names a
// project's network group: groups of different projects never meet.
func NetworkGroupKey(project, group string) string { return project + "/" + group }

// NetworkGroupRE is a valid NetworkSpec.Group.
var NetworkGroupRE = regexp.MustCompile(`^[a-z0-9-]{1,63}$`)

// EgressInternet is the egress entry that allows every public address:
// everything but what is never reachable (the host, link-local and
// metadata addresses, other sandboxes) and private, loopback, shared and
// multicast ranges unless another entry lists them.
const EgressInternet = "internet"

// UnmarshalJSON accepts "egress": "internet" as well as a list.
func (n *NetworkSpec) UnmarshalJSON(b []byte) error {
	var raw struct {
		Egress json.RawMessage `json:"egress"`
		Group  string          `json:"group"`
		Rate   int             `json:"egress_rate_mbit"`
		In     int             `json:"ingress_rate_mbit"`
		Conns  int             `json:"max_conns"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	n.Egress, n.Group, n.EgressRateMbit, n.IngressRateMbit, n.MaxConns = nil, raw.Group, raw.Rate, raw.In, raw.Conns
	if len(raw.Egress) == 0 || string(raw.Egress) == "null" {
		return nil
	}
	var one string
	if err := json.Unmarshal(raw.Egress, &one); err == nil {
		if one != EgressInternet {
			return fmt.Errorf("network.egress: a string must be %q (else a list of entries)", EgressInternet)
		}
		n.Egress = []string{one}
		return nil
	}
	return json.Unmarshal(raw.Egress, &n.Egress)
}

// MaxEgressRules bounds NetworkSpec.Egress.
const MaxEgressRules = 256

// EgressRule is one parsed entry of NetworkSpec.Egress.
type EgressRule struct {
	Prefix netip.Prefix
	// Host, when set instead of Prefix, is a DNS name ("github.com") or a
	// wildcard ("*.pythonhosted.org", every name under it, not the
	// suffix itself): its addresses are allowed as the sandbox resolves
	// them, for their records' TTL.
	Host string
	// Rule, when set (alone), names a network rule; the edge expands it.
	// "internet" is Internet.
	Rule string
	// Internet allows every public address (EgressInternet).
	Internet bool
	Port     uint16 // 0 = any
	Proto    string // "tcp", "udp" or "" (any)
}

// String is the rule in the form ParseEgress reads.
func (r EgressRule) String() string {
	switch {
	case r.Internet:
		return EgressInternet
	case r.Rule != "":
		return r.Rule
	}
	s := r.Prefix.String()
	if r.Host != "" {
		s = r.Host
	}
	if r.Port != 0 {
		s += ":" + strconv.Itoa(int(r.Port))
	}
	if r.Proto != "" {
		s += "/" + r.Proto
	}
	return s
}

// ParseEgress reads one egress entry: "10.1.2.0/24:443/tcp",
// "10.1.2.3:53/udp", "10.0.0.0/8", "10.1.2.3", "github.com:443",
// "*.pythonhosted.org:443/tcp", a rule's name ("pypi") or "internet".
// Only IPv4 is allowed for now (IPv6 is closed for every sandbox).
func ParseEgress(s string) (EgressRule, error) {
	var r EgressRule
	if s == EgressInternet {
		r.Internet = true
		return r, nil
	}
	if RuleNameRE.MatchString(s) {
		r.Rule = s
		return r, nil
	}
	rest := s
	if i := strings.LastIndexByte(rest, '/'); i >= 0 {
		switch p := rest[i+1:]; p {
		case "tcp", "udp":
			r.Proto, rest = p, rest[:i]
		}
	}
	if i := strings.IndexByte(rest, ':'); i >= 0 {
		n, err := strconv.Atoi(rest[i+1:])
		if err != nil || n < 1 || n > 65535 {
			return r, fmt.Errorf("egress %q: port must be 1-65535", s)
		}
		r.Port, rest = uint16(n), rest[:i]
	}
	if r.Proto != "" && r.Port == 0 {
		// "10.0.0.0/8/tcp" would be read as a prefix length otherwise.
		return r, fmt.Errorf("egress %q: a protocol needs a port (ADDR:PORT/%s)", s, r.Proto)
	}
	if isHostName(rest) {
		if len(rest) > MaxHostLen {
			return r, fmt.Errorf("egress %q: a name has at most %d characters", s, MaxHostLen)
		}
		r.Host = strings.ToLower(rest)
		return r, nil
	}
	if strings.Contains(rest, "/") {
		p, err := netip.ParsePrefix(rest)
		if err != nil {
			return r, fmt.Errorf("egress %q: bad CIDR: %v", s, err)
		}
		r.Prefix = p.Masked()
	} else {
		a, err := netip.ParseAddr(rest)
		if err != nil {
			return r, fmt.Errorf("egress %q: bad address: %v", s, err)
		}
		r.Prefix = netip.PrefixFrom(a, a.BitLen())
	}
	if !r.Prefix.Addr().Is4() {
		return r, fmt.Errorf("egress %q: only IPv4 destinations are supported (IPv6 is closed)", s)
	}
	return r, nil
}

// MaxHostLen bounds a host entry.
const MaxHostLen = 253

// RuleNameRE is a network rule's name: lower-case letters, digits, '-' and
// '_', no dots (a name with a dot is a host).
var RuleNameRE = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)

var hostLabelRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$`)

// isHostName says whether s is a DNS name of at least two labels (or
// "*." and one), with a letter in its last label (so no address).
func isHostName(s string) bool {
	s = strings.TrimPrefix(s, "*.")
	labels := strings.Split(s, ".")
	if len(labels) < 2 {
		return false
	}
	for _, l := range labels {
		if !hostLabelRE.MatchString(l) {
			return false
		}
	}
	last := labels[len(labels)-1]
	return strings.IndexFunc(last, func(c rune) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }) >= 0
}

// MatchHost says whether name (lower case, no final dot) is what pattern
// (a host entry) names: equal, or under a "*." pattern's suffix.
func MatchHost(pattern, name string) bool {
	if suffix, ok := strings.CutPrefix(pattern, "*."); ok {
		return strings.HasSuffix(name, "."+suffix)
	}
	return pattern == name
}

// SandboxNetwork is GET /v1/sandboxes/{id}/network: the sandbox's
// address and allowlist, and what its kernel-side policy refused.
type SandboxNetwork struct {
	ID      string   `json:"id"`
	Enabled bool     `json:"enabled"` // false: loopback only
	Address string   `json:"address,omitempty"`
	Gateway string   `json:"gateway,omitempty"`
	Egress  []string `json:"egress"`
	// Denied counts refused packets that opened (or tried to open) a
	// connection: each refused connect is one (the refusal answers it at
	// once, so it is not retried). DeniedBy splits it by the rule that
	// refused: "not-allowed", "metadata", "host", "sandbox", "spoofed",
	// "ipv6", "conn-limit", "rate-limit", "ingress-rate-limit", "dns",
	// "dns-rate".
	Denied   int64            `json:"denied"`
	DeniedBy map[string]int64 `json:"denied_by"`
	// DeniedDestinations are the distinct destinations refused so far
	// (at most 1024; past that, refusals are counted in Denied only), most
	// refused first.
	DeniedDestinations []NetworkDenial `json:"denied_destinations"`
}

// NetworkDenial is one refused destination of a sandbox and how often.
type NetworkDenial struct {
	Destination string `json:"destination"` // "10.9.9.9:443", or an address for other protocols
	Protocol    string `json:"protocol"`    // "tcp", "udp", "icmp" or a protocol number
	Reason      string `json:"reason"`      // as in DeniedBy
	Count       int64  `json:"count"`       // packets
}

// NetworkRule is a named, cluster-wide set of destinations (PUT
// /v1/network-rules/{name}, admins only; readable by every project). An
// egress entry naming it stands for every combination of its hosts and
// CIDRs with its ports and protocols; changing it changes every running
// sandbox that names it.
type NetworkRule struct {
	Name      string    `json:"name"`
	Hosts     []string  `json:"hosts"`     // "pypi.org", "*.pythonhosted.org"
	CIDRs     []string  `json:"cidrs"`     // "10.0.0.0/8", "10.1.2.3"
	Ports     []int     `json:"ports"`     // empty: any
	Protocols []string  `json:"protocols"` // "tcp", "udp"; empty: any
	Version   uint64    `json:"version"`   // set by the server
	UpdatedAt time.Time `json:"updated_at"`
	UpdatedBy string    `json:"updated_by,omitempty"`
}

// MaxRuleEntries bounds a rule's hosts plus CIDRs, and MaxExpandedEgress a
// sandbox's egress list once its rules are expanded.
const (
	MaxRuleEntries    = 256
	MaxExpandedEgress = 1024
)

// CheckRule validates a rule (its name is set) and puts its entries in
// canonical form.
func (r *NetworkRule) CheckRule() error {
	if !RuleNameRE.MatchString(r.Name) || r.Name == EgressInternet {
		return fmt.Errorf("rule name %q: want lower-case letters, digits, '-' or '_' (at most 63, not %q)", r.Name, EgressInternet)
	}
	if len(r.Hosts)+len(r.CIDRs) == 0 {
		return fmt.Errorf("rule %s: hosts or cidrs must list something", r.Name)
	}
	if len(r.Hosts)+len(r.CIDRs) > MaxRuleEntries {
		return fmt.Errorf("rule %s: at most %d hosts and cidrs", r.Name, MaxRuleEntries)
	}
	if len(r.Ports) > 64 || len(r.Protocols) > 2 {
		return fmt.Errorf("rule %s: at most 64 ports and 2 protocols", r.Name)
	}
	for i, h := range r.Hosts {
		if len(h) > MaxHostLen || !isHostName(h) {
			return fmt.Errorf("rule %s: hosts[%d] %q is not a DNS name (\"pypi.org\", \"*.pythonhosted.org\")", r.Name, i, h)
		}
		r.Hosts[i] = strings.ToLower(h)
	}
	for i, c := range r.CIDRs {
		e, err := ParseEgress(c)
		if err != nil || e.Prefix == (netip.Prefix{}) || e.Port != 0 || e.Proto != "" {
			return fmt.Errorf("rule %s: cidrs[%d] %q is not an IPv4 CIDR or address", r.Name, i, c)
		}
		r.CIDRs[i] = e.Prefix.String()
	}
	for i, p := range r.Ports {
		if p < 1 || p > 65535 {
			return fmt.Errorf("rule %s: ports[%d] %d: a port must be 1-65535", r.Name, i, p)
		}
	}
	for i, p := range r.Protocols {
		if p != "tcp" && p != "udp" {
			return fmt.Errorf("rule %s: protocols[%d] %q: want \"tcp\" or \"udp\"", r.Name, i, p)
		}
	}
	if r.Hosts == nil {
		r.Hosts = []string{}
	}
	if r.CIDRs == nil {
		r.CIDRs = []string{}
	}
	if r.Ports == nil {
		r.Ports = []int{}
	}
	if r.Protocols == nil {
		r.Protocols = []string{}
	}
	return nil
}

// Expand is the rule's egress entries.
func (r *NetworkRule) Expand() []EgressRule {
	var dsts []EgressRule
	for _, h := range r.Hosts {
		dsts = append(dsts, EgressRule{Host: h})
	}
	for _, c := range r.CIDRs {
		if e, err := ParseEgress(c); err == nil {
			dsts = append(dsts, e)
		}
	}
	ports := r.Ports
	if len(ports) == 0 {
		ports = []int{0}
	}
	protos := r.Protocols
	if len(protos) == 0 || len(protos) == 2 {
		protos = []string{""}
	}
	var out []EgressRule
	for _, d := range dsts {
		for _, p := range ports {
			for _, pr := range protos {
				e := d
				e.Port = uint16(p)
				if p != 0 {
					e.Proto = pr
				}
				out = append(out, e)
			}
		}
	}
	return out
}

// NetworkRuleList is GET /v1/network-rules.
type NetworkRuleList struct {
	Rules []NetworkRule `json:"rules"`
}

// NetworkDenialRecord is one entry of a sandbox's denial log (GET
// /v1/sandboxes/{id}/network/denials): a refused name (protocol "dns",
// at the time it was asked) or refused packets to one destination (as
// the node observed them: within a second of the refusal, Count packets
// since the previous entry of that destination).
type NetworkDenialRecord struct {
	Time        time.Time `json:"time"`
	Step        int64     `json:"step,omitempty"` // the sandbox's trajectory step then, if it records one
	Destination string    `json:"destination"`    // a name, ADDR:PORT, or ADDR
	Protocol    string    `json:"protocol"`       // dns, tcp, udp, icmp or a number
	Reason      string    `json:"reason"`         // as in SandboxNetwork.DeniedBy
	Count       int64     `json:"count"`
}

// NetworkDenials is GET /v1/sandboxes/{id}/network/denials: the newest
// MaxDenialLog entries, oldest first, and how many entries were dropped
// before them.
type NetworkDenials struct {
	ID      string                `json:"id"`
	Denials []NetworkDenialRecord `json:"denials"`
	Dropped int64                 `json:"dropped"`
}

// MaxDenialLog bounds a sandbox's denial log.
const MaxDenialLog = 1000
