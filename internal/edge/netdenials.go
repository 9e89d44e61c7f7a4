package edge

// Network denials: a bounded log per networked sandbox of what its policy
// refused, with the time and the sandbox's trajectory step. Names come
// from the runtime as the resolver refuses them; packets from the
// kernel's per-destination record (sandboxnet), read every second for
// running networked sandboxes and on each read of the log: an entry is
// a destination whose count grew, with the packets since. Each sandbox
// publishes at most one sandbox.network.denied event a second.
//
// Lock order: sandbox.mu, then denials.mu (a leaf).

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
)

// denialEventEvery is the least time between two events of one sandbox.
const denialEventEvery = time.Second

type denialLog struct {
	entries []api.NetworkDenialRecord // ring of api.MaxDenialLog
	dropped int64
	seen    map[string]int64 // kernel record: destination|proto|reason -> packets
	pending int64            // refusals not yet in an event
	last    time.Time        // last event
}

type denials struct {
	mu    sync.Mutex
	bySB  map[string]*denialLog
	total map[string]int64 // by reason, since the edge started (node heartbeat)
}

func (d *denials) logOf(id string) *denialLog {
	if d.bySB == nil {
		d.bySB, d.total = map[string]*denialLog{}, map[string]int64{}
	}
	l := d.bySB[id]
	if l == nil {
		l = &denialLog{seen: map[string]int64{}}
		d.bySB[id] = l
	}
	return l
}

// add appends records to id's log (d.mu held).
func (d *denials) addLocked(id string, recs ...api.NetworkDenialRecord) {
	l := d.logOf(id)
	for _, r := range recs {
		l.entries = append(l.entries, r)
		l.pending += r.Count
		d.total[r.Reason] += r.Count
	}
	if over := len(l.entries) - api.MaxDenialLog; over > 0 {
		l.entries = append(l.entries[:0:0], l.entries[over:]...)
		l.dropped += int64(over)
	}
}

// totals copies the node's counts by reason (nil when none).
func (d *denials) totals() map[string]int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.total) == 0 {
		return nil
	}
	out := make(map[string]int64, len(d.total))
	for k, v := range d.total {
		out[k] = v
	}
	return out
}

// forget drops a sandbox's log (it was destroyed).
func (d *denials) forget(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.bySB, id)
}

// recordDenial is the runtime's hook: a refused name. id is the
// runtime's (Handle.ID): a recycled container's is the sandbox's that
// first had it.
func (e *Edge) recordDenial(hid string, r api.NetworkDenialRecord) {
	sb := e.byHandle(hid)
	if sb == nil {
		return
	}
	sb.mu.Lock()
	id := sb.rec.Sandbox.ID
	r.Step = sb.rec.Sandbox.Step
	sb.mu.Unlock()
	e.denials.mu.Lock()
	e.denials.addLocked(id, r)
	e.denials.mu.Unlock()
	e.auditDenials(sb, r)
	e.maybeDenialEvent(sb)
}

// byHandle is the sandbox whose container's runtime id is hid.
func (e *Edge) byHandle(hid string) *sandbox {
	e.mu.Lock()
	defer e.mu.Unlock()
	if sb := e.sandboxes[hid]; sb != nil {
		sb.mu.Lock()
		same := sb.inst != nil && sb.inst.Handle.ID == hid
		sb.mu.Unlock()
		if same {
			return sb
		}
	}
	for _, sb := range e.sandboxes {
		sb.mu.Lock()
		same := sb.inst != nil && sb.inst.Handle.ID == hid
		sb.mu.Unlock()
		if same {
			return sb
		}
	}
	return nil
}

// auditDenials adds network refusals to sb's audit (kind denied).
func (e *Edge) auditDenials(sb *sandbox, recs ...api.NetworkDenialRecord) {
	for _, r := range recs {
		e.addAudit(sb, api.AuditRecord{Time: r.Time, Step: sb.auditStepNow.Load(), Kind: api.AuditKindDenied,
			Dest: r.Destination, Op: r.Protocol, Reason: r.Reason, Count: r.Count})
	}
}

