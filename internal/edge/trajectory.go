package edge

// Lock order: trajectory.Traj.mu first (held over a whole logged
// operation, which may snapshot, branch or stop), then what edge.go lists
// after it.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edge/trajectory"
)

// Trajectories are internal/edge/trajectory's (its package comment). The
// core builds each recorded operation (execRecorded, fileRecorded, and
// setNetwork in network.go) as a recOp and hands it to e.trajs.Record
// (recorded), and answers the calls that need its sandboxes (resume,
// advance, replay.go) through trajSandbox and trajHost.

// recOp is one state-changing operation of a trajectory sandbox, as the
// core builds it: trajectory.Op (which says what each field is).
type recOp struct {
	step     *api.TrajectoryStep
	run      func() (any, error)
	record   func(st *api.TrajectoryStep, out any)
	replay   func(st *api.TrajectoryStep) (any, error)
	redo     func(ctx context.Context, id string) error
	retarget func(id string)
	size     int
	input    []byte
}

// recorded runs ro on trajectory sandbox sb (trajectory.Recorder.Record).
func (e *Edge) recorded(ctx context.Context, sb *sandbox, ro *recOp) (any, error) {
	return e.trajs.Record(ctx, e.trajSandbox(sb), &trajectory.Op{
		Step: ro.step, Run: ro.run, Record: ro.record, Replay: ro.replay,
		Redo: ro.redo, Retarget: ro.retarget, Size: ro.size, Input: ro.input,
	})
}

// resumeTrajectory starts fast-forwarding a trajectory on its live sandbox.
func (e *Edge) resumeTrajectory(ctx context.Context, req *ResumeRequest) (*api.Sandbox, error) {
	sb, _, release, err := e.acquire(req.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	last, steps, err := e.trajs.Resume(ctx, e.trajSandbox(sb), req.Trajectory, req.Branch, req.Delegate)
	if err != nil {
		return nil, err
	}
	v := sb.view()
	v.Step, v.Replay = last, steps
	return &v, nil
}

// advanceTrajectory ends a delegated fast-forward at the delegate's cursor.
func (e *Edge) advanceTrajectory(req *AdvanceRequest) (*StepResult, error) {
	sb, err := e.lookup(req.ID)
	if err != nil {
		return nil, err
	}
	<-sb.ready
	if err := e.trajs.Advance(e.trajSandbox(sb), req.Delegate, req.Cursor); err != nil {
		return nil, err
	}
	return &StepResult{}, nil
}

// trajSandbox is sb as the trajectories see it.
type trajSandbox struct {
	*sandbox
	e *Edge
}

var _ trajectory.Sandbox = trajSandbox{}

func (e *Edge) trajSandbox(sb *sandbox) trajSandbox { return trajSandbox{sandbox: sb, e: e} }

func (s trajSandbox) Traj() *trajectory.Traj { return s.traj }
func (s trajSandbox) AuditStep(step int64)   { s.e.audit.Step(&s.audit, step) }

func (s trajSandbox) Spec() api.CreateSandboxRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec.Spec
}

