// Package watcher keeps the fleet view: which nodes are up, how loaded they
// are, and what each project holds. It is rebuilt from edge heartbeats, so
// it holds no durable state. When a node misses its heartbeats the watcher
// marks it down, records its sandboxes lost (bus.BucketLost), reports them
// on the event stream and stops offering it; when it heartbeats again it is
// up. The node destroys what was recorded lost instead of adopting it.
package watcher

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
)

// DownAfter is how long a silent node stays "up".
const DownAfter = 5 * time.Second

// upFresh is how long Up reuses its list although heartbeats arrived.
const upFresh = 20 * time.Millisecond

// Watcher tracks node heartbeats.
type Watcher struct {
	conn   *bus.Conn
	events *bus.Events
	lostKV *bus.Lost
	log    *slog.Logger

	mu    sync.RWMutex
	nodes map[string]*entry
	// projects sums live usage per project over every up node, counted
	// into the project and each of its ancestors ("a.b" adds to "a").
	projects map[string]api.Usage
	lost     map[string]lostSandbox // sandbox id -> its down node
	subs     []*nats.Subscription
	now      func() time.Time
	// apiservers: replica id -> last presence.
	apiservers map[string]time.Time

	stop chan struct{}
	wg   sync.WaitGroup

	upMu    sync.Mutex
	upCache []api.Node
	upAt    time.Time
	upGen   uint64 // w.gen when upCache was built
	upJoin  uint64 // w.joins when upCache was built
	gen     uint64 // bumped by every heartbeat (under mu)
	joins   uint64 // bumped when a node appears or comes back (under mu)
}

type lostSandbox struct{ node, project string }

type entry struct {
	node     api.Node
	received time.Time
	down     bool // reported down (events published)
	counted  bool // its Projects are in w.projects
	probing  bool // silent: being asked whether it is alive
}

// probeTimeout bounds the question to a silent node before it is marked
// down. A process that is gone answers "no responders" at once; one that
// is stopped or cut off does not answer.
const probeTimeout = time.Second

// Config wires a watcher.
type Config struct {
	Bus    *bus.Conn
	Logger *slog.Logger
	// CheckEvery is how often silent nodes are looked for; 0 = 500ms.
	CheckEvery time.Duration
	// Now is the clock (nil = time.Now; tests move it).
	Now func() time.Time
}

// New starts listening to heartbeats on conn.
func New(conn *bus.Conn) (*Watcher, error) {
	return Start(context.Background(), Config{Bus: conn})
}

// Start starts a watcher.
func Start(ctx context.Context, cfg Config) (*Watcher, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CheckEvery == 0 {
		cfg.CheckEvery = 500 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	w := &Watcher{
		conn: cfg.Bus, log: cfg.Logger.With("part", "watcher"), nodes: make(map[string]*entry),
		projects: make(map[string]api.Usage), lost: make(map[string]lostSandbox), now: cfg.Now,
		apiservers: make(map[string]time.Time), stop: make(chan struct{}),
	}
	if cfg.Bus == nil {
		return w, nil
	}
	ev, err := cfg.Bus.OpenEvents(ctx)
	if err != nil {
		return nil, err
	}
	w.events = ev
	if w.lostKV, err = cfg.Bus.OpenLost(ctx); err != nil {
		return nil, err
	}
	sub, err := cfg.Bus.Subscribe(bus.SubjectHeartbeat, w.observe)
	if err != nil {
		return nil, err
	}
	w.subs = append(w.subs, sub)
	sub, err = cfg.Bus.Subscribe(bus.SubjectAPIServerHeartbeat, func(data []byte) {
		id := string(data)
		if id == "" || len(id) > 64 {
			return
		}
		w.mu.Lock()
		w.apiservers[id] = w.now()
		w.mu.Unlock()
	})
	if err != nil {
		w.Close()
		return nil, err
	}
	w.subs = append(w.subs, sub)
	// Once the server has the subscriptions, a heartbeat asked for now
	// (serve's Announce) reaches this watcher.
	if err := cfg.Bus.NATS().Flush(); err != nil {
		w.Close()
		return nil, fmt.Errorf("watcher: subscribe: %w", err)
	}
	w.wg.Add(1)
	go w.checkLoop(cfg.CheckEvery)
	return w, nil
}

// Close stops listening.
func (w *Watcher) Close() {
	for _, s := range w.subs {
		_ = s.Unsubscribe()
	}
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	w.wg.Wait()
}

func (w *Watcher) observe(data []byte) {
	var n api.Node
	if err := json.Unmarshal(data, &n); err != nil || n.Name == "" || len(n.Name) > 64 {
		return
	}
	w.Observe(n)
}

// addUsage adds (sign +1) or removes (-1) a node's project usage.
func (w *Watcher) addUsage(projects map[string]api.Usage, sign int) {
	for p, u := range projects {
		for {
			t := w.projects[p]
			t.Sandboxes += sign * u.Sandboxes
			t.CPU += float64(sign) * u.CPU
			t.MemoryMB += int64(sign) * u.MemoryMB
			if t.Sandboxes <= 0 && t.CPU <= 1e-9 && t.MemoryMB <= 0 {
				delete(w.projects, p)
			} else {
				w.projects[p] = t
			}
			i := strings.LastIndexByte(p, '.')
			if i < 0 {
				break
			}
			p = p[:i]
		}
	}
}

// Observe records one heartbeat.
func (w *Watcher) Observe(n api.Node) {
	var up *entry
	w.mu.Lock()
	old := w.nodes[n.Name]
	if old != nil && old.counted {
		w.addUsage(old.node.Projects, -1)
	}
	e := &entry{node: n, received: w.now(), counted: true}
	w.addUsage(n.Projects, +1)
	if old != nil && old.down {
		up = e
		for id, l := range w.lost {
			if l.node == n.Name {
				delete(w.lost, id)
			}
		}
	}
	w.nodes[n.Name] = e
	w.gen++
	if old == nil || old.down || w.now().Sub(old.received) > DownAfter {
		w.joins++
	}
	w.mu.Unlock()
	if up != nil && w.events != nil {
		go w.publish(api.Event{Time: time.Now().UTC(), Type: api.EventNodeUp, Node: n.Name,
			Message: fmt.Sprintf("node %s is back with %d live sandboxes", n.Name, n.Sandboxes)},
			fmt.Sprintf("up-%s-%d", n.Name, n.LastHeartbeat.UnixNano()/int64(time.Second)))
	}
}

func (w *Watcher) publish(ev api.Event, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.events.Publish(ctx, ev, id); err != nil {
		w.log.Warn("publish event", "type", ev.Type, "err", err)
	}
}

func (w *Watcher) checkLoop(every time.Duration) {
	defer w.wg.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.check()
		}
	}
}

