// Package placement picks a node for a new sandbox: filter the healthy nodes
// that offer the tier, the resources and the labels asked for, prefer those
// that already hold the image, then take the least loaded of k random
// candidates. The members of a network group go where the group already
// lives; a new group starts on the fitting node that its name hashes to
// highest (rendezvous hashing), so that replicas that place its first
// members at once agree without talking. Each replica counts its own recent placements (per node and
// per project) until the next heartbeat shows them; it keeps no durable
// state. It also enforces project quotas against the fleet's usage plus
// those recent placements.
package placement

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
)

// ErrNoNode means no healthy node can take the sandbox. Pick returns it as
// a *NoNodeError that says why (errors.Is(err, ErrNoNode) holds).
var ErrNoNode = errors.New("placement: no node can take this sandbox")

// NoNodeError says which resource or condition left no node for a sandbox.
type NoNodeError struct {
	Reason string // an api.Reason* constant
	Detail string // for people: what was asked and what the best node has
}

func (e *NoNodeError) Error() string {
	return "no node can take this sandbox now: " + e.Detail
}

// Is makes errors.Is(err, ErrNoNode) true.
func (e *NoNodeError) Is(target error) bool { return target == ErrNoNode }

// K is the number of random candidates compared.
const K = 2

// Fleet is the view placement reads (the watcher).
type Fleet interface {
	Up() []api.Node
	// ProjectUsage is what the live sandboxes of a project and its
	// descendants hold, as of the last heartbeats.
	ProjectUsage(project string) api.Usage
	// APIServers is how many replicas share the quotas (at least 1).
	APIServers() int
}

// Limit is one project's quota that binds a new sandbox (its own project's
// and each ancestor's).
type Limit struct {
	Project string
	Quota   api.Quota
}

// QuotaError says which quota a placement would break. Transient is set
// when only this replica's share of the headroom is used up (it frees at
// the next heartbeats).
type QuotaError struct {
	Project   string
	What      string
	Transient bool
}

func (e *QuotaError) Error() string {
	if e.Transient {
		return fmt.Sprintf("project %s is close to its %s quota; retry shortly", e.Project, e.What)
	}
	return fmt.Sprintf("project %s would exceed its %s quota", e.Project, e.What)
}

// Placer chooses nodes.
type Placer struct {
	fleet Fleet

	mu       sync.Mutex
	recent   map[string]*pending  // node -> placements not yet in a heartbeat
	projects map[string]api.Usage // project -> the same, summed over nodes
	groups   map[string]groupSeat // network group -> where this replica put it lately

	cands, withImage []int // scratch for Pick
	loads            []float64
}

// groupSeat is a network group this replica placed on a node that no
// heartbeat has shown holding it yet.
type groupSeat struct {
	node  string
	since time.Time
}

// groupSeatTTL bounds how long a group placement is remembered without a
// heartbeat showing it (a create that failed on the node leaves none).
const groupSeatTTL = 30 * time.Second

type pending struct {
	cpu      float64
	mem      int64
	count    int
	since    time.Time
	projects map[string]api.Usage
}

// New returns a placer over fleet.
func New(fleet Fleet) *Placer {
	return &Placer{fleet: fleet, recent: make(map[string]*pending), projects: make(map[string]api.Usage),
		groups: make(map[string]groupSeat)}
}

// Pick chooses a node for spec, skipping the nodes in exclude, and checks
// limits (nil: none) first.
func (p *Placer) Pick(spec *api.CreateSandboxRequest, exclude map[string]bool, limits []Limit) (string, error) {
	return p.pick(spec, exclude, limits, true)
}

// PickTransient chooses a node like Pick for work that holds no resources
// after it answers (an FnCall task runs in a worker the node already
// counts), so it neither checks quotas nor counts the placement.
func (p *Placer) PickTransient(spec *api.CreateSandboxRequest, exclude map[string]bool) (string, error) {
	return p.pick(spec, exclude, nil, false)
}

