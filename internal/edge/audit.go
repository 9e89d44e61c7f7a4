package edge

// The audit (issue 20): what each sandbox's processes did, collected in
// the kernel by the node's telemetry (internal/telemetry: one set of BPF
// programs for every sandbox, filtered by cgroup) and kept per sandbox in
// a bounded ring, each record stamped with the trajectory step running
// when it happened (recorded sets the step in the kernel's map around
// every live operation).
//
// Lock order: traj.mu (recorded sets the step), then auditState.mu, then
// telemetry.Collector.mu; auditRing.mu alone, or inside sandbox.mu (a
// pool claim resets it); none of them is held while taking sandbox.mu.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/auditpolicy"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/telemetry"
)

// AuditRingSize bounds the records kept per sandbox: beyond it the oldest
// are dropped (and counted).
const AuditRingSize = 4096

// auditRing is one sandbox's records, oldest first, at most AuditRingSize.
type auditRing struct {
	mu      sync.Mutex
	recs    []api.AuditRecord
	head    int // index of the oldest once the ring is full
	dropped int64
	seq     int64 // of the newest record
}

func (a *auditRing) add(r api.AuditRecord) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seq++
	r.Seq = a.seq
	if len(a.recs) < AuditRingSize {
		a.recs = append(a.recs, r)
		return
	}
	a.recs[a.head] = r
	a.head = (a.head + 1) % len(a.recs)
	a.dropped++
}

// reset forgets every record (a pool member claimed by a sandbox).
func (a *auditRing) reset() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.recs, a.head, a.dropped, a.seq = nil, 0, 0, 0
}

// list returns the records that req selects, oldest first.
func (a *auditRing) list(req *AuditRequest) ([]api.AuditRecord, int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []api.AuditRecord{}
	for i := range a.recs {
		r := a.recs[(a.head+i)%len(a.recs)]
		if r.Seq <= req.After || (req.HasStep && r.Step != req.Step) || (req.Kind != "" && r.Kind != req.Kind) {
			continue
		}
		out = append(out, r)
	}
	return out, a.dropped
}

// unsaved returns the records after seq after that belong to step or to
// no step (between steps), at most limit (the newest dropped beyond it,
// counted), and the newest seq looked at.
func (a *auditRing) unsaved(after, step int64, limit int) ([]api.AuditRecord, int64, int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []api.AuditRecord
	var over int64
	last := after
	for i := range a.recs {
		r := a.recs[(a.head+i)%len(a.recs)]
		if r.Seq <= after {
			continue
		}
		last = max(last, r.Seq)
		if r.Step != step && r.Step != 0 {
			continue
		}
		if len(out) == limit {
			over++
			continue
		}
		out = append(out, r)
	}
	return out, last, over
}

// auditSaveDelay: a step's last records reach the ring a few drain rounds
// after it ended.
const auditSaveDelay = 4 * telemetry.DrainEvery

// saveAudit persists, a moment after step ended, the step's records (and
// those between steps) with trajectory key's log, so that they outlive
// the sandbox (GET /v1/trajectories/{name}?audit=1).
func (e *Edge) saveAudit(sb *sandbox, key string, step int64) {
	if e.audit.tel == nil && sb.policy.Load().Empty() {
		return // nothing records anything but limits: kept live only
	}
	if !e.wg.Enter() {
		return // the edge is closing
	}
	time.AfterFunc(auditSaveDelay, func() {
		defer e.wg.Done()
		sb.auditSaveMu.Lock()
		defer sb.auditSaveMu.Unlock()
		recs, last, over := sb.audit.unsaved(sb.auditSaved, step, edgeproto.MaxSavedAudit)
		sb.auditSaved = last
		if len(recs) == 0 {
			return
		}
		b, err := json.Marshal(&edgeproto.AuditEntry{Step: step, Records: recs, Dropped: over})
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.tlog.AppendAudit(ctx, key, b); err != nil {
			e.log.Warn("edge: persist a step's audit", "trajectory", key, "step", step, "err", err)
			return
		}
		sb.mu.Lock()
		project := sb.rec.Spec.Project
		sb.mu.Unlock()
		e.chargeTrajectory(ctx, project, key, int64(len(b)))
	})
}

