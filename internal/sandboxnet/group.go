package sandboxnet

// Network groups: the members of a group (one project's sandboxes created
// with the same network.group) reach each other on any port and protocol.
// Each group has a set in the edge's table, g_<hash of its key>, of its
// members' addresses; a member's o_<id> accepts destinations in its
// group's set (through a_<id>, so they count against its connection
// limit) before it refuses every other sandbox address; the shared
// forward-in chain lets through what one sandbox link forwards to another,
// which only a sender's o_<id> can have allowed (it refuses other sandbox
// addresses and spoofed sources). A member joins with its chains and
// leaves with them, in the same transactions; the last member takes the
// set. Sweep removes the addresses of sandboxes gone in a crash and empty
// sets.

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"syscall"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

const groupPrefix = "g_"

// groupSet names the set of the group keyed by key ("" = no group).
func groupSet(key string) string {
	if key == "" {
		return ""
	}
	h := sha256.Sum256([]byte(key))
	return groupPrefix + hex.EncodeToString(h[:8])
}

func groupSetOf(t *nftables.Table, name string) *nftables.Set {
	return &nftables.Set{Table: t, Name: name, KeyType: nftables.TypeIPAddr}
}

// groupRule accepts (through a_<id>) a destination in the group's set.
func groupRule(id, set string) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: set},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: allowedChain(id)},
	}
}

// addrKey is an IPv4 address as a set element's key.
func addrKey(a netip.Addr) []byte {
	b := a.As4()
	return b[:]
}

// joinGroup adds a's group set (unless it exists) and a's address to it
// to the transaction c.
func (m *Manager) joinGroup(c *nftables.Conn, t *nftables.Table, a *Attachment) error {
	s := groupSetOf(t, a.Group)
	if err := c.AddSet(s, nil); err != nil {
		return fmt.Errorf("sandboxnet: set %s: %w", a.Group, err)
	}
	if err := c.SetAddElements(s, []nftables.SetElement{{Key: addrKey(a.Address)}}); err != nil {
		return fmt.Errorf("sandboxnet: set %s: %w", a.Group, err)
	}
	return nil
}

// leaveGroupSteps are the steps of removePolicy that take id out of its
// group (before its chains go) and remove the group's set when id was its
// last member (after). Both nil when id has no group. Called with groupMu
// held; id leaves m.groups.
func (m *Manager) leaveGroupSteps(c *nftables.Conn, t *nftables.Table, id string) (leave, drop func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.loadLocked()
	set, ok := m.groups[id]
	if !ok {
		return nil, nil
	}
	delete(m.groups, id)
	i, have := m.byID[id]
	if have {
		_, addr := m.addrs(i)
		leave = func() {
			_ = c.SetDeleteElements(groupSetOf(t, set), []nftables.SetElement{{Key: addrKey(addr)}})
		}
	}
	last := true
	for _, s := range m.groups {
		if s == set {
			last = false
		}
	}
	if last {
		drop = func() { c.DelSet(groupSetOf(t, set)) }
	}
	return leave, drop
}

// groupSets reads the group sets of the edge's table: name -> members.
func (m *Manager) groupSets() (map[string][]netip.Addr, error) {
	c, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	sets, err := c.GetSets(m.table())
	if err != nil {
		return nil, fmt.Errorf("sandboxnet: list sets: %w", err)
	}
	out := map[string][]netip.Addr{}
	for _, s := range sets {
		if !strings.HasPrefix(s.Name, groupPrefix) {
			continue
		}
		els, err := c.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("sandboxnet: read %s: %w", s.Name, err)
		}
		out[s.Name] = []netip.Addr{}
		for _, el := range els {
			if len(el.Key) == 4 {
				out[s.Name] = append(out[s.Name], netip.AddrFrom4([4]byte(el.Key)))
			}
		}
		sort.Slice(out[s.Name], func(i, j int) bool { return out[s.Name][i].Less(out[s.Name][j]) })
	}
	return out, nil
}

// idOf is the sandbox holding addr (its /31's sandbox address); "" none.
// Called with mu held.
func (m *Manager) idOfLocked(addr netip.Addr) string {
	if !m.pool.Contains(addr) || !addr.Is4() {
		return ""
	}
	b, p := addr.As4(), m.pool.Addr().As4()
	off := binary.BigEndian.Uint32(b[:]) - binary.BigEndian.Uint32(p[:])
	if off%2 != 1 {
		return ""
	}
	return m.used[int(off/2)]
}

// loadGroupsLocked learns the groups of sandboxes that outlive a restart
// of the edge from the table's sets. Called with mu held, after the
// links' /31s are known.
func (m *Manager) loadGroupsLocked() {
	if !m.tableUp {
		return
	}
	sets, err := m.groupSets()
	if err != nil {
		return
	}
	for name, addrs := range sets {
		for _, a := range addrs {
			if id := m.idOfLocked(a); id != "" {
				m.groups[id] = name
			}
		}
	}
}

// sweepGroups removes from the group sets the addresses no sandbox of
// this edge holds (a crash between a member's end and its removal), and
// the sets left without members.
func (m *Manager) sweepGroups() error {
	m.groupMu.Lock()
	defer m.groupMu.Unlock()
	m.mu.Lock()
	m.loadLocked()
	up := m.tableUp
	members := map[string]bool{}
	for _, s := range m.groups {
		members[s] = true
	}
	m.mu.Unlock()
	if !up {
		return nil
	}
	sets, err := m.groupSets()
	if err != nil {
		return err
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("sandboxnet: nftables: %w", err)
	}
	t := m.table()
	var errs []error
	for name, addrs := range sets {
		s := groupSetOf(t, name)
		var stale []nftables.SetElement
		m.mu.Lock()
		for _, a := range addrs {
			if id := m.idOfLocked(a); id == "" || m.groups[id] != name {
				stale = append(stale, nftables.SetElement{Key: addrKey(a)})
			}
		}
		m.mu.Unlock()
		if len(stale) > 0 {
			if err := c.SetDeleteElements(s, stale); err != nil {
				errs = append(errs, err)
			}
		}
		if !members[name] {
			c.DelSet(s)
		}
		if err := c.Flush(); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("sandboxnet: sweep %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
