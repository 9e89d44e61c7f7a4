package audit

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/telemetry"
)

// saveDelay: a step's last records reach the ring a few drain rounds
// after it ended.
const saveDelay = 4 * telemetry.DrainEvery

// fromKernel is r as the audit records it; idBase is the host id the
// sandbox's user namespace maps its root to (0: host root).
func fromKernel(r *telemetry.Record, idBase uint32) api.AuditRecord {
	uid := r.UID
	if idBase != 0 && uid >= int(idBase) && uid < int(idBase)+sandboxIDs {
		uid -= int(idBase) // as the sandbox's user namespace numbers it
	}
	return api.AuditRecord{
		Time: r.Time, Step: r.Step, Kind: r.Kind, Pid: r.Pid, Ppid: r.Ppid, UID: uid, HostUID: r.UID,
		Path: r.Path, Argv: r.Argv, ArgvTruncated: r.ArgvTruncated,
		Syscall: r.Syscall, Signal: r.Signal, Target: r.Target, Outcome: r.Outcome, Op: r.Op, To: r.To,
		Dest: r.Dest,
	}
}

// Add files r in sb's audit, after the create's workspace filter, and
// applies the create's policy hooks to it: kill-step cancels the
// operations running now (State.Enter), fail-sandbox those and the
// sandbox (Host.Fail).
func (n *Node) Add(sb Sandbox, r api.AuditRecord) {
	st := sb.Audit()
	p := st.policy.Load()
	if p.Off() {
		return
	}
	if p.Empty() {
		st.ring.Add(r)
		return
	}
	if p.Skip(&r) {
		return
	}
	on, do := p.Match(&r)
	r.Rule, r.Action = on, do
	st.ring.Add(r)
	switch do {
	case api.AuditDoKillStep:
		k := st.steps.cancelAll()
		n.log.Info("audit policy: step killed", "sandbox", sb.ID(), "rule", on, "operations", k)
	case api.AuditDoFailSandbox:
		st.steps.cancelAll()
		n.log.Warn("audit policy: sandbox failed", "sandbox", sb.ID(), "rule", on)
		n.host.Fail(sb, "audit policy: "+on)
	}
}

// Limit records that a command of sb hit limit op (kind limit:
// api.AuditLimitOOM, Pids, Disk or Output).
func (n *Node) Limit(sb Sandbox, op string) {
	n.Add(sb, api.AuditRecord{Time: time.Now(), Step: sb.Audit().stepNow.Load(), Kind: api.AuditKindLimit, Op: op})
}

// Limits records the limits a finished command of sb hit.
func (n *Node) Limits(sb Sandbox, r *api.ExecResult) {
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
		n.Limit(sb, op)
	}
}

// Denied records what sb's network refused (kind denied).
func (n *Node) Denied(sb Sandbox, recs ...api.NetworkDenialRecord) {
	for _, r := range recs {
		n.Add(sb, api.AuditRecord{Time: r.Time, Step: sb.Audit().stepNow.Load(), Kind: api.AuditKindDenied,
			Dest: r.Destination, Op: r.Protocol, Reason: r.Reason, Count: r.Count})
	}
}

// List answers a read of sb's audit (OpAudit).
func (n *Node) List(sb Sandbox, req *edgeproto.AuditRequest) (*api.AuditList, error) {
	if req.Kind != "" && !slices.Contains(api.AuditKinds, req.Kind) {
		return nil, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("kind %q is not one of: %s",
			truncateKind(req.Kind), strings.Join(api.AuditKinds, ", "))}
	}
	recs, dropped := sb.Audit().ring.List(req)
	out := &api.AuditList{Records: recs, Dropped: dropped, Telemetry: n.Telemetry(), Live: sb.Live()}
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

// Save persists, a moment after step ended, the step's records of sb (and
// those between steps) with trajectory key's log, so that they outlive
// the sandbox (GET /v1/trajectories/{name}?audit=1).
func (n *Node) Save(sb Sandbox, key string, step int64) {
	if n.tel == nil && sb.Audit().policy.Load().Empty() {
		return // nothing records anything but limits: kept live only
	}
	n.host.After(saveDelay, func() { n.save(sb, key, step) })
}

// save is Save once the step's records are in.
func (n *Node) save(sb Sandbox, key string, step int64) {
	st := sb.Audit()
	st.saveMu.Lock()
	defer st.saveMu.Unlock()
	recs, last, over := st.ring.Unsaved(st.saved, step, edgeproto.MaxSavedAudit)
	st.saved = last
	if len(recs) == 0 {
		return
	}
	b, err := json.Marshal(&edgeproto.AuditEntry{Step: step, Records: recs, Dropped: over})
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.host.AppendAudit(ctx, key, b); err != nil {
		n.log.Warn("edge: persist a step's audit", "trajectory", key, "step", step, "err", err)
		return
	}
	n.host.Charge(ctx, sb.Project(), key, int64(len(b)))
}
