// Package trajectory is the edge's trajectories, written against the
// lifecycle core (internal/edge/core) through Host and Sandbox. A sandbox
// created with a trajectory name records every state-changing operation
// (exec, file writes, network changes) as a numbered step in an ordered
// log (internal/bus: the JetStream stream warren-trajectories, a record
// per trajectory, the operations' inputs by digest). A client that lost
// its sandbox resumes: the logged steps it re-issues are answered from the
// log (fast-forward) or, on a sandbox rebuilt from a checkpoint, run
// again; one that diverges is refused, or with branch: true forks a new
// trajectory on a new sandbox (Recorder.Record, branchAt). A replay runs
// every logged step again in a fresh sandbox and reports the steps whose
// outcome differs (Recorder.Replay, through the core's Runner).
//
// The core keeps what runs an operation: it builds each Op (what to run,
// how to record and replay it) and calls Record, and runs a replay's
// operations (Runner); it answers the calls that need its sandboxes
// (resume, advance) and hands them over as a Sandbox.
//
// Lock order: Traj.mu first, held over one whole logged operation (which
// may snapshot, branch, i.e. create a sandbox, or stop one), then the
// core's locks (internal/edge/edge.go), which Host and Sandbox methods
// take. Two trajectories' locks are held together only by a branch (the
// original's, then its new branch's, whose sandbox nobody else knows yet).
package trajectory

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// MaxLoggedOutput bounds the stdout and stderr kept per step in the log.
const MaxLoggedOutput = 1 << 20

// resumeLease is how long a resuming client that stopped re-issuing
// operations keeps other resumers out.
const resumeLease = 30 * time.Second

// maxRedoBytes bounds the operations (their data and stdin) kept to build
// a branch: beyond it a divergence cannot branch (take checkpoints).
const maxRedoBytes = 256 << 20

// ExpiresAt is when a trajectory made at t with ttl seconds expires (zero:
// never).
func ExpiresAt(t time.Time, ttl int) time.Time {
	if ttl <= 0 {
		return time.Time{}
	}
	return t.Add(time.Duration(ttl) * time.Second)
}

// Traj is the trajectory state of one sandbox. mu serializes the
// sandbox's state-changing operations so the log is totally ordered.
type Traj struct {
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

// New is the trajectory state of a sandbox created with spec; nil when it
// records none.
func New(spec *api.CreateSandboxRequest) *Traj {
	if spec.Trajectory == "" {
		return nil
	}
	return &Traj{name: spec.Trajectory, key: edgeproto.TrajKey(spec.Project, spec.Trajectory), every: sandboxspec.CheckpointEvery(spec.Checkpoint)}
}

// Name is the trajectory's name.
func (t *Traj) Name() string { return t.name }

// startReplay arms a trajectory for a client fast-forwarding through steps.
func (t *Traj) startReplay(steps []api.TrajectoryStep, reexec int, branch bool) {
	t.replay, t.cursor, t.resumeAt, t.loaded, t.reexec, t.delegate = steps, 0, time.Now(), true, reexec, ""
	t.branch, t.redo, t.redoBytes, t.redoOver, t.branchSnap, t.branchStep = branch, nil, 0, false, "", 0
	t.last = 0
	if n := len(steps); n > 0 {
		t.last = steps[n-1].Step
	}
}

// passed notes that the client re-issued the logged step st (op redoes
// it on another sandbox), for a later branch.
func (t *Traj) passed(st *api.TrajectoryStep, op *Op) {
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
	if t.redoBytes += op.Size; t.redoBytes > maxRedoBytes {
		t.redo, t.redoOver = nil, true
		return
	}
	t.redo = append(t.redo, op.Redo)
}

// Op is one state-changing operation of a trajectory sandbox, as the core
// builds it.
type Op struct {
	Step *api.TrajectoryStep
	// Run runs it on the sandbox it addresses, streaming to the client;
	// Record puts its result into the step; Replay turns a logged step
	// back into an answer.
	Run    func() (any, error)
	Record func(st *api.TrajectoryStep, out any)
	Replay func(st *api.TrajectoryStep) (any, error)
	// Redo runs it again on sandbox id without answering anyone; Retarget
	// makes Run address sandbox id; Size is what Redo holds in memory.
	Redo     func(ctx context.Context, id string) error
	Retarget func(id string)
	Size     int
	// Input is the operation's data or stdin (kept by digest for replay).
	Input []byte
}

// Mark sets the trajectory fields of an answer.
func Mark(out any, step int64, replayed bool, sandbox, trajectory string) {
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
	case *edgeproto.StepResult:
		o.Step, o.Replayed = step, replayed
		if sandbox != "" {
			o.Sandbox, o.Trajectory = sandbox, trajectory
		}
	}
}

// Digest is the hex SHA-256 of b, the key of a logged input.
func Digest(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// OpOnly strips the results from a step (for the divergence answer).
func OpOnly(s api.TrajectoryStep) api.TrajectoryStep {
	s.Result, s.File, s.Error, s.Checkpoint = nil, nil, nil, ""
	return s
}

// UnknownOutcome reports whether an operation that failed with err may or
// may not have happened.
func UnknownOutcome(err error) bool {
	var ae *api.Error
	return !errors.As(err, &ae) || ae.Code == api.CodeTimeout || ae.Code == api.CodeUnavailable || ae.Code == api.CodeInternal ||
		strings.Contains(ae.Message, "stopped during the operation")
}
