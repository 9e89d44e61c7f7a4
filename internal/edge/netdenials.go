package edge

// The network-denial log is internal/edge/netdeny's (its package
// comment). The core hands it the runtime's refusals (recordDenial: the
// sandbox whose container the runtime names), the running networked
// sandboxes (denialLoop) and the reads (networkDenials), each sandbox as
// a netdeny.Sandbox (denySandbox); it drops a sandbox's log with the
// sandbox (dropLocked, the reaper) and sends the totals in its heartbeat.

import (
	"context"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge/netdeny"
)

// denySandbox is sb as the denial log sees it.
type denySandbox struct {
	*sandbox
	e *Edge
}

var _ netdeny.Sandbox = denySandbox{}

func (s denySandbox) Net() netdeny.Net {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := netdeny.Net{ID: s.rec.Sandbox.ID, Project: s.rec.Spec.Project, Step: s.rec.Sandbox.Step}
	if s.inst != nil && s.inst.Handle.Net != nil && s.rec.Spec.Network != nil {
		h := s.inst.Handle
		n.Handle = &h
	}
	return n
}

func (s denySandbox) Audit(recs ...api.NetworkDenialRecord) {
	s.e.audit.Denied(auditSandbox{s.sandbox}, recs...)
}

// denyHost is the core as the denial log sees it.
type denyHost struct{ e *Edge }

var _ netdeny.Host = denyHost{}

func (h denyHost) Node() string     { return h.e.cfg.Node }
func (h denyHost) Publishing() bool { return h.e.events != nil }

func (h denyHost) Publish(ev api.Event, msgID string) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := h.e.events.Publish(ctx, ev, msgID); err != nil {
			h.e.log.Debug("publish event", "type", ev.Type, "err", err)
		}
	}()
}

// recordDenial is the runtime's hook: a refused name. hid is the
// runtime's id (Handle.ID): a recycled container's is the sandbox's that
// first had it.
func (e *Edge) recordDenial(hid string, r api.NetworkDenialRecord) {
	if sb := e.byHandle(hid); sb != nil {
		e.denials.Record(denySandbox{sb, e}, r)
	}
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

// denialLoop polls the running networked sandboxes every second.
func (e *Edge) denialLoop(ctx context.Context) {
	defer e.wg.Done()
	e.denials.Run(ctx, e.networked)
}

// networked lists the running networked sandboxes.
func (e *Edge) networked() []netdeny.Sandbox {
	e.mu.Lock()
	defer e.mu.Unlock()
	var nets []netdeny.Sandbox
	for _, sb := range e.sandboxes {
		sb.mu.Lock()
		if sb.rec.Spec.Network != nil && sb.inst != nil && sb.rec.Sandbox.State == api.StateRunning {
			nets = append(nets, denySandbox{sb, e})
		}
		sb.mu.Unlock()
	}
	return nets
}

// networkDenials answers OpNetworkDenials.
func (e *Edge) networkDenials(id string) (*api.NetworkDenials, error) {
	sb, err := e.lookup(id)
	if err != nil {
		return nil, err
	}
	return e.denials.Read(denySandbox{sb, e}, id)
}