func (p *Placer) pick(spec *api.CreateSandboxRequest, exclude map[string]bool, limits []Limit, record bool) (string, error) {
	nodes := p.fleet.Up()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.checkQuotaLocked(spec, limits); err != nil {
		return "", err
	}
	var bi int
	if group := groupOf(spec); group != "" {
		i, err := p.pickGroupLocked(nodes, spec, group, exclude)
		if err != nil {
			return "", err
		}
		bi = i
	} else if i, ok := p.sampleLocked(nodes, spec, exclude); ok {
		bi = i
	} else {
		// Filter without copying nodes: candidate indices and their loads
		// live in scratch slices reused under the lock.
		p.cands, p.withImage = p.cands[:0], p.withImage[:0]
		if cap(p.loads) < len(nodes) {
			p.loads = make([]float64, len(nodes))
		}
		p.loads = p.loads[:len(nodes)]
		for i := range nodes {
			n := &nodes[i]
			load, ok := p.fitsLocked(n, spec, exclude)
			if !ok {
				continue
			}
			p.loads[i] = load
			// Nodes holding the image are preferred.
			if holds(n, spec.Image) {
				p.withImage = append(p.withImage, i)
			}
			p.cands = append(p.cands, i)
		}
		if len(p.cands) == 0 {
			return "", p.whyNoneLocked(nodes, spec, exclude)
		}
		pool := p.cands
		if len(p.withImage) > 0 {
			pool = p.withImage
		}
		bi = pool[rand.IntN(len(pool))]
		for i := 1; i < K && len(pool) > 1; i++ {
			c := pool[rand.IntN(len(pool))]
			if p.loads[c] < p.loads[bi] {
				bi = c
			}
		}
	}
	best := &nodes[bi]
	if record {
		p.recordLocked(best.Name, spec, limits)
		if group := groupOf(spec); group != "" {
			p.groups[group] = groupSeat{node: best.Name, since: time.Now()}
		}
	}
	return best.Name, nil
}

// groupOf is spec's network group key ("" without one).
func groupOf(spec *api.CreateSandboxRequest) string {
	if spec.Network == nil || spec.Network.Group == "" {
		return ""
	}
	return api.NetworkGroupKey(spec.Project, spec.Network.Group)
}

// pickGroupLocked places a member of network group: on the node that
// holds the group (a heartbeat shows it, or this replica put a member
// there lately), else on the fitting node the group's name hashes to
// highest. A group never spans nodes: when its node cannot take the
// member, the answer is a NoNodeError with ReasonNetworkGroup.
func (p *Placer) pickGroupLocked(nodes []api.Node, spec *api.CreateSandboxRequest, group string, exclude map[string]bool) (int, error) {
	home := -1
	for i := range nodes {
		if nodes[i].NetworkGroups[group] > 0 {
			home = i
			break
		}
	}
	if home < 0 {
		if seat, ok := p.groups[group]; ok {
			for i := range nodes {
				n := &nodes[i]
				if n.Name != seat.node {
					continue
				}
				if time.Since(seat.since) < groupSeatTTL && !n.LastHeartbeat.After(seat.since.Add(2*time.Second)) {
					home = i
				}
				break
			}
			if home < 0 {
				delete(p.groups, group)
			}
		}
	}
	if home >= 0 {
		if _, ok := p.fitsLocked(&nodes[home], spec, exclude); !ok {
			why := "it is excluded"
			if !exclude[nodes[home].Name] {
				why = p.whyNoneLocked(nodes[home:home+1], spec, nil).Detail
			}
			return 0, &NoNodeError{Reason: api.ReasonNetworkGroup, Detail: fmt.Sprintf(
				"network group %q lives on node %s, which cannot take another member: %s", spec.Network.Group, nodes[home].Name, why)}
		}
		return home, nil
	}
	best, bestScore := -1, uint64(0)
	for i := range nodes {
		if _, ok := p.fitsLocked(&nodes[i], spec, exclude); !ok {
			continue
		}
		if s := rendezvous(group, nodes[i].Name); best < 0 || s > bestScore {
			best, bestScore = i, s
		}
	}
	if best < 0 {
		return 0, p.whyNoneLocked(nodes, spec, exclude)
	}
	return best, nil
}

// rendezvous is node's score for key (highest random weight hashing).
func rendezvous(key, node string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write([]byte(node))
	return h.Sum64()
}

// recordLocked counts a placement of spec on node until its heartbeat
// shows it.
func (p *Placer) recordLocked(node string, spec *api.CreateSandboxRequest, limits []Limit) {
	r := p.recent[node]
	if r == nil {
		r = &pending{since: time.Now(), projects: map[string]api.Usage{}}
		p.recent[node] = r
	}
	r.cpu += spec.CPU
	r.mem += spec.MemoryMB
	r.count++
	for _, l := range limits {
		add := api.Usage{Sandboxes: 1, CPU: spec.CPU, MemoryMB: spec.MemoryMB}
		r.projects[l.Project] = plus(r.projects[l.Project], add, 1)
		p.projects[l.Project] = plus(p.projects[l.Project], add, 1)
	}
}

// sampleTries bounds the random draws of the fast path of a pick.
const sampleTries = 8

