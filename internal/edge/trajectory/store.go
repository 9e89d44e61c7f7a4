package trajectory

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edge/core"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// Sandbox is a sandbox as the trajectories see it (the core's *sandbox).
type Sandbox interface {
	core.Sandbox
	// Traj is its trajectory state; nil when it records none.
	Traj() *Traj
	// Spec is a copy of its create request.
	Spec() api.CreateSandboxRequest
	// Prepare readies it for an operation: a paused sandbox is resumed
	// (no step: nothing in it changes); one that does not run is a
	// conflict (*api.Error).
	Prepare(ctx context.Context) error
	// AuditStep stamps what its processes do from now on with step (0:
	// between steps).
	AuditStep(step int64)
}

// Host is what the trajectories need of the lifecycle core. Its methods
// are called with a Traj.mu held.
type Host interface {
	Logger() *slog.Logger
	// CheckStorage refuses (413) n more bytes of project's storage.
	CheckStorage(ctx context.Context, project string, n int64) error
	// Charge charges n bytes of the trajectory key to project.
	Charge(ctx context.Context, project, key string, n int64)
	// Checkpoint snapshots sb after step and names the snapshot.
	Checkpoint(ctx context.Context, sb Sandbox, step int64) (string, error)
	// SaveAudit keeps sb's audit records of step with key's log.
	SaveAudit(sb Sandbox, key string, step int64)
	// NewID names a new sandbox.
	NewID() string
	// Create creates sandbox id of spec (a branch) and hands it over.
	Create(ctx context.Context, id string, spec api.CreateSandboxRequest) (Sandbox, error)
	// Fail stops sb as failed, saying why.
	Fail(ctx context.Context, sb Sandbox, reason string)
}

// Recorder is the node's trajectories: their records, logs and inputs.
type Recorder struct {
	host   Host
	meta   *bus.Records // trajectory records
	log    *bus.TrajLog // trajectory logs
	inputs *bus.Inputs  // logged operations' file data and stdin, by SHA-256
}

// NewRecorder returns the trajectories of the node whose core is host,
// kept in meta, log and inputs.
func NewRecorder(host Host, meta *bus.Records, log *bus.TrajLog, inputs *bus.Inputs) *Recorder {
	return &Recorder{host: host, meta: meta, log: log, inputs: inputs}
}

// resolveKey finds where a trajectory recorded before trajectories had
// owners keeps its record and log: under its bare name, its project only
// in its spec. Once per sandbox, with t.mu held (or before it serves).
func (r *Recorder) resolveKey(ctx context.Context, t *Traj) {
	if t.keyChecked || t.key == t.name {
		return
	}
	var rec edgeproto.TrajectoryRecord
	found, _, err := r.meta.Get(ctx, t.key, &rec)
	if err != nil {
		return // try again with the next operation
	}
	t.keyChecked = true
	if found {
		return
	}
	project, _, _ := strings.Cut(t.key, "|")
	if found, _, err := r.meta.Get(ctx, t.name, &rec); err == nil && found && rec.Project == "" && rec.Spec.Project == project {
		t.key = t.name
	}
}

// load reads where the log of t ends, once (t.mu held).
func (r *Recorder) load(ctx context.Context, t *Traj) error {
	if t.loaded {
		return nil
	}
	r.resolveKey(ctx, t)
	b, err := r.log.Last(ctx, t.key)
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

// Read returns every step of the log key (a TrajKey).
func (r *Recorder) Read(ctx context.Context, key string) ([]api.TrajectoryStep, error) {
	raw, err := r.log.Read(ctx, key, 0, 0)
	if err != nil {
		return nil, &api.Error{Code: api.CodeUnavailable, Message: err.Error()}
	}
	out := make([]api.TrajectoryStep, 0, len(raw))
	for _, b := range raw {
		var st api.TrajectoryStep
		if err := json.Unmarshal(b, &st); err != nil {
			return nil, fmt.Errorf("trajectory %s: corrupt entry: %w", key, err)
		}
		if n := len(out); n > 0 && st.Step <= out[n-1].Step {
			continue // a duplicate of a retried append
		}
		out = append(out, st)
	}
	return out, nil
}

// Register claims the trajectory name of spec for a new sandbox id.
func (r *Recorder) Register(ctx context.Context, id string, spec *api.CreateSandboxRequest) error {
	if spec.Trajectory == "" || spec.Resume {
		return nil
	}
	rec := edgeproto.TrajectoryRecord{Name: spec.Trajectory, Project: spec.Project, Sandbox: id, Spec: *spec, CreatedAt: time.Now().UTC()}
	rec.ExpiresAt = ExpiresAt(rec.CreatedAt, spec.TrajectoryTTL)
	key := edgeproto.TrajKey(spec.Project, spec.Trajectory)
	err := r.meta.Create(ctx, key, &rec)
	if errors.Is(err, bus.ErrExists) {
		var old edgeproto.TrajectoryRecord
		if found, _, gerr := r.meta.Get(ctx, key, &old); gerr == nil && found && old.Sandbox == id {
			return nil // a retried create
		}
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("trajectory %q exists; re-attach with resume: true", spec.Trajectory)}
	}
	return err
}