// audited is a registered sandbox: where its records go, and the host id
// its user namespace maps its root to (0: it runs as host root).
type audited struct {
	sb     *sandbox
	idBase uint32
}

// sandboxIDs is how many host ids a sandbox's user namespace maps
// (runtime.Handle.IDBase).
const sandboxIDs = 65536

// auditState is the node's telemetry: nil collector when the kernel
// cannot run it.
type auditState struct {
	tel  *telemetry.Collector
	mu   sync.Mutex
	next uint64
	by   map[uint64]audited // cookie -> sandbox
}

// startTelemetry loads the node's programs and reads what they record
// until ctx ends. Without them (no BTF, no permission) the node runs and
// its view says features.telemetry: false.
func (e *Edge) startTelemetry(ctx context.Context) {
	if !e.cfg.Telemetry {
		return
	}
	if cl, ok := e.cfg.Runtime.(runtime.CgroupLister); !ok || cl.UnifiedRoot() == "" {
		// The programs know sandboxes by their cgroup v2 ids.
		e.log.Warn("edge: no cgroup v2 hierarchy: running without telemetry")
		return
	}
	tel, err := telemetry.Open(e.log, telemetry.Options{Refusals: e.cfg.TelemetryRefusals, Files: e.cfg.TelemetryFiles})
	if err != nil {
		e.log.Warn("edge: running without telemetry (the audit records nothing)", "err", err)
		return
	}
	e.audit.tel = tel
	e.audit.by = map[uint64]audited{}
	e.features.Telemetry = true
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if err := tel.Run(ctx, e.deliverAudit); err != nil {
			e.log.Error("edge: telemetry stopped", "err", err)
		}
	}()
}

// closeTelemetry detaches the programs (after the reader ended).
func (e *Edge) closeTelemetry() {
	if e.audit.tel != nil {
		if err := e.audit.tel.Close(); err != nil {
			e.log.Warn("edge: close telemetry", "err", err)
		}
	}
}

// sessionPlumbing is where the agent keeps the FIFOs and scripts of its
// long-lived shells (confine.FIFODir): a session shell's redirections
// into it, on every command, are not worth a record.
const sessionPlumbing = "/dev/.warren/"

// stepCancels are the operations of a sandbox running now, each with
// the cancel of its context: an audit policy's kill-step cancels them
// (the agent then kills their commands). Its mu is a leaf lock.
type stepCancels struct {
	mu   sync.Mutex
	next int
	m    map[int]context.CancelCauseFunc
}

// errPolicyKill is the cause of an operation cancelled by a kill-step or
// fail-sandbox hook.
var errPolicyKill = errors.New("ended by an audit policy hook")

// enter registers an operation; leave (always called) unregisters it.
func (s *stepCancels) enter(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	s.mu.Lock()
	if s.m == nil {
		s.m = map[int]context.CancelCauseFunc{}
	}
	s.next++
	k := s.next
	s.m[k] = cancel
	s.mu.Unlock()
	return ctx, func() {
		s.mu.Lock()
		delete(s.m, k)
		s.mu.Unlock()
		cancel(nil)
	}
}

// cancelAll cancels every registered operation with errPolicyKill.
func (s *stepCancels) cancelAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.m {
		c(errPolicyKill)
	}
	return len(s.m)
}

// killedByPolicy reports whether ctx (of enter) was cancelled by a hook.
func killedByPolicy(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), errPolicyKill)
}

// addAudit files r in sb's audit, after the create's workspace filter,
// and applies the create's policy hooks to it.
func (e *Edge) addAudit(sb *sandbox, r api.AuditRecord) {
	p := sb.policy.Load()
	if p.Off() {
		return
	}
	if p.Empty() {
		sb.audit.add(r)
		return
	}
	if p.Skip(&r) {
		return
	}
	on, do := p.Match(&r)
	r.Rule, r.Action = on, do
	sb.audit.add(r)
	switch do {
	case api.AuditDoKillStep:
		n := sb.steps.cancelAll()
		e.log.Info("audit policy: step killed", "sandbox", sandboxID(sb), "rule", on, "operations", n)
	case api.AuditDoFailSandbox:
		sb.steps.cancelAll()
		e.log.Warn("audit policy: sandbox failed", "sandbox", sandboxID(sb), "rule", on)
		e.wg.Go(func() { e.stop(context.Background(), sb, api.StateFailed, "audit policy: "+on) })
	}
}

