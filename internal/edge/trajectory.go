package edge

// Lock order: traj.mu first (held over a whole logged operation, which
// may snapshot, branch or stop), then what edge.go lists after it.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// MaxLoggedOutput bounds the stdout and stderr kept per step in the log.
const MaxLoggedOutput = 1 << 20

// resumeLease is how long a resuming client that stopped re-issuing
// operations keeps other resumers out.
const resumeLease = 30 * time.Second

// expiresAt is when a trajectory made at t with ttl seconds expires.
func expiresAt(t time.Time, ttl int) time.Time {
	if ttl <= 0 {
		return time.Time{}
	}
	return t.Add(time.Duration(ttl) * time.Second)
}

// traj is the trajectory state of one sandbox. mu serializes the
// sandbox's state-changing operations so the log is totally ordered.
type traj struct {
	mu   sync.Mutex
	name string
	key  string // TrajKey(project, name): of the record and the log
	// keyChecked: resolveKey looked for a record of before owners.
	keyChecked bool
	every      int
	loaded     bool
	last       int64
	replay     []api.TrajectoryStep
	cursor     int
	// reexec: logged steps from this index on are run again (not served
	// from the log) because the sandbox was rebuilt from an earlier state.
	reexec   int
	resumeAt time.Time
	// delegate: the API server replica fast-forwarding the client (see
	// ResumeRequest.Delegate), or "".
	delegate string
	// branch: the resuming client asked branch: true. redo holds the
	// operations it re-issued since the last checkpoint it passed
	// (branchSnap, taken after step branchStep), to rebuild that state on
	// a branch.
	branch     bool
	redo       []func(ctx context.Context, id string) error
	redoBytes  int
	redoOver   bool
	branchSnap string
	branchStep int64
}

// maxRedoBytes bounds the operations (their data and stdin) kept to build
// a branch: beyond it a divergence cannot branch (take checkpoints).
const maxRedoBytes = 256 << 20

// startReplay arms a trajectory for a client fast-forwarding through steps.
func (t *traj) startReplay(steps []api.TrajectoryStep, reexec int, branch bool) {
	t.replay, t.cursor, t.resumeAt, t.loaded, t.reexec, t.delegate = steps, 0, time.Now(), true, reexec, ""
	t.branch, t.redo, t.redoBytes, t.redoOver, t.branchSnap, t.branchStep = branch, nil, 0, false, "", 0
	t.last = 0
	if n := len(steps); n > 0 {
		t.last = steps[n-1].Step
	}
}

// passed notes that the client re-issued the logged step st (op redoes
// it on another sandbox), for a later branch.
func (t *traj) passed(st *api.TrajectoryStep, ro *recOp) {
	if !t.branch {
		return
	}
	if st.Checkpoint != "" {
		t.redo, t.redoBytes, t.redoOver, t.branchSnap, t.branchStep = nil, 0, false, st.Checkpoint, st.Step
		return
	}
	if t.redoOver {
		return
	}
	if t.redoBytes += ro.size; t.redoBytes > maxRedoBytes {
		t.redo, t.redoOver = nil, true
		return
	}
	t.redo = append(t.redo, ro.redo)
}

// recOp is one state-changing operation of a trajectory sandbox.
type recOp struct {
	step *api.TrajectoryStep
	// run runs it on the sandbox it addresses, streaming to the client;
	// record puts its result into the step; replay turns a logged step
	// back into an answer.
	run    func() (any, error)
	record func(st *api.TrajectoryStep, out any)
	replay func(st *api.TrajectoryStep) (any, error)
	// redo runs it again on sandbox id without answering anyone; retarget
	// makes run address sandbox id; size is what redo holds in memory.
	redo     func(ctx context.Context, id string) error
	retarget func(id string)
	size     int
	// input is the operation's data or stdin (kept by digest for replay).
	input []byte
}

// mark sets the trajectory fields of an answer.
func mark(out any, step int64, replayed bool, sandbox, trajectory string) {
	switch o := out.(type) {
	case *api.ExecResult:
		o.Step, o.Replayed = step, replayed
		if sandbox != "" {
			o.Sandbox, o.Trajectory = sandbox, trajectory
		}
	case *api.FileInfo:
		o.Step, o.Replayed = step, replayed
		if sandbox != "" {
			o.Sandbox, o.Trajectory = sandbox, trajectory
		}
	case *StepResult:
		o.Step, o.Replayed = step, replayed
		if sandbox != "" {
			o.Sandbox, o.Trajectory = sandbox, trajectory
		}
	}
}