// sampleLocked is the common case of a pick without a scan of the fleet:
// draw random nodes until K distinct ones fit and hold the image, and take
// the least loaded. It gives up (ok false) when the draws find fewer, and
// the caller scans every node (few fit, or few hold the image).
func (p *Placer) sampleLocked(nodes []api.Node, spec *api.CreateSandboxRequest, exclude map[string]bool) (int, bool) {
	if len(nodes) < 2*K {
		return 0, false
	}
	best, found := -1, 0
	var bestLoad float64
	for try := 0; try < sampleTries && found < K; try++ {
		i := rand.IntN(len(nodes))
		if i == best {
			continue
		}
		n := &nodes[i]
		load, ok := p.fitsLocked(n, spec, exclude)
		if !ok || !holds(n, spec.Image) {
			continue
		}
		found++
		if best < 0 || load < bestLoad {
			best, bestLoad = i, load
		}
	}
	return best, found >= K
}

// fitsLocked reports whether n can take spec, counting this replica's
// placements its last heartbeat does not show yet, and its load if so.
func (p *Placer) fitsLocked(n *api.Node, spec *api.CreateSandboxRequest, exclude map[string]bool) (float64, bool) {
	cpu, mem := n.CPURequested, n.MemRequested
	if r := p.recent[n.Name]; r != nil {
		if n.LastHeartbeat.After(r.since) {
			p.expireLocked(n.Name, r)
		} else {
			cpu += r.cpu
			mem += r.mem
		}
	}
	if exclude[n.Name] || !offers(n, spec.Tier) || !selects(n, spec.NodeSelector) {
		return 0, false
	}
	if n.CPUCapacity > 0 && cpu+spec.CPU > n.CPUCapacity &&
		(spec.Priority != api.PriorityBestEffort || cpu-n.Elastic.FreedCPU+spec.CPU > n.CPUCapacity) {
		// A best-effort sandbox may use the cpu that the node's best-effort
		// sandboxes between operations leave (the node decides, against
		// its CPU pressure).
		return 0, false
	}
	if n.MemoryMB > 0 && mem+spec.MemoryMB > n.MemoryMB {
		return 0, false
	}
	return loadOf(cpu, n.CPUCapacity, mem, n.MemoryMB), true
}

// Reserve counts a sandbox of spec on node, which the caller chose (a
// fork restores on its source's node), after checking limits like Pick.
// Release undoes it.
func (p *Placer) Reserve(node string, spec *api.CreateSandboxRequest, limits []Limit) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.checkQuotaLocked(spec, limits); err != nil {
		return err
	}
	p.recordLocked(node, spec, limits)
	return nil
}

// whyNoneLocked explains an empty candidate list: no node at all, none with
// the tier or labels, or the resource that the nodes offering them lack.
func (p *Placer) whyNoneLocked(nodes []api.Node, spec *api.CreateSandboxRequest, exclude map[string]bool) *NoNodeError {
	var tier, sel int
	var bestCPU, bestCPUCap float64
	var bestMem, bestMemCap int64
	cpuShort, memShort := 0, 0
	for i := range nodes {
		n := &nodes[i]
		if exclude[n.Name] || !offers(n, spec.Tier) {
			continue
		}
		tier++
		if !selects(n, spec.NodeSelector) {
			continue
		}
		sel++
		cpu, mem := n.CPURequested, n.MemRequested
		if r := p.recent[n.Name]; r != nil {
			cpu += r.cpu
			mem += r.mem
		}
		if free := n.CPUCapacity - cpu; n.CPUCapacity > 0 && (bestCPUCap == 0 || free > bestCPU) {
			bestCPU, bestCPUCap = free, n.CPUCapacity
		}
		if free := n.MemoryMB - mem; n.MemoryMB > 0 && (bestMemCap == 0 || free > bestMem) {
			bestMem, bestMemCap = free, n.MemoryMB
		}
		if n.CPUCapacity > 0 && cpu+spec.CPU > n.CPUCapacity {
			cpuShort++
		} else if n.MemoryMB > 0 && mem+spec.MemoryMB > n.MemoryMB {
			memShort++
		}
	}
	switch {
	case len(nodes) == 0:
		return &NoNodeError{Reason: api.ReasonNoNodes, Detail: "no healthy node"}
	case tier == 0:
		return &NoNodeError{Reason: api.ReasonTier, Detail: fmt.Sprintf("no node offers tier %q", spec.Tier)}
	case sel == 0:
		return &NoNodeError{Reason: api.ReasonNodeSelector, Detail: "no node has the labels of node_selector"}
	case cpuShort >= memShort:
		return &NoNodeError{Reason: api.ReasonCPU, Detail: fmt.Sprintf(
			"not enough cpu: asked %g cores, the most free on a node is %.2f of %g", spec.CPU, max(bestCPU, 0), bestCPUCap)}
	default:
		return &NoNodeError{Reason: api.ReasonMemory, Detail: fmt.Sprintf(
			"not enough memory: asked %d MiB, the most free on a node is %d of %d MiB", spec.MemoryMB, max(bestMem, 0), bestMemCap)}
	}
}