// pollDenials reads sb's kernel record and logs what grew.
func (e *Edge) pollDenials(sb *sandbox) error {
	nr, ok := e.cfg.Runtime.(runtime.NetworkReporter)
	if !ok {
		return nil
	}
	sb.mu.Lock()
	if sb.inst == nil || sb.inst.Handle.Net == nil || sb.rec.Spec.Network == nil {
		sb.mu.Unlock()
		return nil
	}
	h, id, step := sb.inst.Handle, sb.rec.Sandbox.ID, sb.rec.Sandbox.Step
	sb.mu.Unlock()
	dd, err := nr.NetworkDeniedDestinations(h)
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	e.denials.mu.Lock()
	l := e.denials.logOf(id)
	var recs []api.NetworkDenialRecord
	for _, d := range dd {
		if d.Protocol == "dns" {
			continue // logged as asked
		}
		k := d.Destination + "|" + d.Protocol + "|" + d.Reason
		if n := d.Count - l.seen[k]; n > 0 {
			recs = append(recs, api.NetworkDenialRecord{Time: now, Step: step, Destination: d.Destination,
				Protocol: d.Protocol, Reason: d.Reason, Count: n})
		}
		l.seen[k] = d.Count
	}
	e.denials.addLocked(id, recs...)
	e.denials.mu.Unlock()
	if len(recs) > 0 {
		e.auditDenials(sb, recs...)
		e.maybeDenialEvent(sb)
	}
	return nil
}

// maybeDenialEvent publishes sb's pending refusals unless it did less
// than denialEventEvery ago (the next poll publishes them then).
func (e *Edge) maybeDenialEvent(sb *sandbox) {
	if e.events == nil {
		return
	}
	sb.mu.Lock()
	id, project := sb.rec.Sandbox.ID, sb.rec.Spec.Project
	sb.mu.Unlock()
	e.denials.mu.Lock()
	l := e.denials.logOf(id)
	if l.pending == 0 || time.Since(l.last) < denialEventEvery {
		e.denials.mu.Unlock()
		return
	}
	n := l.pending
	var lastDst string
	if len(l.entries) > 0 {
		r := l.entries[len(l.entries)-1]
		lastDst = r.Protocol + " " + r.Destination + " (" + r.Reason + ")"
	}
	l.pending, l.last = 0, time.Now()
	e.denials.mu.Unlock()
	ev := api.Event{Time: time.Now().UTC(), Type: api.EventSandboxNetworkDenied, Node: e.cfg.Node, Sandbox: id, Project: project,
		Message: fmt.Sprintf("%d refused; the last: %s", n, lastDst)}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.events.Publish(ctx, ev, fmt.Sprintf("denied-%s-%d", id, ev.Time.UnixNano())); err != nil {
			e.log.Debug("publish event", "type", ev.Type, "err", err)
		}
	}()
}

// denialLoop polls the running networked sandboxes every second.
func (e *Edge) denialLoop(ctx context.Context) {
	defer e.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		e.mu.Lock()
		var nets []*sandbox
		for _, sb := range e.sandboxes {
			sb.mu.Lock()
			if sb.rec.Spec.Network != nil && sb.inst != nil && sb.rec.Sandbox.State == api.StateRunning {
				nets = append(nets, sb)
			}
			sb.mu.Unlock()
		}
		e.mu.Unlock()
		for _, sb := range nets {
			_ = e.pollDenials(sb)
			e.maybeDenialEvent(sb) // what an earlier event left pending
		}
	}
}

// networkDenials answers OpNetworkDenials.
func (e *Edge) networkDenials(id string) (*api.NetworkDenials, error) {
	sb, err := e.lookup(id)
	if err != nil {
		return nil, err
	}
	if err := e.pollDenials(sb); err != nil {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s: network record cannot be read now: %v", id, err)}
	}
	out := &api.NetworkDenials{ID: id, Denials: []api.NetworkDenialRecord{}}
	e.denials.mu.Lock()
	defer e.denials.mu.Unlock()
	if l := e.denials.bySB[id]; l != nil {
		out.Denials = append(out.Denials, l.entries...)
		out.Dropped = l.dropped
	}
	return out, nil
}
