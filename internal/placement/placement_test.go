package placement

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

type fleet struct {
	nodes    []api.Node
	usage    map[string]api.Usage
	replicas int
}

func (f *fleet) Up() []api.Node                  { return f.nodes }
func (f *fleet) ProjectUsage(p string) api.Usage { return f.usage[p] }
func (f *fleet) APIServers() int                 { return max(1, f.replicas) }

func node(name string, labels map[string]string, images ...string) api.Node {
	return api.Node{Name: name, State: "up", CPUCapacity: 10, MemoryMB: 10240, Tiers: []string{"container"},
		Labels: labels, Images: images, LastHeartbeat: time.Now().Add(-time.Second)}
}

func spec() *api.CreateSandboxRequest {
	return &api.CreateSandboxRequest{Tier: "container", Image: "py", CPU: 1, MemoryMB: 512}
}

func TestSelectorImageCapacity(t *testing.T) {
	f := &fleet{nodes: []api.Node{node("a", map[string]string{"gpu": "h100"}), node("b", nil, "py"), node("c", nil)}}
	p := New(f)
	s := spec()
	s.NodeSelector = map[string]string{"gpu": "h100"}
	for i := 0; i < 10; i++ {
		if n, err := p.Pick(s, nil, nil); err != nil || n != "a" {
			t.Fatalf("selector: %s %v", n, err)
		}
	}
	// a is now full (10 cores): the selector has nowhere to go.
	if _, err := p.Pick(s, nil, nil); !errors.Is(err, ErrNoNode) {
		t.Fatalf("full: %v", err)
	}
	// The image holder is preferred while it has room.
	for i := 0; i < 10; i++ {
		if n, err := p.Pick(spec(), nil, nil); err != nil || n != "b" {
			t.Fatalf("image preference: %s %v", n, err)
		}
	}
	if n, err := p.Pick(spec(), nil, nil); err != nil || n != "c" {
		t.Fatalf("spill over: %s %v", n, err)
	}
	if _, err := p.Pick(spec(), map[string]bool{"c": true}, nil); !errors.Is(err, ErrNoNode) {
		t.Fatalf("exclude: %v", err)
	}
}

