// Package placement picks a node for a new sandbox: filter the healthy nodes
// that offer the tier and the resources, then take the least loaded of k
// random candidates. Each replica counts its own recent placements until the
// next heartbeat shows them; it keeps no durable state.
package placement

import (
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
)

// ErrNoNode means no healthy node can take the sandbox.
var ErrNoNode = errors.New("placement: no node can take this sandbox")

// K is the number of random candidates compared.
const K = 2

// Fleet is the view placement reads (the watcher).
type Fleet interface {
	Up() []api.Node
}

// Placer chooses nodes.
type Placer struct {
	fleet Fleet

	mu     sync.Mutex
	recent map[string]*pending // node -> placements not yet in a heartbeat
}

type pending struct {
	cpu   float64
	mem   int64
	count int
	since time.Time
}

// New returns a placer over fleet.
func New(fleet Fleet) *Placer {
	return &Placer{fleet: fleet, recent: make(map[string]*pending)}
}

// Pick chooses a node for spec, skipping the nodes in exclude.
func (p *Placer) Pick(spec *api.CreateSandboxRequest, exclude map[string]bool) (string, error) {
	return p.pick(spec, exclude, true)
}

// PickTransient chooses a node like Pick for work that holds no resources
// after it answers (an FnCall task runs in a worker the node already
// counts), so it does not count the placement.
func (p *Placer) PickTransient(spec *api.CreateSandboxRequest, exclude map[string]bool) (string, error) {
	return p.pick(spec, exclude, false)
}

func (p *Placer) pick(spec *api.CreateSandboxRequest, exclude map[string]bool, record bool) (string, error) {
	nodes := p.fleet.Up()
	p.mu.Lock()
	defer p.mu.Unlock()
	cands := make([]api.Node, 0, len(nodes))
	for _, n := range nodes {
		if exclude[n.Name] || !offers(n, spec.Tier) {
			continue
		}
		p.adjust(&n)
		if n.CPUCapacity > 0 && n.CPURequested+spec.CPU > n.CPUCapacity {
			continue
		}
		if n.MemoryMB > 0 && n.MemRequested+spec.MemoryMB > n.MemoryMB {
			continue
		}
		cands = append(cands, n)
	}
	if len(cands) == 0 {
		return "", ErrNoNode
	}
	best := cands[rand.IntN(len(cands))]
	for i := 1; i < K && len(cands) > 1; i++ {
		c := cands[rand.IntN(len(cands))]
		if load(c) < load(best) {
			best = c
		}
	}
	if !record {
		return best.Name, nil
	}
	r := p.recent[best.Name]
	if r == nil {
		r = &pending{since: time.Now()}
		p.recent[best.Name] = r
	}
	r.cpu += spec.CPU
	r.mem += spec.MemoryMB
	r.count++
	return best.Name, nil
}

// adjust adds this replica's placements that the node's last heartbeat
// cannot have counted yet.
func (p *Placer) adjust(n *api.Node) {
	r := p.recent[n.Name]
	if r == nil {
		return
	}
	if n.LastHeartbeat.After(r.since) {
		delete(p.recent, n.Name)
		return
	}
	n.CPURequested += r.cpu
	n.MemRequested += r.mem
	n.Sandboxes += r.count
}

func offers(n api.Node, tier string) bool {
	for _, t := range n.Tiers {
		if t == tier {
			return true
		}
	}
	return false
}

func load(n api.Node) float64 {
	l := 0.0
	if n.CPUCapacity > 0 {
		l = n.CPURequested / n.CPUCapacity
	}
	if n.MemoryMB > 0 {
		if m := float64(n.MemRequested) / float64(n.MemoryMB); m > l {
			l = m
		}
	}
	return l
}
