// Package netdeny is the network-denial log of a node's sandboxes: a
// bounded log per networked sandbox of what its policy refused, with the
// time and the sandbox's trajectory step. Names come from the runtime as
// the resolver refuses them (Record); packets from the kernel's
// per-destination record (sandboxnet, runtime.NetworkReporter), read
// every second for the running networked sandboxes (Run) and on each read
// of the log (Read): an entry is a destination whose count grew, with the
// packets since. Each refusal also goes to the sandbox's audit
// (Sandbox.Audit). Each sandbox publishes at most one
// sandbox.network.denied event a second (EventEvery), and the node's
// totals by reason go into its heartbeat (Totals).
//
// The lifecycle core (package edge) keeps the sandboxes and hands each
// over as a Sandbox; what the package needs of the core is its Host. It
// never sees the core's records or locks.
//
// # Locks
//
// Log.mu is a leaf: the core may hold its Edge.mu and sandbox.mu around
// Forget (it drops a sandbox under both), and nothing is locked under it.
// No Sandbox or Host method, and no runtime call, is made while it is
// held; Sandbox methods take the core's sandbox.mu, so the core calls
// Record, Poll and Read without holding it.
package netdeny

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
)

// EventEvery is the least time between two events of one sandbox.
const EventEvery = time.Second

// pollEvery is how often Run reads the running networked sandboxes'
// kernel records.
const pollEvery = time.Second

// Net is what the log reads of a sandbox, at one time.
type Net struct {
	ID      string
	Project string
	// Step is its trajectory step now.
	Step int64
	// Handle is its container's while it has one and a network policy
	// (nil otherwise: nothing to poll).
	Handle *runtime.Handle
}

// Sandbox is a sandbox of the core as the denial log sees it.
type Sandbox interface {
	Net() Net
	// Audit files refusals in its audit (kind denied).
	Audit(recs ...api.NetworkDenialRecord)
}

// Host is what the denial log needs of the lifecycle core.
type Host interface {
	// Node is the node's name (in events).
	Node() string
	// Publishing reports whether the node publishes events.
	Publishing() bool
	// Publish publishes ev under msgID, in the background, best effort.
	Publish(ev api.Event, msgID string)
}

// sandboxLog is one sandbox's log.
type sandboxLog struct {
	entries []api.NetworkDenialRecord // ring of api.MaxDenialLog
	dropped int64
	seen    map[string]int64 // kernel record: destination|proto|reason -> packets
	pending int64            // refusals not yet in an event
	last    time.Time        // last event
}

// Log is the denial logs of one node's sandboxes, by sandbox id.
type Log struct {
	host  Host
	nr    runtime.NetworkReporter // nil: the runtime keeps no record
	every time.Duration           // Run's polls

	mu    sync.Mutex
	bySB  map[string]*sandboxLog
	total map[string]int64 // by reason, since the edge started (node heartbeat)
}

// New returns the denial log of the node whose core is h and runtime rt.
func New(h Host, rt runtime.Runtime) *Log {
	l := &Log{host: h, every: pollEvery, bySB: map[string]*sandboxLog{}, total: map[string]int64{}}
	l.nr, _ = rt.(runtime.NetworkReporter)
	return l
}

// logOfLocked is id's log, made when it has none.
func (l *Log) logOfLocked(id string) *sandboxLog {
	s := l.bySB[id]
	if s == nil {
		s = &sandboxLog{seen: map[string]int64{}}
		l.bySB[id] = s
	}
	return s
}

// addLocked appends recs to id's log, dropping the oldest beyond
// api.MaxDenialLog (counted), and counts them in the node's totals.
func (l *Log) addLocked(id string, recs ...api.NetworkDenialRecord) {
	s := l.logOfLocked(id)
	for _, r := range recs {
		s.entries = append(s.entries, r)
		s.pending += r.Count
		l.total[r.Reason] += r.Count
	}
	if over := len(s.entries) - api.MaxDenialLog; over > 0 {
		s.entries = append(s.entries[:0:0], s.entries[over:]...)
		s.dropped += int64(over)
	}
}

