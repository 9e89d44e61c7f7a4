package trajectory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// Record runs one state-changing operation of a trajectory sandbox:
// replayed from the log while a resuming client re-issues logged
// operations, otherwise run live and appended to the log in order.
func (r *Recorder) Record(ctx context.Context, sb Sandbox, op *Op) (any, error) {
	t := sb.Traj()
	t.mu.Lock()
	defer t.mu.Unlock()
	return r.record(ctx, sb, t, op)
}

// record is Record with t.mu held.
func (r *Recorder) record(ctx context.Context, sb Sandbox, t *Traj, op *Op) (any, error) {
	if err := r.load(ctx, t); err != nil {
		return nil, err
	}
	if t.delegate != "" {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf(
			"trajectory %q is being fast-forwarded through another API server replica; resume again", t.name)}
	}
	if t.cursor < len(t.replay) {
		return r.fastForward(ctx, sb, t, op)
	}
	return r.live(ctx, sb, t, op)
}

// fastForward answers an operation a resuming client re-issues: from the
// log, or run again on a rebuilt sandbox; one that diverges from the log
// is refused or (branch) branches. t.mu held.
func (r *Recorder) fastForward(ctx context.Context, sb Sandbox, t *Traj, op *Op) (any, error) {
	logged := &t.replay[t.cursor]
	if !edgeproto.SameOp(logged, op.Step) {
		if t.branch {
			return r.branchAt(ctx, sb, t, op)
		}
		return nil, &api.Error{Code: api.CodeConflict,
			Message: fmt.Sprintf("operation diverges from trajectory %q at step %d", t.name, logged.Step),
			Diverge: &api.Divergence{Step: logged.Step, Logged: OpOnly(*logged), Received: *op.Step}}
	}
	t.resumeAt = time.Now()
	if t.cursor >= t.reexec {
		// Rebuilt sandbox: run it again; the log has it already.
		sb.AuditStep(logged.Step)
		out, err := op.Run()
		sb.AuditStep(0)
		if err != nil && UnknownOutcome(err) {
			return nil, err // perhaps not done: the client may retry it
		}
		t.cursor++
		t.reexec = t.cursor
		t.passed(logged, op)
		if err != nil {
			return nil, err
		}
		Mark(out, logged.Step, false, "", "")
		return out, nil
	}
	t.cursor++
	t.passed(logged, op)
	if logged.Error != nil {
		ae := *logged.Error
		return nil, &ae
	}
	out, err := op.Replay(logged)
	if err != nil {
		return nil, err
	}
	Mark(out, logged.Step, true, "", "")
	return out, nil
}

// live runs an operation past the end of the log and appends it as the
// next step (with a checkpoint every t.every steps). t.mu held.
func (r *Recorder) live(ctx context.Context, sb Sandbox, t *Traj, op *Op) (any, error) {
	if err := sb.Prepare(ctx); err != nil {
		return nil, err // nothing can happen in it: refused without a step
	}
	project := sb.Spec().Project
	// The log and the inputs count against the project's storage quota:
	// refused (413) before it runs, without a step, once they would
	// exceed it.
	if err := r.host.CheckStorage(ctx, project, int64(len(op.Input))); err != nil {
		return nil, err
	}
	st := op.Step
	st.Step = t.last + 1
	st.Sandbox = sb.ID()
	st.At = time.Now().UTC()
	sb.AuditStep(st.Step)
	out, err := op.Run()
	sb.AuditStep(0)
	if err != nil {
		var ae *api.Error
		if UnknownOutcome(err) || !errors.As(err, &ae) || ae.Code == api.CodeInvalid {
			// Whether it happened is unknown, or it was refused before it
			// reached the sandbox: nothing is logged.
			return nil, err
		}
		st.Error = &api.Error{Code: ae.Code, Message: ae.Message}
	} else {
		op.Record(st, out)
	}
	if t.every > 0 && st.Step%int64(t.every) == 0 && st.Error == nil {
		if snap, serr := r.host.Checkpoint(ctx, sb, st.Step); serr != nil {
			r.host.Logger().Warn("checkpoint snapshot", "sandbox", st.Sandbox, "step", st.Step, "err", serr)
		} else {
			st.Checkpoint = snap
		}
	}
	r.keepInput(ctx, t, project, op)
	if aerr := r.appendStep(ctx, sb, t, project, st); aerr != nil {
		return nil, aerr
	}
	if err != nil {
		return nil, err
	}
	Mark(out, st.Step, false, "", "")
	return out, nil
}

