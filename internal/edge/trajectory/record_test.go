package trajectory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// fakeSandbox is a sandbox of the core as the trajectories see it.
type fakeSandbox struct {
	id   string
	spec api.CreateSandboxRequest
	traj *Traj
	ran  []string // what ran in it: the commands run and redone
	mu   sync.Mutex
}

func (s *fakeSandbox) ID() string                     { return s.id }
func (s *fakeSandbox) Agent() *agentproto.Client      { return nil }
func (s *fakeSandbox) Ready() bool                    { return true }
func (s *fakeSandbox) Traj() *Traj                    { return s.traj }
func (s *fakeSandbox) Spec() api.CreateSandboxRequest { return s.spec }
func (s *fakeSandbox) Prepare(context.Context) error  { return nil }
func (s *fakeSandbox) AuditStep(int64)                {}
func (s *fakeSandbox) did(what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ran = append(s.ran, what)
}

// fakeHost is the core: it creates fake sandboxes and takes fake
// checkpoints.
type fakeHost struct {
	mu      sync.Mutex
	n       int
	created map[string]*fakeSandbox
	charged int64
	checks  int
}

func (h *fakeHost) Logger() *slog.Logger                              { return slog.New(slog.DiscardHandler) }
func (h *fakeHost) CheckStorage(context.Context, string, int64) error { return nil }
func (h *fakeHost) SaveAudit(Sandbox, string, int64)                  {}
func (h *fakeHost) Fail(context.Context, Sandbox, string)             {}
func (h *fakeHost) Charge(_ context.Context, _, _ string, n int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.charged += n
}
func (h *fakeHost) Checkpoint(_ context.Context, _ Sandbox, step int64) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checks++
	return fmt.Sprintf("snap-%d", step), nil
}
func (h *fakeHost) NewID() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.n++
	return fmt.Sprintf("sb-%d", h.n)
}
func (h *fakeHost) Create(_ context.Context, id string, spec api.CreateSandboxRequest) (Sandbox, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	sb := &fakeSandbox{id: id, spec: spec, traj: New(&spec)}
	h.created[id] = sb
	return sb, nil
}

