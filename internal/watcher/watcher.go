// Package watcher keeps the fleet view: which nodes are up and how loaded
// they are. It is rebuilt from edge heartbeats, so it holds no durable state.
package watcher

import (
	"encoding/json"
	"sort"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
)

// DownAfter is how long a silent node stays "up".
const DownAfter = 5 * time.Second

// Watcher tracks node heartbeats.
type Watcher struct {
	mu    sync.RWMutex
	nodes map[string]*entry
	sub   *nats.Subscription
	now   func() time.Time
}

type entry struct {
	node     api.Node
	received time.Time
}

// New starts listening to heartbeats on conn.
func New(conn *bus.Conn) (*Watcher, error) {
	w := &Watcher{nodes: make(map[string]*entry), now: time.Now}
	sub, err := conn.Subscribe(bus.SubjectHeartbeat, w.observe)
	if err != nil {
		return nil, err
	}
	w.sub = sub
	return w, nil
}

// Close stops listening.
func (w *Watcher) Close() {
	if w.sub != nil {
		_ = w.sub.Unsubscribe()
	}
}

func (w *Watcher) observe(data []byte) {
	var n api.Node
	if err := json.Unmarshal(data, &n); err != nil || n.Name == "" {
		return
	}
	w.Observe(n)
}

// Observe records one heartbeat.
func (w *Watcher) Observe(n api.Node) {
	w.mu.Lock()
	w.nodes[n.Name] = &entry{node: n, received: w.now()}
	w.mu.Unlock()
}

// Nodes lists every node seen, with State "down" for silent ones.
func (w *Watcher) Nodes() []api.Node {
	now := w.now()
	w.mu.RLock()
	out := make([]api.Node, 0, len(w.nodes))
	for _, e := range w.nodes {
		n := e.node
		if now.Sub(e.received) > DownAfter {
			n.State = "down"
		}
		out = append(out, n)
	}
	w.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Up lists the nodes that are up.
func (w *Watcher) Up() []api.Node {
	all := w.Nodes()
	up := all[:0]
	for _, n := range all {
		if n.State == "up" {
			up = append(up, n)
		}
	}
	return up
}

// WaitForNode blocks until node is up or the timeout passes.
func (w *Watcher) WaitForNode(node string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, n := range w.Up() {
			if n.Name == node {
				return true
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}