// keepInput stores what re-execution (replay) needs besides the log: a
// step whose input is missing is reported as not replayable.
func (r *Recorder) keepInput(ctx context.Context, t *Traj, project string, op *Op) {
	if len(op.Input) == 0 {
		return
	}
	stored, err := r.inputs.Put(ctx, bus.InputKey(t.key, Digest(op.Input)), op.Input)
	if err != nil {
		r.host.Logger().Warn("store a logged operation's input", "trajectory", t.name, "step", op.Step.Step, "err", err)
	} else if stored {
		r.host.Charge(ctx, project, t.key, int64(len(op.Input)))
	}
}

// appendStep appends st to t's log, charges it, keeps its audit records
// and names its checkpoint in the trajectory's record. t.mu held.
func (r *Recorder) appendStep(ctx context.Context, sb Sandbox, t *Traj, project string, st *api.TrajectoryStep) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if aerr := r.log.Append(ctx, t.key, st.Step, b); aerr != nil {
		// The operation ran but is not in the log: say so, and do not
		// hand out this step again.
		t.last = st.Step
		return &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("the operation ran but the trajectory log could not record step %d: %v", st.Step, aerr)}
	}
	t.last = st.Step
	r.host.Charge(ctx, project, t.key, int64(len(b)))
	r.host.SaveAudit(sb, t.key, st.Step)
	if st.Checkpoint != "" {
		// Only while the record still names this sandbox, and only over
		// the revision read (a resume may rebuild it elsewhere meanwhile).
		var rec edgeproto.TrajectoryRecord
		if found, rev, gerr := r.meta.Get(ctx, t.key, &rec); gerr == nil && found && rec.Sandbox == st.Sandbox {
			rec.CheckpointSnap, rec.CheckpointStep = st.Checkpoint, st.Step
			if perr := r.meta.Update(ctx, t.key, &rec, rev); perr != nil {
				r.host.Logger().Warn("record checkpoint", "trajectory", t.name, "err", perr)
			}
		}
	}
	return nil
}

// maxBranches bounds the names tried for a branch (T~k, T~k.2, …).
const maxBranches = 100

// branchAt forks a new trajectory where a resuming client that asked
// branch: true diverged (t.mu held): it shares the log up to the last
// matching step and continues on a new sandbox holding the state after
// that step (the last checkpoint the client passed, then the operations
// re-issued since, run again). The diverging operation runs there. The
// original trajectory and its sandbox are left as they were.
func (r *Recorder) branchAt(ctx context.Context, sb Sandbox, t *Traj, op *Op) (any, error) {
	k := t.replay[t.cursor].Step
	if t.redoOver {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf(
			"cannot branch trajectory %q at step %d: more than %d MiB of operations since its last checkpoint (record it with checkpoints)", t.name, k, maxRedoBytes>>20)}
	}
	var rec edgeproto.TrajectoryRecord
	found, _, err := r.meta.Get(ctx, t.key, &rec)
	if err != nil {
		return nil, &api.Error{Code: api.CodeUnavailable, Message: err.Error()}
	}
	if !found {
		return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("trajectory %q not found", t.name)}
	}
	spec, base := sb.Spec(), rec.Spec
	spec.Image, spec.Layers, spec.Snapshot = base.Image, base.Layers, base.Snapshot
	if t.branchSnap != "" {
		spec.Image, spec.Layers, spec.Snapshot = "", nil, t.branchSnap
	}
	spec.Resume, spec.Branch = false, false
	base.Resume, base.Branch = false, false

	id := r.host.NewID()
	name, err := r.newBranch(ctx, t, k, &base, id)
	if err != nil {
		return nil, err
	}
	spec.Trajectory = name
	nsb, err := r.buildBranch(ctx, t, k, &base, spec, id)
	if err != nil {
		return nil, err
	}
	r.host.Logger().Info("trajectory branched", "trajectory", t.name, "branch", name, "step", k, "sandbox", id, "checkpoint", t.branchSnap, "rerun", len(t.redo))
	// The original goes on as it was: live, or (a rebuilt sandbox that has
	// not re-run every step) waiting for a new resume.
	if t.reexec >= len(t.replay) {
		t.replay, t.reexec = nil, 0
	}
	t.cursor, t.resumeAt, t.branch, t.redo, t.redoBytes = 0, time.Time{}, false, nil, 0
	op.Retarget(id)
	out, err := r.Record(ctx, nsb, op)
	if err != nil {
		why := fmt.Sprintf("trajectory branched to %q on sandbox %s, but its first operation failed: ", name, id)
		var ae *api.Error
		if errors.As(err, &ae) {
			c := *ae
			c.Message = why + c.Message
			return nil, &c
		}
		return nil, fmt.Errorf("%s%w", why, err)
	}
	Mark(out, op.Step.Step, false, id, name)
	return out, nil
}