// check marks silent nodes down, drops their usage and reports their
// sandboxes lost. A silent node is asked first: one that answers is only
// slow to heartbeat (a loaded host) and stays up, for being marked down
// gets its sandboxes destroyed.
func (w *Watcher) check() {
	now := w.now()
	var silent []string
	w.mu.Lock()
	for name, e := range w.nodes {
		if !e.down && !e.probing && now.Sub(e.received) > DownAfter {
			e.probing = true
			silent = append(silent, name)
		}
	}
	for id, t := range w.apiservers {
		if now.Sub(t) > DownAfter {
			delete(w.apiservers, id)
		}
	}
	w.mu.Unlock()
	for _, name := range silent {
		w.wg.Add(1)
		go func(name string) {
			defer w.wg.Done()
			w.probe(name)
		}(name)
	}
}

// probe asks a silent node whether it is alive and marks it down if not.
func (w *Watcher) probe(name string) {
	alive := false
	if w.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		alive = w.conn.Ping(ctx, bus.EdgeSubject(name)) == nil
		cancel()
	}
	now := w.now()
	w.mu.Lock()
	e := w.nodes[name]
	if e == nil || e.down || !e.probing || now.Sub(e.received) <= DownAfter {
		if e != nil {
			e.probing = false
		}
		w.mu.Unlock()
		return // it heartbeated meanwhile
	}
	e.probing = false
	if alive {
		e.received = now // as good as a heartbeat
		w.mu.Unlock()
		w.log.Info("node missed its heartbeats but answers; kept up", "node", name, "last_heartbeat", e.node.LastHeartbeat)
		return
	}
	e.down = true
	if e.counted {
		w.addUsage(e.node.Projects, -1)
		e.counted = false
	}
	n := e.node
	w.mu.Unlock()
	w.nodeDown(n)
}