// Unregister drops the record of spec's trajectory when it still names
// sandbox id (its create failed).
func (r *Recorder) Unregister(ctx context.Context, id string, spec *api.CreateSandboxRequest) {
	key := edgeproto.TrajKey(spec.Project, spec.Trajectory)
	var tr edgeproto.TrajectoryRecord
	if found, _, gerr := r.meta.Get(ctx, key, &tr); gerr == nil && found && tr.Sandbox == id {
		_ = r.meta.Delete(context.WithoutCancel(ctx), key)
	}
}

// Resume starts fast-forwarding sb's trajectory for a resuming client
// (with branch, one that may diverge into a branch; delegate, the API
// server replica serving it from the log, see ResumeRequest.Delegate). It
// answers where the log ends and how many steps the client re-issues.
func (r *Recorder) Resume(ctx context.Context, sb Sandbox, name string, branch bool, delegate string) (last, steps int64, err error) {
	t := sb.Traj()
	if t == nil || t.name != name {
		return 0, 0, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("sandbox %s does not record trajectory %q", sb.ID(), name)}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r.resolveKey(ctx, t)
	if t.cursor < len(t.replay) && time.Since(t.resumeAt) < resumeLease {
		return 0, 0, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("trajectory %q is being resumed by another client (at step %d of %d)", t.name, t.cursor, len(t.replay))}
	}
	logged, err := r.Read(ctx, t.key)
	if err != nil {
		return 0, 0, err
	}
	// A rebuilt sandbox that has not re-run every logged step yet keeps
	// re-running from where it stopped.
	reexec := len(logged)
	if t.reexec < len(t.replay) && len(t.replay) == len(logged) {
		reexec = t.reexec
	}
	t.startReplay(logged, reexec, branch)
	if delegate != "" && !branch && reexec == len(logged) && len(logged) > 0 {
		t.delegate = delegate
	}
	return t.last, int64(len(logged)), nil
}

// Advance ends a delegated fast-forward of sb's trajectory at the
// delegate's cursor.
func (r *Recorder) Advance(sb Sandbox, delegate string, cursor int) error {
	t := sb.Traj()
	if t == nil {
		return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("sandbox %s records no trajectory", sb.ID())}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.delegate == "" || t.delegate != delegate {
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("trajectory %q was resumed by another client", t.name)}
	}
	if cursor < t.cursor || cursor > len(t.replay) {
		return &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("cursor %d is outside the log (%d steps)", cursor, len(t.replay))}
	}
	t.cursor, t.delegate, t.resumeAt = cursor, "", time.Now()
	if t.cursor == len(t.replay) {
		t.replay, t.cursor, t.reexec = nil, 0, 0
	}
	return nil
}

// Rebuild prepares a sandbox rebuilt for a lost trajectory sandbox: the
// steps up to the state it was rebuilt from are served from the log, the
// later ones run again as the client re-issues them.
func (r *Recorder) Rebuild(ctx context.Context, sb Sandbox, fromStep int64, branch bool) error {
	t := sb.Traj()
	t.mu.Lock()
	r.resolveKey(ctx, t)
	key := t.key
	t.mu.Unlock()
	logged, err := r.Read(ctx, key)
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	reexec := 0
	for reexec < len(logged) && logged[reexec].Step <= fromStep {
		reexec++
	}
	t.startReplay(logged, reexec, branch)
	return nil
}

// InputKeys lists the trajectories whose inputs a replay of project's
// trajectory name reads: its own, then each trajectory it branched from
// (a branch shares its parent's log up to the branch point).
func (r *Recorder) InputKeys(ctx context.Context, project, name string) []string {
	var keys []string
	for i := 0; name != "" && i < 64; i++ {
		key := edgeproto.TrajKey(project, name)
		keys = append(keys, key)
		var rec edgeproto.TrajectoryRecord
		if found, _, err := r.meta.Get(ctx, key, &rec); err != nil || !found {
			break
		}
		name = rec.Parent
	}
	return keys
}

// ErrNoInput says a logged operation's input was not kept.
var ErrNoInput = errors.New("input not kept")

// Input is the logged input of digest hash, looked for under each of keys
// (InputKeys); ErrNoInput when it was not kept.
func (r *Recorder) Input(ctx context.Context, keys []string, hash string) ([]byte, error) {
	if hash == "" || hash == Digest(nil) {
		return nil, nil
	}
	for _, k := range keys {
		b, err := r.inputs.Get(ctx, bus.InputKey(k, hash))
		if errors.Is(err, bus.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if Digest(b) == hash {
			return b, nil
		}
	}
	// Kept before inputs were per trajectory: under the bare hash.
	b, err := r.inputs.Get(ctx, hash)
	if errors.Is(err, bus.ErrNotFound) || (err == nil && Digest(b) != hash) {
		return nil, ErrNoInput
	}
	return b, err
}
