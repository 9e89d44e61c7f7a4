package edge

// The audit of each sandbox is internal/edge/audit's (its package
// comment). The core keeps each sandbox's audit.State (sandbox.audit) and
// its policy (SetPolicy at create, claim and adoption), registers its
// container with the node's telemetry when it starts or is adopted and
// unregisters it when it stops (auditStart, auditStop), frames its
// operations (handlers.go: State.Enter, the trusted windows) and files the
// records of its own (limits in handlers.go, the network's refusals in
// netdenials.go), each through e.audit with the sandbox as an
// audit.Sandbox (auditSandbox).

import (
	"context"
	"log/slog"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge/audit"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/telemetry"
)

// auditSandbox is sb as the audit sees it.
type auditSandbox struct{ *sandbox }

var _ audit.Sandbox = auditSandbox{}

func (s auditSandbox) Audit() *audit.State { return &s.audit }

func (s auditSandbox) Project() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec.Spec.Project
}

func (s auditSandbox) Watched() (bool, string) {
	if s.stateless {
		return false, ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if a := s.rec.Spec.Audit; a != nil && a.Off {
		return false, ""
	}
	for _, l := range s.rec.Spec.Layers {
		if l.Protected && l.Mount != "" {
			return true, l.Mount
		}
	}
	return true, ""
}

func (s auditSandbox) Live() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.rec.Sandbox.State
	return !s.stopping && (st == api.StateRunning || st == api.StatePaused || st == api.StateCreating)
}

// auditHost is the core as the audit sees it.
type auditHost struct{ e *Edge }

var _ audit.Host = auditHost{}

func (h auditHost) Logger() *slog.Logger { return h.e.log }

func (h auditHost) After(d time.Duration, f func()) {
	if !h.e.wg.Enter() {
		return // the edge is closing
	}
	time.AfterFunc(d, func() {
		defer h.e.wg.Done()
		f()
	})
}

func (h auditHost) AppendAudit(ctx context.Context, key string, b []byte) error {
	return h.e.tlog.AppendAudit(ctx, key, b)
}

func (h auditHost) Charge(ctx context.Context, project, key string, n int64) {
	h.e.chargeTrajectory(ctx, project, key, n)
}

func (h auditHost) Fail(sb audit.Sandbox, reason string) {
	s := sb.(auditSandbox).sandbox
	h.e.wg.Go(func() { h.e.stop(context.Background(), s, api.StateFailed, reason) })
}

// startTelemetry loads the node's programs (Config.Telemetry) and reads
// what they record until ctx ends. Without them the node runs and its
// view says features.telemetry: false.
func (e *Edge) startTelemetry(ctx context.Context) {
	if !e.cfg.Telemetry || !e.audit.Open(telemetry.Options{Refusals: e.cfg.TelemetryRefusals, Files: e.cfg.TelemetryFiles}) {
		return
	}
	e.features.Telemetry = true
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.audit.Run(ctx)
	}()
}

// auditStart registers the cgroups of sb's container (handle h) with the
// node's telemetry; auditStop unregisters them (its container stops or
// serves another sandbox).
func (e *Edge) auditStart(sb *sandbox, h runtime.Handle) { e.audit.Start(auditSandbox{sb}, h) }
func (e *Edge) auditStop(sb *sandbox)                    { e.audit.Stop(&sb.audit) }

// auditOf answers OpAudit.
func (e *Edge) auditOf(req *AuditRequest) (*api.AuditList, error) {
	sb, err := e.lookup(req.ID)
	if err != nil {
		return nil, err
	}
	return e.audit.List(auditSandbox{sb}, req)
}