// Totals copies the node's counts by reason (nil when none).
func (l *Log) Totals() map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.total) == 0 {
		return nil
	}
	out := make(map[string]int64, len(l.total))
	for k, v := range l.total {
		out[k] = v
	}
	return out
}

// Forget drops sandbox id's log (it was destroyed).
func (l *Log) Forget(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.bySB, id)
}

// Record logs a name the runtime's resolver refused to sb.
func (l *Log) Record(sb Sandbox, r api.NetworkDenialRecord) {
	n := sb.Net()
	r.Step = n.Step
	l.mu.Lock()
	l.addLocked(n.ID, r)
	l.mu.Unlock()
	sb.Audit(r)
	l.maybeEvent(sb)
}

// Poll reads sb's kernel record and logs what grew since the last read.
func (l *Log) Poll(sb Sandbox) error {
	if l.nr == nil {
		return nil
	}
	n := sb.Net()
	if n.Handle == nil {
		return nil
	}
	dd, err := l.nr.NetworkDeniedDestinations(*n.Handle)
	if err != nil {
		return err // the runtime's, as Read's answer quotes it
	}
	now := time.Now().UTC()
	l.mu.Lock()
	s := l.logOfLocked(n.ID)
	var recs []api.NetworkDenialRecord
	for _, d := range dd {
		if d.Protocol == "dns" {
			continue // logged as asked
		}
		k := d.Destination + "|" + d.Protocol + "|" + d.Reason
		if c := d.Count - s.seen[k]; c > 0 {
			recs = append(recs, api.NetworkDenialRecord{Time: now, Step: n.Step, Destination: d.Destination,
				Protocol: d.Protocol, Reason: d.Reason, Count: c})
		}
		s.seen[k] = d.Count
	}
	l.addLocked(n.ID, recs...)
	l.mu.Unlock()
	if len(recs) > 0 {
		sb.Audit(recs...)
		l.maybeEvent(sb)
	}
	return nil
}

// maybeEvent publishes sb's pending refusals unless it did less than
// EventEvery ago (a later poll publishes them then).
func (l *Log) maybeEvent(sb Sandbox) {
	if !l.host.Publishing() {
		return
	}
	n := sb.Net()
	l.mu.Lock()
	s := l.logOfLocked(n.ID)
	if s.pending == 0 || time.Since(s.last) < EventEvery {
		l.mu.Unlock()
		return
	}
	c := s.pending
	var lastDst string
	if len(s.entries) > 0 {
		r := s.entries[len(s.entries)-1]
		lastDst = r.Protocol + " " + r.Destination + " (" + r.Reason + ")"
	}
	s.pending, s.last = 0, time.Now()
	l.mu.Unlock()
	ev := api.Event{Time: time.Now().UTC(), Type: api.EventSandboxNetworkDenied, Node: l.host.Node(), Sandbox: n.ID,
		Project: n.Project, Message: fmt.Sprintf("%d refused; the last: %s", c, lastDst)}
	l.host.Publish(ev, fmt.Sprintf("denied-%s-%d", n.ID, ev.Time.UnixNano()))
}

// Run polls the running networked sandboxes (networked lists them) every
// second, and publishes what an earlier event left pending, until ctx
// ends. The core runs it as one of its goroutines.
func (l *Log) Run(ctx context.Context, networked func() []Sandbox) {
	t := time.NewTicker(l.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, sb := range networked() {
			_ = l.Poll(sb)
			l.maybeEvent(sb)
		}
	}
}

// Read answers a read of sandbox id's log (OpNetworkDenials): it polls sb
// (the sandbox id names) first.
func (l *Log) Read(sb Sandbox, id string) (*api.NetworkDenials, error) {
	if err := l.Poll(sb); err != nil {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s: network record cannot be read now: %v", id, err)}
	}
	out := &api.NetworkDenials{ID: id, Denials: []api.NetworkDenialRecord{}}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := l.bySB[id]; s != nil {
		out.Denials = append(out.Denials, s.entries...)
		out.Dropped = s.dropped
	}
	return out, nil
}
