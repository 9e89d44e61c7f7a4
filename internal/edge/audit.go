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
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
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
	uid := r.UID
	if a.idBase != 0 && uid >= int(a.idBase) && uid < int(a.idBase)+sandboxIDs {
		uid -= int(a.idBase) // as the sandbox's user namespace numbers it
	}
	a.sb.audit.add(api.AuditRecord{
		Time: r.Time, Step: r.Step, Kind: r.Kind, Pid: r.Pid, Ppid: r.Ppid, UID: uid, HostUID: r.UID,
		Path: r.Path, Argv: r.Argv, ArgvTruncated: r.ArgvTruncated,
		Syscall: r.Syscall, Signal: r.Signal, Target: r.Target, Outcome: r.Outcome, Op: r.Op, To: r.To,
	})
}

// auditStart registers the cgroups of sb's container (handle h) with the
// node's telemetry.
func (e *Edge) auditStart(sb *sandbox, h runtime.Handle) {
	if e.audit.tel == nil || sb.stateless {
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
	case "", api.AuditKindExec, api.AuditKindRefused, api.AuditKindSignal, api.AuditKindFile:
	default:
		return nil, invalidf("kind %q is not one of: %s, %s, %s, %s", truncateKind(req.Kind), api.AuditKindExec, api.AuditKindRefused, api.AuditKindSignal, api.AuditKindFile)
	}
	recs, dropped := sb.audit.list(req)
	sb.mu.Lock()
	live := !sb.stopping && (sb.rec.Sandbox.State == api.StateRunning || sb.rec.Sandbox.State == api.StatePaused || sb.rec.Sandbox.State == api.StateCreating)
	sb.mu.Unlock()
	out := &api.AuditList{Records: recs, Dropped: dropped, Telemetry: e.audit.tel != nil, Live: live}
	if req.Summary {
		out.Records, out.Summary = []api.AuditRecord{}, summarize(recs)
	}
	return out, nil
}

// summarize counts records (in step order) per step and kind.
func summarize(recs []api.AuditRecord) []api.AuditStepSummary {
	at := map[int64]int{}
	out := []api.AuditStepSummary{}
	for _, r := range recs {
		i, ok := at[r.Step]
		if !ok {
			i = len(out)
			at[r.Step] = i
			out = append(out, api.AuditStepSummary{Step: r.Step, Counts: map[string]int64{}})
		}
		out[i].Counts[r.Kind]++
	}
	slices.SortFunc(out, func(a, b api.AuditStepSummary) int { return cmp.Compare(a.Step, b.Step) })
	return out
}

func truncateKind(s string) string {
	if len(s) > 32 {
		return fmt.Sprintf("%s…", s[:32])
	}
	return s
}