func newTraj(spec *api.CreateSandboxRequest) *traj {
	if spec.Trajectory == "" {
		return nil
	}
	return &traj{name: spec.Trajectory, key: TrajKey(spec.Project, spec.Trajectory), every: sandboxspec.CheckpointEvery(spec.Checkpoint)}
}

// resolveKey finds where a trajectory recorded before trajectories had
// owners keeps its record and log: under its bare name, its project only
// in its spec. Once per sandbox, with t.mu held (or before it serves).
func (e *Edge) resolveKey(ctx context.Context, t *traj) {
	if t.keyChecked || t.key == t.name {
		return
	}
	var rec TrajectoryRecord
	found, _, err := e.trajMeta.Get(ctx, t.key, &rec)
	if err != nil {
		return // try again with the next operation
	}
	t.keyChecked = true
	if found {
		return
	}
	project, _, _ := strings.Cut(t.key, "|")
	if found, _, err := e.trajMeta.Get(ctx, t.name, &rec); err == nil && found && rec.Project == "" && rec.Spec.Project == project {
		t.key = t.name
	}
}

func (e *Edge) loadTraj(ctx context.Context, t *traj) error {
	if t.loaded {
		return nil
	}
	e.resolveKey(ctx, t)
	b, err := e.tlog.Last(ctx, t.key)
	if err != nil {
		return &api.Error{Code: api.CodeUnavailable, Message: err.Error()}
	}
	if b != nil {
		var st api.TrajectoryStep
		if err := json.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("trajectory %s: corrupt entry: %w", t.name, err)
		}
		t.last = st.Step
	}
	t.loaded = true
	return nil
}

// readTrajectory returns every step of a log.
func (e *Edge) readTrajectory(ctx context.Context, name string) ([]api.TrajectoryStep, error) {
	raw, err := e.tlog.Read(ctx, name, 0, 0)
	if err != nil {
		return nil, &api.Error{Code: api.CodeUnavailable, Message: err.Error()}
	}
	out := make([]api.TrajectoryStep, 0, len(raw))
	for _, b := range raw {
		var st api.TrajectoryStep
		if err := json.Unmarshal(b, &st); err != nil {
			return nil, fmt.Errorf("trajectory %s: corrupt entry: %w", name, err)
		}
		if n := len(out); n > 0 && st.Step <= out[n-1].Step {
			continue // a duplicate of a retried append
		}
		out = append(out, st)
	}
	return out, nil
}

// registerTrajectory claims the trajectory name for a new sandbox.
func (e *Edge) registerTrajectory(ctx context.Context, id string, spec *api.CreateSandboxRequest) error {
	if spec.Trajectory == "" || spec.Resume {
		return nil
	}
	rec := TrajectoryRecord{Name: spec.Trajectory, Project: spec.Project, Sandbox: id, Spec: *spec, CreatedAt: time.Now().UTC()}
	rec.ExpiresAt = expiresAt(rec.CreatedAt, spec.TrajectoryTTL)
	key := TrajKey(spec.Project, spec.Trajectory)
	err := e.trajMeta.Create(ctx, key, &rec)
	if errors.Is(err, bus.ErrExists) {
		var old TrajectoryRecord
		if found, _, gerr := e.trajMeta.Get(ctx, key, &old); gerr == nil && found && old.Sandbox == id {
			return nil // a retried create
		}
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("trajectory %q exists; re-attach with resume: true", spec.Trajectory)}
	}
	return err
}

// resumeTrajectory starts fast-forwarding a trajectory on its live sandbox.
func (e *Edge) resumeTrajectory(ctx context.Context, req *ResumeRequest) (*api.Sandbox, error) {
	sb, _, release, err := e.acquire(req.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	t := sb.traj
	if t == nil || t.name != req.Trajectory {
		return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("sandbox %s does not record trajectory %q", req.ID, req.Trajectory)}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	e.resolveKey(ctx, t)
	if t.cursor < len(t.replay) && time.Since(t.resumeAt) < resumeLease {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("trajectory %q is being resumed by another client (at step %d of %d)", t.name, t.cursor, len(t.replay))}
	}
	steps, err := e.readTrajectory(ctx, t.key)
	if err != nil {
		return nil, err
	}
	// A rebuilt sandbox that has not re-run every logged step yet keeps
	// re-running from where it stopped.
	reexec := len(steps)
	if t.reexec < len(t.replay) && len(t.replay) == len(steps) {
		reexec = t.reexec
	}
	t.startReplay(steps, reexec, req.Branch)
	if req.Delegate != "" && !req.Branch && reexec == len(steps) && len(steps) > 0 {
		t.delegate = req.Delegate
	}
	v := sb.view()
	v.Step, v.Replay = t.last, int64(len(steps))
	return &v, nil
}

