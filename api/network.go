package api

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// NetworkSpec is the create request's opt-in network (docs/api.md,
// "Network"). Absent, a sandbox has loopback only. Present, it gets an
// interface, an address and a default route, and may open connections to
// the destinations of Egress only: everything else is refused in the
// host's kernel and counted.
type NetworkSpec struct {
	// Egress lists the allowed destinations: "CIDR[:PORT][/PROTO]" or
	// "ADDR[:PORT][/PROTO]", PROTO "tcp" or "udp" (default any), PORT
	// 1-65535 (default any). Empty: nothing but the interface.
	Egress []string `json:"egress"`
}

// MaxEgressRules bounds NetworkSpec.Egress.
const MaxEgressRules = 256

// EgressRule is one parsed entry of NetworkSpec.Egress.
type EgressRule struct {
	Prefix netip.Prefix
	Port   uint16 // 0 = any
	Proto  string // "tcp", "udp" or "" (any)
}

// String is the rule in the form ParseEgress reads.
func (r EgressRule) String() string {
	s := r.Prefix.String()
	if r.Port != 0 {
		s += ":" + strconv.Itoa(int(r.Port))
	}
	if r.Proto != "" {
		s += "/" + r.Proto
	}
	return s
}

// ParseEgress reads one egress entry: "10.1.2.0/24:443/tcp",
// "10.1.2.3:53/udp", "10.0.0.0/8", "10.1.2.3". Only IPv4 is allowed for
// now (IPv6 is closed for every sandbox).
func ParseEgress(s string) (EgressRule, error) {
	var r EgressRule
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
	// "ipv6", "conn-limit".
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