// Release forgets a placement that did not happen (the edge refused it).
func (p *Placer) Release(node string, spec *api.CreateSandboxRequest, limits []Limit) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.recent[node]
	if r == nil {
		return
	}
	r.cpu -= spec.CPU
	r.mem -= spec.MemoryMB
	r.count--
	for _, l := range limits {
		sub := api.Usage{Sandboxes: 1, CPU: spec.CPU, MemoryMB: spec.MemoryMB}
		if _, ok := r.projects[l.Project]; ok {
			r.projects[l.Project] = plus(r.projects[l.Project], sub, -1)
			p.projects[l.Project] = plus(p.projects[l.Project], sub, -1)
		}
	}
}

func plus(a, b api.Usage, sign int) api.Usage {
	a.Sandboxes += sign * b.Sandboxes
	a.CPU += float64(sign) * b.CPU
	a.MemoryMB += int64(sign) * b.MemoryMB
	return a
}

// checkQuotaLocked refuses a sandbox that would take a project over its
// quota, counting the fleet's usage and this replica's recent placements.
// With R replicas, each may place at most 1/R of the headroom left at the
// last heartbeats (always at least one sandbox): together they overshoot by
// at most R-1 sandboxes per heartbeat interval.
func (p *Placer) checkQuotaLocked(spec *api.CreateSandboxRequest, limits []Limit) error {
	if len(limits) == 0 {
		return nil
	}
	// Drop what the heartbeats now count, so it is not counted twice.
	nodes := p.fleet.Up()
	for i := range nodes {
		if r := p.recent[nodes[i].Name]; r != nil && nodes[i].LastHeartbeat.After(r.since) {
			p.expireLocked(nodes[i].Name, r)
		}
	}
	replicas := p.fleet.APIServers()
	for _, l := range limits {
		base := p.fleet.ProjectUsage(l.Project)
		pend := p.projects[l.Project]
		q := l.Quota
		type dim struct {
			what             string
			limit, base, pen float64
			add              float64
		}
		dims := []dim{
			{"sandboxes", float64(q.Sandboxes), float64(base.Sandboxes), float64(pend.Sandboxes), 1},
			{"cpu", q.CPU, base.CPU, pend.CPU, spec.CPU},
			{"memory", float64(q.MemoryMB), float64(base.MemoryMB), float64(pend.MemoryMB), float64(spec.MemoryMB)},
		}
		for _, d := range dims {
			if d.limit <= 0 {
				continue
			}
			if d.base+d.pen+d.add > d.limit+1e-9 {
				return &QuotaError{Project: l.Project, What: d.what}
			}
			if replicas > 1 && pend.Sandboxes > 0 && d.pen+d.add > (d.limit-d.base)/float64(replicas)+1e-9 {
				return &QuotaError{Project: l.Project, What: d.what, Transient: true}
			}
		}
	}
	return nil
}

// expireLocked forgets a node's recent placements once a heartbeat counts them.
func (p *Placer) expireLocked(node string, r *pending) {
	delete(p.recent, node)
	for proj, u := range r.projects {
		t := plus(p.projects[proj], u, -1)
		if t.Sandboxes <= 0 {
			delete(p.projects, proj)
		} else {
			p.projects[proj] = t
		}
	}
}

func offers(n *api.Node, tier string) bool {
	for _, t := range n.Tiers {
		if t == tier {
			return true
		}
	}
	return false
}

func selects(n *api.Node, sel map[string]string) bool {
	for k, v := range sel {
		if got, ok := n.Labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func holds(n *api.Node, image string) bool {
	for _, i := range n.Images {
		if i == image || strings.TrimSuffix(i, ":latest") == image {
			return true
		}
	}
	return false
}

func loadOf(cpu, cpuCap float64, mem, memCap int64) float64 {
	l := 0.0
	if cpuCap > 0 {
		l = cpu / cpuCap
	}
	if memCap > 0 {
		if m := float64(mem) / float64(memCap); m > l {
			l = m
		}
	}
	return l
}

// Pending is what this replica placed in project (and below) that the
// heartbeats do not show yet.
func (p *Placer) Pending(project string) api.Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.projects[project]
}