// advanceTrajectory ends a delegated fast-forward at the delegate's cursor.
func (e *Edge) advanceTrajectory(req *AdvanceRequest) (*StepResult, error) {
	sb, err := e.lookup(req.ID)
	if err != nil {
		return nil, err
	}
	<-sb.ready
	t := sb.traj
	if t == nil {
		return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("sandbox %s records no trajectory", req.ID)}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.delegate == "" || t.delegate != req.Delegate {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("trajectory %q was resumed by another client", t.name)}
	}
	if req.Cursor < t.cursor || req.Cursor > len(t.replay) {
		return nil, invalidf("cursor %d is outside the log (%d steps)", req.Cursor, len(t.replay))
	}
	t.cursor, t.delegate, t.resumeAt = req.Cursor, "", time.Now()
	if t.cursor == len(t.replay) {
		t.replay, t.cursor, t.reexec = nil, 0, 0
	}
	return &StepResult{}, nil
}

func digest(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// opOnly strips the results from a step (for the divergence answer).
func opOnly(s api.TrajectoryStep) api.TrajectoryStep {
	s.Result, s.File, s.Error, s.Checkpoint = nil, nil, nil, ""
	return s
}

// recorded runs one state-changing operation of a trajectory sandbox:
// replayed from the log while a resuming client re-issues logged
// operations, otherwise run live and appended to the log in order.
func (e *Edge) recorded(ctx context.Context, sb *sandbox, ro *recOp) (any, error) {
	op := ro.step
	t := sb.traj
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := e.loadTraj(ctx, t); err != nil {
		return nil, err
	}
	if t.delegate != "" {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf(
			"trajectory %q is being fast-forwarded through another API server replica; resume again", t.name)}
	}
	if t.cursor < len(t.replay) {
		logged := &t.replay[t.cursor]
		if !sameOp(logged, op) {
			if t.branch {
				return e.branchAt(ctx, sb, ro)
			}
			return nil, &api.Error{Code: api.CodeConflict,
				Message: fmt.Sprintf("operation diverges from trajectory %q at step %d", t.name, logged.Step),
				Diverge: &api.Divergence{Step: logged.Step, Logged: opOnly(*logged), Received: *op}}
		}
		t.resumeAt = time.Now()
		if t.cursor >= t.reexec {
			// Rebuilt sandbox: run it again; the log has it already.
			e.auditStep(sb, logged.Step)
			out, err := ro.run()
			e.auditStep(sb, 0)
			if err != nil && unknownOutcome(err) {
				return nil, err // perhaps not done: the client may retry it
			}
			t.cursor++
			t.reexec = t.cursor
			t.passed(logged, ro)
			if err != nil {
				return nil, err
			}
			mark(out, logged.Step, false, "", "")
			return out, nil
		}
		t.cursor++
		t.passed(logged, ro)
		if logged.Error != nil {
			ae := *logged.Error
			return nil, &ae
		}
		out, err := ro.replay(logged)
		if err != nil {
			return nil, err
		}
		mark(out, logged.Step, true, "", "")
		return out, nil
	}
	sb.mu.Lock()
	paused := sb.rec.Sandbox.State == api.StatePaused && !sb.stopping
	sb.mu.Unlock()
	if paused {
		// Any operation resumes a paused sandbox; the resume is no step
		// of the trajectory (nothing in the sandbox changes).
		if err := e.pauser.Resume(ctx, e.pausable(sb), true); err != nil {
			return nil, err
		}
	}
	sb.mu.Lock()
	running := sb.rec.Sandbox.State == api.StateRunning && !sb.stopping
	word := stateWord(sb)
	sb.mu.Unlock()
	if !running {
		// Nothing can happen in it: refuse without logging.
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s is %s", sb.rec.Sandbox.ID, word)}
	}
	sb.mu.Lock()
	project := sb.rec.Spec.Project
	sb.mu.Unlock()
	// The log and the inputs count against the project's storage quota:
	// refused (413) before it runs, without a step, once they would
	// exceed it.
	if err := e.checkStorage(ctx, project, int64(len(ro.input))); err != nil {
		return nil, err
	}
	op.Step = t.last + 1
	op.Sandbox = sb.rec.Sandbox.ID
	op.At = time.Now().UTC()
	e.auditStep(sb, op.Step)
	out, err := ro.run()
	e.auditStep(sb, 0)
	if err != nil {
		var ae *api.Error
		if unknownOutcome(err) || !errors.As(err, &ae) || ae.Code == api.CodeInvalid {
			// Whether it happened is unknown, or it was refused before it
			// reached the sandbox: nothing is logged.
			return nil, err
		}
		op.Error = &api.Error{Code: ae.Code, Message: ae.Message}
	} else {
		ro.record(op, out)
	}
	if t.every > 0 && op.Step%int64(t.every) == 0 && op.Error == nil {
		if snap, serr := e.snapshot(ctx, sb, "checkpoint", op.Step); serr != nil {
			e.log.Warn("checkpoint snapshot", "sandbox", op.Sandbox, "step", op.Step, "err", serr)
		} else {
			op.Checkpoint = snap.ID
		}
	}
	if len(ro.input) > 0 {
		// What re-execution (replay) needs besides the log: a step whose
		// input is missing is reported as not replayable.
		if stored, perr := e.inputs.Put(ctx, bus.InputKey(t.key, digest(ro.input)), ro.input); perr != nil {
			e.log.Warn("store a logged operation's input", "trajectory", t.name, "step", op.Step, "err", perr)
		} else if stored {
			e.chargeTrajectory(ctx, project, t.key, int64(len(ro.input)))
		}
	}
	b, merr := json.Marshal(op)
	if merr != nil {
		return nil, merr
	}
	if aerr := e.tlog.Append(ctx, t.key, op.Step, b); aerr != nil {
		// The operation ran but is not in the log: say so, and do not
		// hand out this step again.
		t.last = op.Step
		return nil, &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("the operation ran but the trajectory log could not record step %d: %v", op.Step, aerr)}
	}
	t.last = op.Step
	e.chargeTrajectory(ctx, project, t.key, int64(len(b)))
	e.saveAudit(sb, t.key, op.Step)
	if op.Checkpoint != "" {
		// Only while the record still names this sandbox, and only over
		// the revision read (a resume may rebuild it elsewhere meanwhile).
		var rec TrajectoryRecord
		if found, rev, gerr := e.trajMeta.Get(ctx, t.key, &rec); gerr == nil && found && rec.Sandbox == op.Sandbox {
			rec.CheckpointSnap, rec.CheckpointStep = op.Checkpoint, op.Step
			if perr := e.trajMeta.Update(ctx, t.key, &rec, rev); perr != nil {
				e.log.Warn("record checkpoint", "trajectory", t.name, "err", perr)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	mark(out, op.Step, false, "", "")
	return out, nil
}

// unknownOutcome reports whether an operation that failed with err may or
// may not have happened.
func unknownOutcome(err error) bool {
	var ae *api.Error
	return !errors.As(err, &ae) || ae.Code == api.CodeTimeout || ae.Code == api.CodeUnavailable || ae.Code == api.CodeInternal ||
		strings.Contains(ae.Message, "stopped during the operation")
}

// maxBranches bounds the names tried for a branch (T~k, T~k.2, …).
const maxBranches = 100

// branchAt forks a new trajectory where a resuming client that asked
// branch: true diverged (t.mu held): it shares the log up to the last
// matching step and continues on a new sandbox holding the state after
// that step (the last checkpoint the client passed, then the operations
// re-issued since, run again). The diverging operation runs there. The
// original trajectory and its sandbox are left as they were.
func (e *Edge) branchAt(ctx context.Context, sb *sandbox, ro *recOp) (any, error) {
	t := sb.traj
	k := t.replay[t.cursor].Step
	if t.redoOver {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf(
			"cannot branch trajectory %q at step %d: more than %d MiB of operations since its last checkpoint (record it with checkpoints)", t.name, k, maxRedoBytes>>20)}
	}
	var rec TrajectoryRecord
	found, _, err := e.trajMeta.Get(ctx, t.key, &rec)
	if err != nil {
		return nil, &api.Error{Code: api.CodeUnavailable, Message: err.Error()}
	}
	if !found {
		return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("trajectory %q not found", t.name)}
	}
	sb.mu.Lock()
	spec := sb.rec.Spec
	sb.mu.Unlock()
	base := rec.Spec
	spec.Image, spec.Layers, spec.Snapshot = base.Image, base.Layers, base.Snapshot
	if t.branchSnap != "" {
		spec.Image, spec.Layers, spec.Snapshot = "", nil, t.branchSnap
	}
	spec.Resume, spec.Branch = false, false
	base.Resume, base.Branch = false, false

	id := e.newID()
	var name string
	for i := 1; ; i++ {
		name = fmt.Sprintf("%s~%d", t.name, k)
		if i > 1 {
			name += fmt.Sprintf(".%d", i)
		}
		if !sandboxspec.ValidTrajectory(name) {
			return nil, invalidf("cannot branch trajectory %q: the name %q is too long", t.name, name)
		}
		spec.Trajectory, base.Trajectory = name, name
		nrec := TrajectoryRecord{Name: name, Project: base.Project, Sandbox: id, Spec: base, CheckpointSnap: t.branchSnap, CheckpointStep: t.branchStep,
			Parent: t.name, ParentStep: k - 1, CreatedAt: time.Now().UTC()}
		nrec.ExpiresAt = expiresAt(nrec.CreatedAt, base.TrajectoryTTL)
		err := e.trajMeta.Create(ctx, TrajKey(base.Project, name), &nrec)
		if err == nil {
			break
		}
		if !errors.Is(err, bus.ErrExists) || i == maxBranches {
			return nil, &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("cannot branch trajectory %q: %v", t.name, err)}
		}
	}
	undo := func(why error) error {
		dctx := context.WithoutCancel(ctx)
		_ = e.tlog.Purge(dctx, TrajKey(base.Project, name))
		_ = e.trajMeta.Delete(dctx, TrajKey(base.Project, name))
		return why
	}
	// The shared part of the log.
	shared := make([][]byte, t.cursor)
	for i := range shared {
		if shared[i], err = json.Marshal(&t.replay[i]); err != nil {
			return nil, undo(err)
		}
	}
	if err := e.tlog.AppendAll(ctx, TrajKey(base.Project, name), shared); err != nil {
		return nil, undo(&api.Error{Code: api.CodeUnavailable, Message: err.Error()})
	}
	var sharedBytes int64
	for _, b := range shared {
		sharedBytes += int64(len(b))
	}
	e.chargeTrajectory(ctx, base.Project, TrajKey(base.Project, name), sharedBytes)
	if _, err := e.create(ctx, &CreateRequest{ID: id, Spec: spec}); err != nil {
		return nil, undo(err)
	}
	nsb, err := e.lookup(id)
	if err == nil {
		for _, redo := range t.redo {
			if err = redo(ctx, id); err != nil {
				break
			}
		}
	}
	if err != nil {
		if nsb != nil {
			e.stop(context.WithoutCancel(ctx), nsb, api.StateFailed, "branch: "+err.Error())
		}
		return nil, undo(fmt.Errorf("branch %q: rebuilding the state after step %d: %w", name, k-1, err))
	}
	e.log.Info("trajectory branched", "trajectory", t.name, "branch", name, "step", k, "sandbox", id, "checkpoint", t.branchSnap, "rerun", len(t.redo))
	// The original goes on as it was: live, or (a rebuilt sandbox that has
	// not re-run every step) waiting for a new resume.
	if t.reexec >= len(t.replay) {
		t.replay, t.reexec = nil, 0
	}
	t.cursor, t.resumeAt, t.branch, t.redo, t.redoBytes = 0, time.Time{}, false, nil, 0
	ro.retarget(id)
	out, err := e.recorded(ctx, nsb, ro)
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
	mark(out, ro.step.Step, false, id, name)
	return out, nil
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
		op.StdinHash = digest([]byte(x.Stdin))
		op.Exec.Stdin = ""
	}
	var stdout, stderr bytes.Buffer
	capture := func(stream string, data []byte) error {
		buf := &stdout
		if stream == "stderr" {
			buf = &stderr
		}
		if n := MaxLoggedOutput - buf.Len(); n > 0 {
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
			r.Truncated = r.Truncated || stdout.Len() >= MaxLoggedOutput || stderr.Len() >= MaxLoggedOutput
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
			if err != nil && !unknownOutcome(err) {
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
		st.DataHash, st.DataSize = digest(req.Data), int64(len(req.Data))
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
			if err != nil && !unknownOutcome(err) {
				return nil // it failed the first time too, or differs: the log has what happened
			}
			return err
		},
		retarget: func(id string) { req.ID = id },
		size:     len(req.Data) + 256,
		input:    req.Data,
	})
}

// rebuildTraj prepares a sandbox rebuilt for a lost trajectory sandbox:
// the steps up to the state it was rebuilt from are served from the log,
// the later ones run again as the client re-issues them.
func (e *Edge) rebuildTraj(ctx context.Context, sb *sandbox, fromStep int64, branch bool) error {
	t := sb.traj
	t.mu.Lock()
	e.resolveKey(ctx, t)
	key := t.key
	t.mu.Unlock()
	steps, err := e.readTrajectory(ctx, key)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	reexec := 0
	for reexec < len(steps) && steps[reexec].Step <= fromStep {
		reexec++
	}
	t.startReplay(steps, reexec, branch)
	return nil
}