func TestQuotaAndReplicaShare(t *testing.T) {
	f := &fleet{nodes: []api.Node{node("a", nil), node("b", nil)}, usage: map[string]api.Usage{"acme": {Sandboxes: 2}}}
	p := New(f)
	limits := []Limit{{Project: "acme.rl", Quota: api.Quota{Sandboxes: 5}}, {Project: "acme", Quota: api.Quota{Sandboxes: 4}}}
	for i := 0; i < 2; i++ {
		if _, err := p.Pick(spec(), nil, limits); err != nil {
			t.Fatalf("pick %d: %v", i, err)
		}
	}
	var qe *QuotaError
	if _, err := p.Pick(spec(), nil, limits); !errors.As(err, &qe) || qe.Project != "acme" || qe.Transient {
		t.Fatalf("over acme's quota: %v", err)
	}
	// Two replicas: each takes at most half of the headroom (at least one).
	f2 := &fleet{nodes: f.nodes, usage: map[string]api.Usage{}, replicas: 2}
	p2 := New(f2)
	lim := []Limit{{Project: "x", Quota: api.Quota{Sandboxes: 4}}}
	for i := 0; i < 2; i++ {
		if _, err := p2.Pick(spec(), nil, lim); err != nil {
			t.Fatalf("share pick %d: %v", i, err)
		}
	}
	if _, err := p2.Pick(spec(), nil, lim); !errors.As(err, &qe) || !qe.Transient {
		t.Fatalf("beyond this replica's share: %v", err)
	}
	// CPU quota.
	p3 := New(&fleet{nodes: f.nodes})
	if _, err := p3.Pick(spec(), nil, []Limit{{Project: "y", Quota: api.Quota{CPU: 0.5}}}); !errors.As(err, &qe) || qe.What != "cpu" {
		t.Fatalf("cpu quota: %v", err)
	}
	// Released placements free the quota again.
	n, err := p.Pick(&api.CreateSandboxRequest{Tier: "container", CPU: 1, MemoryMB: 1}, nil, []Limit{{Project: "z", Quota: api.Quota{Sandboxes: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	p.Release(n, &api.CreateSandboxRequest{Tier: "container", CPU: 1, MemoryMB: 1}, []Limit{{Project: "z", Quota: api.Quota{Sandboxes: 1}}})
	if _, err := p.Pick(&api.CreateSandboxRequest{Tier: "container", CPU: 1, MemoryMB: 1}, nil, []Limit{{Project: "z", Quota: api.Quota{Sandboxes: 1}}}); err != nil {
		t.Fatalf("after release: %v", err)
	}
}

func BenchmarkPick160(b *testing.B) {
	f := &fleet{}
	for i := 0; i < 160; i++ {
		n := node("n"+string(rune('a'+i%26))+string(rune('a'+i/26)), nil, "py")
		n.CPUCapacity = 1e9
		n.MemoryMB = 1 << 40
		f.nodes = append(f.nodes, n)
	}
	p := New(f)
	s := spec()
	for b.Loop() {
		if _, err := p.Pick(s, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// TestSampledPickOnLargeFleet checks the sampling fast path keeps the
// rules of the full scan: only fitting nodes that hold the image, spread
// by load, and a fleet filling up falls back to the scan.
func TestSampledPickOnLargeFleet(t *testing.T) {
	var nodes []api.Node
	for i := 0; i < 60; i++ {
		n := node(string(rune('A'+i/26))+string(rune('a'+i%26)), nil)
		if i%3 != 0 {
			n.Images = []string{"py"} // 40 hold the image
		}
		if i%5 == 0 {
			n.CPURequested = 9.5 // 12 cannot take 1 core
		}
		nodes = append(nodes, n)
	}
	p := New(&fleet{nodes: nodes})
	byName := map[string]*api.Node{}
	for i := range nodes {
		byName[nodes[i].Name] = &nodes[i]
	}
	counts := map[string]int{}
	for i := 0; i < 200; i++ {
		name, err := p.Pick(spec(), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		n := byName[name]
		if !holds(n, "py") || n.CPURequested > 9 {
			t.Fatalf("pick %d went to %s (images %v, cpu %.1f)", i, name, n.Images, n.CPURequested)
		}
		counts[name]++
	}
	// 32 nodes fit and hold the image; power of two choices spreads 200
	// picks so that none takes far more than its share.
	for name, c := range counts {
		if c > 15 {
			t.Fatalf("node %s took %d of 200 picks: %v", name, c, counts)
		}
	}
	// Fill every image holder (32 × 10 cores): the 16 others that fit
	// still get work through the scan, then nothing is left.
	for i := 0; i < 32*10-200+16*10; i++ {
		if _, err := p.Pick(spec(), nil, nil); err != nil {
			t.Fatalf("after %d more: %v", i, err)
		}
	}
	if _, err := p.Pick(spec(), nil, nil); !errors.Is(err, ErrNoNode) {
		t.Fatalf("full fleet: %v", err)
	}
}

// TestReserve: a placement on a node the caller chose (a fork's children
// on its source's node) counts against the quotas like a pick.
func TestReserve(t *testing.T) {
	f := &fleet{nodes: []api.Node{node("a", nil), node("b", nil)}, usage: map[string]api.Usage{"p1": {Sandboxes: 1}}}
	p := New(f)
	limits := []Limit{{Project: "p1", Quota: api.Quota{Sandboxes: 3}}}
	for i := 0; i < 2; i++ {
		if err := p.Reserve("b", spec(), limits); err != nil {
			t.Fatalf("reserve %d: %v", i, err)
		}
	}
	var qe *QuotaError
	if err := p.Reserve("b", spec(), limits); !errors.As(err, &qe) || qe.Project != "p1" {
		t.Fatalf("beyond p1's quota: %v", err)
	}
	if _, err := p.Pick(spec(), nil, limits); !errors.As(err, &qe) {
		t.Fatalf("a pick after the reservations: %v", err)
	}
	if u := p.Pending("p1"); u.Sandboxes != 2 {
		t.Fatalf("pending %+v, want 2 sandboxes", u)
	}
	p.Release("b", spec(), limits)
	if err := p.Reserve("b", spec(), limits); err != nil {
		t.Fatalf("after a release: %v", err)
	}
}

// TestNoNodeSaysWhy: a refused placement names what is short.
func TestNoNodeSaysWhy(t *testing.T) {
	p := New(&fleet{nodes: []api.Node{node("a", nil)}})
	cases := []struct {
		mod    func(*api.CreateSandboxRequest)
		reason string
	}{
		{func(s *api.CreateSandboxRequest) { s.CPU = 11 }, api.ReasonCPU},
		{func(s *api.CreateSandboxRequest) { s.MemoryMB = 20000 }, api.ReasonMemory},
		{func(s *api.CreateSandboxRequest) { s.Tier = "vm" }, api.ReasonTier},
		{func(s *api.CreateSandboxRequest) { s.NodeSelector = map[string]string{"gpu": "x"} }, api.ReasonNodeSelector},
	}
	for _, c := range cases {
		s := spec()
		c.mod(s)
		_, err := p.Pick(s, nil, nil)
		var ne *NoNodeError
		if !errors.Is(err, ErrNoNode) || !errors.As(err, &ne) || ne.Reason != c.reason {
			t.Errorf("%+v: %v, want reason %s", s, err, c.reason)
		}
	}
	if _, err := New(&fleet{}).Pick(spec(), nil, nil); !errors.As(err, new(*NoNodeError)) || err.(*NoNodeError).Reason != api.ReasonNoNodes {
		t.Errorf("no nodes: %v", err)
	}
}

func grouped(project, group string) *api.CreateSandboxRequest {
	s := spec()
	s.Project = project
	s.Network = &api.NetworkSpec{Egress: []string{}, Group: group}
	return s
}

// TestNetworkGroupOneNode: a network group lives on one node. A new
// group's first member goes where its name hashes highest, so two
// replicas that see the same fleet agree; later members follow the group
// (this replica's own placements before a heartbeat shows them, then the
// heartbeat's count); a group whose node is full is refused with
// ReasonNetworkGroup, never spread; other projects' groups of the same
// name are apart.
func TestNetworkGroupOneNode(t *testing.T) {
	nodes := []api.Node{node("a", nil), node("b", nil), node("c", nil), node("d", nil), node("e", nil)}
	f := &fleet{nodes: nodes}
	p1, p2 := New(f), New(&fleet{nodes: nodes})
	first, err := p1.Pick(grouped("acme", "task-1"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := p2.Pick(grouped("acme", "task-1"), nil, nil); err != nil || n != first {
		t.Fatalf("another replica's first member: %s %v, want %s", n, err, first)
	}
	// Followers through this replica, before any heartbeat shows them.
	for i := 0; i < 8; i++ {
		if n, err := p1.Pick(grouped("acme", "task-1"), nil, nil); err != nil || n != first {
			t.Fatalf("member %d: %s %v, want %s", i, n, err, first)
		}
	}
	// Groups spread over the fleet: 40 groups do not all hash to one node.
	seen := map[string]bool{}
	for i := 0; i < 40; i++ {
		n, err := New(&fleet{nodes: nodes}).Pick(grouped("acme", fmt.Sprintf("g%d", i)), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		seen[n] = true
	}
	if len(seen) < 3 {
		t.Errorf("40 groups landed on %d nodes", len(seen))
	}

	// The heartbeat says where a group lives: a fresh replica follows it,
	// even to a node that its hash would not choose.
	home := "a"
	if first == "a" {
		home = "b"
	}
	f2 := &fleet{nodes: append([]api.Node(nil), nodes...)}
	for i := range f2.nodes {
		if f2.nodes[i].Name == home {
			f2.nodes[i].NetworkGroups = map[string]int{api.NetworkGroupKey("acme", "task-1"): 2}
		}
	}
	p3 := New(f2)
	if n, err := p3.Pick(grouped("acme", "task-1"), nil, nil); err != nil || n != home {
		t.Fatalf("member of a group that lives on %s: %s %v", home, n, err)
	}
	// The same name in another project is another group.
	if n, err := p3.Pick(grouped("other", "task-1"), nil, nil); err != nil || n != first {
		t.Fatalf("another project's group of that name: %s %v, want %s (its own hash)", n, err, first)
	}
	// The home node full (10 cores, one taken above): refused, not spread.
	for i := 0; i < 9; i++ {
		if n, err := p3.Pick(grouped("acme", "task-1"), nil, nil); err != nil || n != home {
			t.Fatalf("filling %s: %s %v", home, n, err)
		}
	}
	_, err = p3.Pick(grouped("acme", "task-1"), nil, nil)
	var ne *NoNodeError
	if !errors.As(err, &ne) || ne.Reason != api.ReasonNetworkGroup || !strings.Contains(ne.Detail, home) || !strings.Contains(ne.Detail, "cpu") {
		t.Fatalf("a member past its node's capacity: %v", err)
	}
	// A retry that excluded the group's node (it answered 503) is refused too.
	if _, err := p3.Pick(grouped("acme", "task-1"), map[string]bool{home: true}, nil); !errors.As(err, &ne) || ne.Reason != api.ReasonNetworkGroup {
		t.Fatalf("group's node excluded: %v", err)
	}
	// Sandboxes without a group still go anywhere that fits.
	if _, err := p3.Pick(spec(), nil, nil); err != nil {
		t.Fatal(err)
	}
}

// TestNetworkGroupSeatForgotten: a member this replica placed whose create
// never showed in a heartbeat (it failed on the node) does not hold the
// group there: once a later heartbeat of that node lacks it, the next
// member is placed afresh.
func TestNetworkGroupSeatForgotten(t *testing.T) {
	nodes := []api.Node{node("a", nil), node("b", nil), node("c", nil)}
	f := &fleet{nodes: nodes}
	p := New(f)
	first, err := p.Pick(grouped("acme", "g"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The first node fills up elsewhere; its next heartbeat (3 s later)
	// shows no member of the group.
	for i := range f.nodes {
		if f.nodes[i].Name == first {
			f.nodes[i].CPURequested = 10
			f.nodes[i].LastHeartbeat = time.Now().Add(3 * time.Second)
		}
	}
	n, err := p.Pick(grouped("acme", "g"), nil, nil)
	if err != nil || n == first {
		t.Fatalf("after the seat was forgotten: %s %v, want a node other than %s", n, err, first)
	}
}