// auditOff reports whether sb's create turned its audit off.
func auditOff(sb *sandbox) bool {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.rec.Spec.Audit != nil && sb.rec.Spec.Audit.Off
}

// setPolicy compiles a create's audit options for sb (checked at create:
// a spec that no longer compiles, from an older record, applies nothing).
func setPolicy(sb *sandbox, spec *api.AuditSpec) {
	p, err := auditpolicy.Compile(spec)
	if err != nil {
		p = &auditpolicy.Policy{}
	}
	sb.policy.Store(p)
}

// sandboxID reads sb's id (a pool claim changes it, under sb.mu).
func sandboxID(sb *sandbox) string {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	return sb.rec.Sandbox.ID
}

// auditLimits records the limits a finished command hit (kind limit).
func (e *Edge) auditLimits(sb *sandbox, r *api.ExecResult) {
	var ops []string
	if r.OOMKilled {
		ops = append(ops, api.AuditLimitOOM)
	}
	if r.PidsLimited {
		ops = append(ops, api.AuditLimitPids)
	}
	if r.DiskFull {
		ops = append(ops, api.AuditLimitDisk)
	}
	if r.Truncated {
		ops = append(ops, api.AuditLimitOutput)
	}
	for _, op := range ops {
		e.addAudit(sb, api.AuditRecord{Time: time.Now(), Step: sb.auditStepNow.Load(), Kind: api.AuditKindLimit, Op: op})
	}
}

// trustedWindows are the times a sandbox's trusted commands ran: a file
// operation or connection beside its agent (telemetry.Record.Beside) then
// is the trusted command's own and is not recorded; one at any other time
// is a process the agent started and had not yet moved into work/. Its mu
// is a leaf lock.
type trustedWindows struct {
	mu      sync.Mutex
	running int
	since   time.Time
	past    [4][2]time.Time // the last windows that ended, [start, end]
	next    int
}

// begin marks a trusted command starting; end (with begin's time) marks
// it done.
func (w *trustedWindows) begin() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running == 0 {
		w.since = time.Now()
	}
	w.running++
}

func (w *trustedWindows) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running--; w.running == 0 {
		w.past[w.next] = [2]time.Time{w.since, time.Now()}
		w.next = (w.next + 1) % len(w.past)
	}
}

// covers reports whether a trusted command ran at t.
func (w *trustedWindows) covers(t time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running > 0 && !t.Before(w.since) {
		return true
	}
	for _, p := range w.past {
		if !p[0].IsZero() && !t.Before(p[0]) && !t.After(p[1]) {
			return true
		}
	}
	return false
}

func (e *Edge) deliverAudit(r telemetry.Record) {
	if r.Kind == telemetry.KindFile && strings.HasPrefix(r.Path, sessionPlumbing) {
		return
	}
	e.audit.mu.Lock()
	a, ok := e.audit.by[r.Cookie]
	e.audit.mu.Unlock()
	if !ok {
		return // its sandbox stopped meanwhile
	}
	if r.Beside && a.sb.trusted.covers(r.Time) {
		return // a trusted command's own work
	}
	uid := r.UID
	if a.idBase != 0 && uid >= int(a.idBase) && uid < int(a.idBase)+sandboxIDs {
		uid -= int(a.idBase) // as the sandbox's user namespace numbers it
	}
	e.addAudit(a.sb, api.AuditRecord{
		Time: r.Time, Step: r.Step, Kind: r.Kind, Pid: r.Pid, Ppid: r.Ppid, UID: uid, HostUID: r.UID,
		Path: r.Path, Argv: r.Argv, ArgvTruncated: r.ArgvTruncated,
		Syscall: r.Syscall, Signal: r.Signal, Target: r.Target, Outcome: r.Outcome, Op: r.Op, To: r.To,
		Dest: r.Dest,
	})
}