// Prepare resumes a paused sandbox (the resume is no step of the
// trajectory: nothing in the sandbox changes) and refuses one that does
// not run.
func (s trajSandbox) Prepare(ctx context.Context) error {
	s.mu.Lock()
	paused := s.rec.Sandbox.State == api.StatePaused && !s.stopping
	s.mu.Unlock()
	if paused {
		if err := s.e.pauser.Resume(ctx, s.e.pausable(s.sandbox), true); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rec.Sandbox.State != api.StateRunning || s.stopping {
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s is %s", s.rec.Sandbox.ID, stateWord(s.sandbox))}
	}
	return nil
}

// trajHost is the core as the trajectories see it.
type trajHost struct{ e *Edge }

var _ trajectory.Host = trajHost{}

func (h trajHost) Logger() *slog.Logger { return h.e.log }
func (h trajHost) NewID() string        { return h.e.newID() }
func (h trajHost) CheckStorage(ctx context.Context, project string, n int64) error {
	return h.e.checkStorage(ctx, project, n)
}
func (h trajHost) Charge(ctx context.Context, project, key string, n int64) {
	h.e.chargeTrajectory(ctx, project, key, n)
}
func (h trajHost) SaveAudit(sb trajectory.Sandbox, key string, step int64) {
	h.e.audit.Save(auditSandbox{sb.(trajSandbox).sandbox}, key, step)
}
func (h trajHost) Checkpoint(ctx context.Context, sb trajectory.Sandbox, step int64) (string, error) {
	snap, err := h.e.snapshot(ctx, sb.(trajSandbox).sandbox, "checkpoint", step)
	if err != nil {
		return "", err
	}
	return snap.ID, nil
}
func (h trajHost) Create(ctx context.Context, id string, spec api.CreateSandboxRequest) (trajectory.Sandbox, error) {
	if _, err := h.e.create(ctx, &CreateRequest{ID: id, Spec: spec}); err != nil {
		return nil, err
	}
	sb, err := h.e.lookup(id)
	if err != nil {
		return nil, err
	}
	return h.e.trajSandbox(sb), nil
}
func (h trajHost) Fail(ctx context.Context, sb trajectory.Sandbox, reason string) {
	h.e.stop(ctx, sb.(trajSandbox).sandbox, api.StateFailed, reason)
}

// execRecorded is exec for every sandbox: recorded when it has a trajectory.
func (e *Edge) execRecorded(ctx context.Context, req *ExecRequest, w *bus.Replier) (any, error) {
	sb, err := e.lookup(req.ID)
	if err != nil {
		return nil, err
	}
	<-sb.ready
	if sb.traj == nil {
		return e.exec(ctx, req, w.Chunk)
	}
	x := req.Exec
	op := &api.TrajectoryStep{Op: "exec", Exec: &x}
	if x.Stdin != "" {
		op.StdinHash = trajectory.Digest([]byte(x.Stdin))
		op.Exec.Stdin = ""
	}
	var stdout, stderr bytes.Buffer
	capture := func(stream string, data []byte) error {
		buf := &stdout
		if stream == "stderr" {
			buf = &stderr
		}
		if n := trajectory.MaxLoggedOutput - buf.Len(); n > 0 {
			buf.Write(data[:min(n, len(data))])
		}
		return w.Chunk(stream, data)
	}
	return e.recorded(ctx, sb, &recOp{
		step: op,
		run:  func() (any, error) { return e.exec(ctx, req, capture) },
		record: func(st *api.TrajectoryStep, out any) {
			r := *out.(*api.ExecResult)
			r.Stdout, r.Stderr = stdout.String(), stderr.String()
			r.Truncated = r.Truncated || stdout.Len() >= trajectory.MaxLoggedOutput || stderr.Len() >= trajectory.MaxLoggedOutput
			st.Result = &r
		},
		replay: func(st *api.TrajectoryStep) (any, error) {
			r := *st.Result
			if r.Stdout != "" {
				if err := w.Chunk("stdout", []byte(r.Stdout)); err != nil {
					return nil, err
				}
			}
			if r.Stderr != "" {
				if err := w.Chunk("stderr", []byte(r.Stderr)); err != nil {
					return nil, err
				}
			}
			r.Stdout, r.Stderr = "", ""
			return &r, nil
		},
		redo: func(ctx context.Context, id string) error {
			_, err := e.exec(ctx, &ExecRequest{ID: id, Exec: req.Exec}, func(string, []byte) error { return nil })
			if err != nil && !trajectory.UnknownOutcome(err) {
				return nil // refused the first time too: the log has what happened
			}
			return err
		},
		retarget: func(id string) { req.ID = id },
		size:     len(req.Exec.Stdin) + len(req.Exec.Cmd) + 256,
		input:    []byte(req.Exec.Stdin),
	})
}

// fileOps maps the recorded file operations to their log names.
var fileOps = map[string]string{OpFileWrite: "write", OpFileRemove: "remove", OpFileRename: "rename", OpFileMkdir: "mkdir"}

// fileRecorded is file for every sandbox: state-changing operations of a
// trajectory sandbox are recorded.
func (e *Edge) fileRecorded(ctx context.Context, op string, req *FileRequest, w *bus.Replier) (any, error) {
	sb, err := e.lookup(req.ID)
	if err != nil {
		return nil, err
	}
	<-sb.ready
	name, changes := fileOps[op]
	if sb.traj == nil || (!changes && op != OpTarPut) {
		return e.file(ctx, op, req, w)
	}
	if op == OpTarPut {
		return nil, &api.Error{Code: api.CodeConflict, Message: "archive uploads are not recorded in a trajectory; upload files one by one"}
	}
	st := &api.TrajectoryStep{Op: name, Path: req.Path, To: req.To, Mode: req.Mode, Recursive: req.Recursive, Parents: req.Parents, Append: req.Append}
	if op == OpFileWrite {
		st.DataHash, st.DataSize = trajectory.Digest(req.Data), int64(len(req.Data))
	}
	return e.recorded(ctx, sb, &recOp{
		step: st,
		run: func() (any, error) {
			out, err := e.file(ctx, op, req, w)
			if err == nil && out == nil {
				out = &StepResult{}
			}
			return out, err
		},
		record: func(st *api.TrajectoryStep, out any) {
			if fi, ok := out.(*api.FileInfo); ok {
				c := *fi
				c.Step, c.Replayed, c.Sandbox, c.Trajectory = 0, false, "", ""
				st.File = &c
			}
		},
		replay: func(st *api.TrajectoryStep) (any, error) {
			if st.File != nil {
				c := *st.File
				return &c, nil
			}
			return &StepResult{}, nil
		},
		redo: func(ctx context.Context, id string) error {
			c := *req
			c.ID = id
			_, err := e.file(ctx, op, &c, nil)
			if err != nil && !trajectory.UnknownOutcome(err) {
				return nil // it failed the first time too, or differs: the log has what happened
			}
			return err
		},
		retarget: func(id string) { req.ID = id },
		size:     len(req.Data) + 256,
		input:    req.Data,
	})
}