// newBranch records a new trajectory branching from t after step k-1, on
// sandbox id, under the first free name of t~k, t~k.2, ...; base (the
// original's create request) takes its name.
func (r *Recorder) newBranch(ctx context.Context, t *Traj, k int64, base *api.CreateSandboxRequest, id string) (string, error) {
	for i := 1; ; i++ {
		name := fmt.Sprintf("%s~%d", t.name, k)
		if i > 1 {
			name += fmt.Sprintf(".%d", i)
		}
		if !sandboxspec.ValidTrajectory(name) {
			return "", &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("cannot branch trajectory %q: the name %q is too long", t.name, name)}
		}
		base.Trajectory = name
		nrec := edgeproto.TrajectoryRecord{Name: name, Project: base.Project, Sandbox: id, Spec: *base, CheckpointSnap: t.branchSnap, CheckpointStep: t.branchStep,
			Parent: t.name, ParentStep: k - 1, CreatedAt: time.Now().UTC()}
		nrec.ExpiresAt = ExpiresAt(nrec.CreatedAt, base.TrajectoryTTL)
		err := r.meta.Create(ctx, edgeproto.TrajKey(base.Project, name), &nrec)
		if err == nil {
			return name, nil
		}
		if !errors.Is(err, bus.ErrExists) || i == maxBranches {
			return "", &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("cannot branch trajectory %q: %v", t.name, err)}
		}
	}
}

// buildBranch gives the branch base.Trajectory the log of t before step k
// and a new sandbox id of spec holding the state after step k-1; on an
// error it removes the branch's record and log again. t.mu held.
func (r *Recorder) buildBranch(ctx context.Context, t *Traj, k int64, base *api.CreateSandboxRequest, spec api.CreateSandboxRequest, id string) (Sandbox, error) {
	key := edgeproto.TrajKey(base.Project, base.Trajectory)
	undo := func(why error) error {
		dctx := context.WithoutCancel(ctx)
		_ = r.log.Purge(dctx, key)
		_ = r.meta.Delete(dctx, key)
		return why
	}
	// The shared part of the log.
	shared := make([][]byte, t.cursor)
	var sharedBytes int64
	for i := range shared {
		var err error
		if shared[i], err = json.Marshal(&t.replay[i]); err != nil {
			return nil, undo(err)
		}
		sharedBytes += int64(len(shared[i]))
	}
	if err := r.log.AppendAll(ctx, key, shared); err != nil {
		return nil, undo(&api.Error{Code: api.CodeUnavailable, Message: err.Error()})
	}
	r.host.Charge(ctx, base.Project, key, sharedBytes)
	nsb, err := r.host.Create(ctx, id, spec)
	if err != nil {
		return nil, undo(err)
	}
	for _, redo := range t.redo {
		if err = redo(ctx, id); err != nil {
			r.host.Fail(context.WithoutCancel(ctx), nsb, "branch: "+err.Error())
			return nil, undo(fmt.Errorf("branch %q: rebuilding the state after step %d: %w", base.Trajectory, k-1, err))
		}
	}
	return nsb, nil
}