// auditStart registers the cgroups of sb's container (handle h) with the
// node's telemetry.
func (e *Edge) auditStart(sb *sandbox, h runtime.Handle) {
	if e.audit.tel == nil || sb.stateless || auditOff(sb) {
		// FnCall workers: nobody can read their audit, and their tasks
		// would fill a ring each (up to ~5 MiB of argv).
		return
	}
	dirs := e.cfg.Runtime.(runtime.CgroupLister).UnifiedCgroups(h)
	if len(dirs) == 0 {
		return
	}
	e.audit.mu.Lock()
	defer e.audit.mu.Unlock()
	if sb.cookie != 0 {
		e.audit.tel.Remove(sb.cookie)
		delete(e.audit.by, sb.cookie)
	}
	e.audit.next++
	cookie := e.audit.next
	// UnifiedCgroups lists children first: the last is the agent's.
	last := len(dirs) - 1
	if err := e.audit.tel.AddSandbox(cookie, dirs[last], dirs[:last]...); err != nil {
		e.log.Warn("edge: register a sandbox with telemetry", "sandbox", h.ID, "err", err)
		sb.cookie = 0
		return
	}
	sb.cookie = cookie
	e.audit.by[cookie] = audited{sb: sb, idBase: h.IDBase}
	sb.mu.Lock()
	layers := sb.rec.Spec.Layers
	sb.mu.Unlock()
	for _, l := range layers {
		if l.Protected && l.Mount != "" {
			// Opens for reading under it are recorded too (the first
			// protected mount only: the programs keep one per sandbox).
			if err := e.audit.tel.Protect(cookie, path.Clean(l.Mount)); err != nil {
				e.log.Warn("edge: audit reads of a protected layer", "sandbox", h.ID, "err", err)
			}
			break
		}
	}
}

// auditStop unregisters sb's cgroups (its container stops or serves
// another sandbox).
func (e *Edge) auditStop(sb *sandbox) {
	if e.audit.tel == nil {
		return
	}
	e.audit.mu.Lock()
	defer e.audit.mu.Unlock()
	if sb.cookie == 0 {
		return
	}
	cookie := sb.cookie
	e.audit.tel.Remove(cookie)
	sb.cookie = 0
	// What the kernel recorded before the removal may still be in the
	// ring: it reaches sb until the reader drained it.
	time.AfterFunc(4*telemetry.DrainEvery, func() {
		e.audit.mu.Lock()
		delete(e.audit.by, cookie)
		e.audit.mu.Unlock()
	})
}

// auditStep stamps what sb's processes do from now on with step (0 =
// between steps).
func (e *Edge) auditStep(sb *sandbox, step int64) {
	sb.auditStepNow.Store(step)
	if e.audit.tel == nil {
		return
	}
	e.audit.mu.Lock()
	defer e.audit.mu.Unlock()
	if sb.cookie != 0 {
		e.audit.tel.SetStep(sb.cookie, step)
	}
}

// auditOf answers OpAudit.
func (e *Edge) auditOf(req *AuditRequest) (*api.AuditList, error) {
	sb, err := e.lookup(req.ID)
	if err != nil {
		return nil, err
	}
	switch req.Kind {
	default:
		if !slices.Contains(api.AuditKinds, req.Kind) {
			return nil, invalidf("kind %q is not one of: %s", truncateKind(req.Kind), strings.Join(api.AuditKinds, ", "))
		}
	case "":
	}
	recs, dropped := sb.audit.list(req)
	sb.mu.Lock()
	live := !sb.stopping && (sb.rec.Sandbox.State == api.StateRunning || sb.rec.Sandbox.State == api.StatePaused || sb.rec.Sandbox.State == api.StateCreating)
	sb.mu.Unlock()
	out := &api.AuditList{Records: recs, Dropped: dropped, Telemetry: e.audit.tel != nil, Live: live}
	if req.Summary {
		out.Records, out.Summary = []api.AuditRecord{}, edgeproto.SummarizeAudit(recs)
	}
	return out, nil
}

func truncateKind(s string) string {
	if len(s) > 32 {
		return fmt.Sprintf("%s…", s[:32])
	}
	return s
}