// recorder is a Recorder over an embedded bus (no root needed).
func recorder(t *testing.T) (*Recorder, *fakeHost) {
	t.Helper()
	srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: t.TempDir(), NoAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	conn, err := srv.Connect("trajectory-test", bus.RoleAPIServer, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	ctx := context.Background()
	meta, err := conn.Records(ctx, bus.BucketTrajectories)
	if err != nil {
		t.Fatal(err)
	}
	log, err := conn.TrajectoryLog(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inputs, err := conn.TrajectoryInputs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := &fakeHost{created: map[string]*fakeSandbox{}}
	return NewRecorder(h, meta, log, inputs), h
}

// newSandbox registers trajectory name of project p for a new sandbox.
func newSandbox(t *testing.T, r *Recorder, id, name, checkpoint string) *fakeSandbox {
	t.Helper()
	spec := api.CreateSandboxRequest{Project: "p", Image: "img", Trajectory: name, Checkpoint: checkpoint}
	if err := r.Register(context.Background(), id, &spec); err != nil {
		t.Fatal(err)
	}
	return &fakeSandbox{id: id, spec: spec, traj: New(&spec)}
}

// execOp is an exec of cmd: it runs in sb (or the sandbox it is
// retargeted to) and records its stdout.
func execOp(sb *fakeSandbox, h *fakeHost, cmd, stdin string) *Op {
	target := sb
	st := &api.TrajectoryStep{Op: "exec", Exec: &api.ExecRequest{Cmd: cmd}}
	if stdin != "" {
		st.StdinHash = Digest([]byte(stdin))
	}
	return &Op{
		Step: st,
		Run: func() (any, error) {
			target.did(cmd)
			return &api.ExecResult{Stdout: "out of " + cmd}, nil
		},
		Record: func(st *api.TrajectoryStep, out any) { r := *out.(*api.ExecResult); st.Result = &r },
		Replay: func(st *api.TrajectoryStep) (any, error) { r := *st.Result; return &r, nil },
		Redo: func(_ context.Context, id string) error {
			h.created[id].did("redo " + cmd)
			return nil
		},
		Retarget: func(id string) { target = h.created[id] },
		Size:     len(cmd),
		Input:    []byte(stdin),
	}
}

func record(t *testing.T, r *Recorder, sb *fakeSandbox, op *Op) *api.ExecResult {
	t.Helper()
	out, err := r.Record(context.Background(), sb, op)
	if err != nil {
		t.Fatal(err)
	}
	return out.(*api.ExecResult)
}

// TestRecordThenFastForward: live operations are numbered steps of the
// log (inputs kept by digest, everything charged); a resuming client's
// re-issued steps are answered from the log without running, and one that
// differs is refused with the divergence.
func TestRecordThenFastForward(t *testing.T) {
	r, h := recorder(t)
	ctx := context.Background()
	sb := newSandbox(t, r, "sb-a", "t", "")
	if res := record(t, r, sb, execOp(sb, h, "make", "")); res.Step != 1 || res.Replayed {
		t.Fatalf("first step: %+v", res)
	}
	if res := record(t, r, sb, execOp(sb, h, "test", "the stdin")); res.Step != 2 {
		t.Fatalf("second step: %+v", res)
	}
	steps, err := r.Read(ctx, edgeproto.TrajKey("p", "t"))
	if err != nil || len(steps) != 2 || steps[1].Result.Stdout != "out of test" || steps[1].Sandbox != "sb-a" {
		t.Fatalf("log: %+v %v", steps, err)
	}
	if b, err := r.Input(ctx, r.InputKeys(ctx, "p", "t"), Digest([]byte("the stdin"))); err != nil || string(b) != "the stdin" {
		t.Fatalf("kept input: %q %v", b, err)
	}
	if _, err := r.Input(ctx, r.InputKeys(ctx, "p", "t"), Digest([]byte("never"))); !errors.Is(err, ErrNoInput) {
		t.Fatalf("an input never kept: %v", err)
	}
	if h.charged == 0 {
		t.Fatal("nothing charged to the project")
	}

	last, n, err := r.Resume(ctx, sb, "t", false, "")
	if err != nil || last != 2 || n != 2 {
		t.Fatalf("resume: last %d, steps %d, %v", last, n, err)
	}
	if res := record(t, r, sb, execOp(sb, h, "make", "")); res.Step != 1 || !res.Replayed || res.Stdout != "out of make" {
		t.Fatalf("fast-forwarded step: %+v", res)
	}
	_, err = r.Record(ctx, sb, execOp(sb, h, "rm -rf /", ""))
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeConflict || ae.Diverge == nil || ae.Diverge.Step != 2 {
		t.Fatalf("a diverging operation: %v", err)
	}
	if len(sb.ran) != 2 {
		t.Fatalf("ran %v: fast-forwarded or refused steps must not run", sb.ran)
	}
}

// TestRebuildRunsLaterSteps: a sandbox rebuilt from the state after step 1
// is served step 1 from the log and runs step 2 again without logging it
// twice; the next operation is step 3.
func TestRebuildRunsLaterSteps(t *testing.T) {
	r, h := recorder(t)
	ctx := context.Background()
	sb := newSandbox(t, r, "sb-a", "t", "")
	record(t, r, sb, execOp(sb, h, "one", ""))
	record(t, r, sb, execOp(sb, h, "two", ""))
	re := &fakeSandbox{id: "sb-b", spec: sb.spec, traj: New(&sb.spec)}
	if err := r.Rebuild(ctx, re, 1, false); err != nil {
		t.Fatal(err)
	}
	if res := record(t, r, re, execOp(re, h, "one", "")); !res.Replayed {
		t.Fatalf("step 1 was not served from the log: %+v", res)
	}
	if res := record(t, r, re, execOp(re, h, "two", "")); res.Replayed || res.Step != 2 {
		t.Fatalf("step 2 was not run again: %+v", res)
	}
	if res := record(t, r, re, execOp(re, h, "three", "")); res.Step != 3 {
		t.Fatalf("the next operation: %+v", res)
	}
	if fmt.Sprint(re.ran) != "[two three]" {
		t.Fatalf("ran in the rebuilt sandbox: %v", re.ran)
	}
	if steps, _ := r.Read(ctx, edgeproto.TrajKey("p", "t")); len(steps) != 3 {
		t.Fatalf("log has %d steps, want 3", len(steps))
	}
}

// TestBranchAtDivergence: a client that resumed with branch: true and
// diverges gets a new trajectory t~2 on a new sandbox, from the last
// checkpoint it passed with the operations since redone; the branch's log
// shares the steps before and continues with the new one; the original's
// log is unchanged.
func TestBranchAtDivergence(t *testing.T) {
	r, h := recorder(t)
	ctx := context.Background()
	sb := newSandbox(t, r, "sb-a", "t", "every-step")
	record(t, r, sb, execOp(sb, h, "one", ""))
	record(t, r, sb, execOp(sb, h, "two", ""))
	record(t, r, sb, execOp(sb, h, "three", ""))
	if h.checks != 3 {
		t.Fatalf("%d checkpoints, want one per step", h.checks)
	}
	if _, _, err := r.Resume(ctx, sb, "t", true, ""); err != nil {
		t.Fatal(err)
	}
	record(t, r, sb, execOp(sb, h, "one", ""))
	record(t, r, sb, execOp(sb, h, "two", ""))
	res := record(t, r, sb, execOp(sb, h, "other", ""))
	if res.Trajectory != "t~3" || res.Step != 3 || res.Sandbox == "" || res.Sandbox == "sb-a" {
		t.Fatalf("branch answer: %+v", res)
	}
	nsb := h.created[res.Sandbox]
	if nsb.spec.Snapshot != "snap-2" || fmt.Sprint(nsb.ran) != "[other]" {
		t.Fatalf("branch sandbox: from %q, ran %v (want from the checkpoint of step 2, nothing to redo)", nsb.spec.Snapshot, nsb.ran)
	}
	branch, _ := r.Read(ctx, edgeproto.TrajKey("p", "t~3"))
	orig, _ := r.Read(ctx, edgeproto.TrajKey("p", "t"))
	if len(branch) != 3 || branch[2].Exec.Cmd != "other" || branch[1].Exec.Cmd != "two" || len(orig) != 3 || orig[2].Exec.Cmd != "three" {
		t.Fatalf("logs: branch %d steps, original %d steps", len(branch), len(orig))
	}
	var rec edgeproto.TrajectoryRecord
	if found, _, err := r.meta.Get(ctx, edgeproto.TrajKey("p", "t~3"), &rec); err != nil || !found || rec.Parent != "t" || rec.ParentStep != 2 || rec.Sandbox != res.Sandbox {
		t.Fatalf("branch record: %+v %v %v", rec, found, err)
	}
}

// TestBranchRedoesSinceCheckpoint: without checkpoints a branch starts
// from the original state and redoes every operation re-issued before the
// divergence.
func TestBranchRedoesSinceCheckpoint(t *testing.T) {
	r, h := recorder(t)
	ctx := context.Background()
	sb := newSandbox(t, r, "sb-a", "t", "")
	record(t, r, sb, execOp(sb, h, "one", ""))
	record(t, r, sb, execOp(sb, h, "two", ""))
	if _, _, err := r.Resume(ctx, sb, "t", true, ""); err != nil {
		t.Fatal(err)
	}
	record(t, r, sb, execOp(sb, h, "one", ""))
	res := record(t, r, sb, execOp(sb, h, "other", ""))
	nsb := h.created[res.Sandbox]
	if res.Trajectory != "t~2" || nsb.spec.Image != "img" || nsb.spec.Snapshot != "" || fmt.Sprint(nsb.ran) != "[redo one other]" {
		t.Fatalf("branch %q from image %q snapshot %q ran %v", res.Trajectory, nsb.spec.Image, nsb.spec.Snapshot, nsb.ran)
	}
}