func (w *Watcher) nodeDown(n api.Node) {
	w.log.Warn("node is down", "node", n.Name, "last_heartbeat", n.LastHeartbeat)
	lost := map[string]string{}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var roster []byte
	if kv, err := w.conn.KeyValue(ctx, bus.BucketRoster, 0); err == nil {
		if e, err := kv.Get(ctx, n.Name); err == nil {
			roster = e.Value()
			bus.ParseRoster(roster, lost)
		}
	}
	epoch := n.LastHeartbeat.UnixNano() / int64(time.Second)
	w.mu.Lock()
	e := w.nodes[n.Name]
	back := e == nil || !e.down
	w.mu.Unlock()
	if back {
		return // it came back meanwhile
	}
	msg := fmt.Sprintf("node %s missed its heartbeats; %d sandboxes lost", n.Name, len(lost))
	if len(lost) > 0 && w.lostKV != nil {
		// Recorded before it is reported: a sandbox reported lost never
		// comes back to life (its node destroys it when it returns).
		if err := w.lostKV.Record(ctx, n.Name, epoch, roster); err != nil {
			w.log.Error("cannot record lost sandboxes; they stay unavailable until their node returns", "node", n.Name, "err", err)
			msg = fmt.Sprintf("node %s missed its heartbeats; its %d sandboxes are unavailable", n.Name, len(lost))
			lost = nil
		}
	}
	w.mu.Lock()
	for id, project := range lost {
		w.lost[id] = lostSandbox{node: n.Name, project: project}
	}
	w.mu.Unlock()
	if w.events == nil {
		return
	}
	now := time.Now().UTC()
	w.publish(api.Event{Time: now, Type: api.EventNodeDown, Node: n.Name, Message: msg},
		fmt.Sprintf("down-%s-%d", n.Name, epoch))
	ids := make([]string, 0, len(lost))
	for id := range lost {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		w.publish(api.Event{Time: now, Type: api.EventSandboxLost, Node: n.Name, Sandbox: id, Project: lost[id],
			Message: "its node " + n.Name + " is down"}, fmt.Sprintf("lost-%s-%d", id, epoch))
	}
}

// Events is the event stream (nil without a bus).
func (w *Watcher) Events() *bus.Events { return w.events }

// Lost reports whether sandbox id was reported lost with its node, and its
// project: from memory while this watcher saw the node down, else from the
// lost-sandbox bucket (a watcher started after the node went down; only on
// the rare path of a sandbox whose node does not answer).
func (w *Watcher) Lost(ctx context.Context, id, node string) (project string, ok bool) {
	w.mu.RLock()
	l, ok := w.lost[id]
	w.mu.RUnlock()
	if ok || w.lostKV == nil || node == "" {
		return l.project, ok
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	all, err := w.lostKV.Of(cctx, node)
	if err != nil {
		return "", false
	}
	project, ok = all[id]
	return project, ok
}

// ProjectUsage is what the live sandboxes of project and its descendants
// hold on the up nodes, as of their last heartbeats.
func (w *Watcher) ProjectUsage(project string) api.Usage {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.projects[project]
}

// APIServers is how many apiserver replicas announced themselves lately (at least 1).
func (w *Watcher) APIServers() int {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if len(w.apiservers) < 1 {
		return 1
	}
	return len(w.apiservers)
}

// Nodes lists every node seen, with State "down" for silent ones.
func (w *Watcher) Nodes() []api.Node {
	now := w.now()
	w.mu.RLock()
	out := make([]api.Node, 0, len(w.nodes))
	for _, e := range w.nodes {
		n := e.node
		if e.down || now.Sub(e.received) > DownAfter {
			n.State = "down"
		}
		out = append(out, n)
	}
	w.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Up lists the nodes that are up. The slice is shared: callers must not
// modify it. It is rebuilt when a heartbeat arrived, but at most every
// upFresh (a fleet of 160 nodes heartbeats 160 times a second; placement
// counts its own placements until a heartbeat shows them, so a view some
// milliseconds old only delays forgetting them), and every 100ms anyway; a
// node that joins or comes back is seen at once.
func (w *Watcher) Up() []api.Node {
	w.mu.RLock()
	gen, joins := w.gen, w.joins
	w.mu.RUnlock()
	w.upMu.Lock()
	defer w.upMu.Unlock()
	if age := w.now().Sub(w.upAt); w.upCache != nil && w.upJoin == joins &&
		(age < upFresh || (w.upGen == gen && age < 100*time.Millisecond)) {
		return w.upCache
	}
	all := w.Nodes()
	up := make([]api.Node, 0, len(all))
	for _, n := range all {
		if n.State == "up" {
			up = append(up, n)
		}
	}
	w.upCache, w.upAt, w.upGen, w.upJoin = up, w.now(), gen, joins
	return up
}

// Known reports whether node ever heartbeated, and whether it is up.
func (w *Watcher) Known(node string) (known, up bool) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	e := w.nodes[node]
	if e == nil {
		return false, false
	}
	return true, !e.down && w.now().Sub(e.received) <= DownAfter
}

// DataAddr is the address of node's data listener from its last
// heartbeat ("" when unknown, or when the node has none).
func (w *Watcher) DataAddr(node string) string {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if e := w.nodes[node]; e != nil {
		return e.node.DataAddr
	}
	return ""
}

// WaitForNode blocks until node is up or the timeout passes.
func (w *Watcher) WaitForNode(node string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if _, up := w.Known(node); up {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}
