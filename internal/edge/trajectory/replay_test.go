package trajectory

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// fakeRunner runs logged operations again, answering what it is told.
type fakeRunner struct {
	started, stopped string
	spec             api.CreateSandboxRequest
	stdout           map[string]string // by command: what a run prints now
	ran              []string
}

func (f *fakeRunner) Start(_ context.Context, id string, spec api.CreateSandboxRequest) (func(), error) {
	f.started, f.spec = id, spec
	return func() { f.stopped = id }, nil
}
func (f *fakeRunner) Exec(_ context.Context, id string, x api.ExecRequest, chunk func(string, []byte) error) (*api.ExecResult, error) {
	f.ran = append(f.ran, fmt.Sprintf("exec %s <%s>", x.Cmd, x.Stdin))
	if err := chunk("stdout", []byte(f.stdout[x.Cmd])); err != nil {
		return nil, err
	}
	return &api.ExecResult{}, nil
}
func (f *fakeRunner) File(_ context.Context, id string, st *api.TrajectoryStep, data []byte) (any, error) {
	f.ran = append(f.ran, fmt.Sprintf("%s %s <%s>", st.Op, st.Path, data))
	return &api.FileInfo{Path: st.Path}, nil
}
func (f *fakeRunner) Network(_ context.Context, id string, egress []string) error {
	f.ran = append(f.ran, "network "+strings.Join(egress, ","))
	return nil
}

// TestReplay: every logged step runs again in a fresh sandbox (no
// trajectory of its own), with its kept stdin and data; a step whose
// output differs is reported; the sandbox is stopped at the end.
func TestReplay(t *testing.T) {
	r, h := recorder(t)
	ctx := context.Background()
	sb := newSandbox(t, r, "sb-a", "t", "")
	record(t, r, sb, execOp(sb, h, "date", ""))
	record(t, r, sb, execOp(sb, h, "cat", "the stdin"))
	write := &Op{
		Step:   &api.TrajectoryStep{Op: "write", Path: "/f", DataHash: Digest([]byte("data")), DataSize: 4},
		Run:    func() (any, error) { return &api.FileInfo{Path: "/f"}, nil },
		Record: func(st *api.TrajectoryStep, out any) { c := *out.(*api.FileInfo); st.File = &c },
		Input:  []byte("data"),
	}
	if _, err := r.Record(ctx, sb, write); err != nil {
		t.Fatal(err)
	}
	net := &Op{Step: &api.TrajectoryStep{Op: "network", Egress: []string{"example.com"}}, Run: func() (any, error) { return &edgeproto.StepResult{}, nil }, Record: func(*api.TrajectoryStep, any) {}}
	if _, err := r.Record(ctx, sb, net); err != nil {
		t.Fatal(err)
	}
	run := &fakeRunner{stdout: map[string]string{"date": "another day", "cat": "out of cat"}}
	req := &edgeproto.ReplayRequest{ID: "sb-r", Trajectory: "t", Project: "p", Spec: sb.spec}
	out, err := r.Replay(ctx, req, run)
	if err != nil {
		t.Fatal(err)
	}
	want := "[exec date <> exec cat <the stdin> write /f <data> network example.com]"
	if fmt.Sprint(run.ran) != want {
		t.Fatalf("ran %v, want %s", run.ran, want)
	}
	if run.started != "sb-r" || run.spec.Trajectory != "" || run.stopped != "sb-r" {
		t.Fatalf("sandbox %q (trajectory %q) stopped %q", run.started, run.spec.Trajectory, run.stopped)
	}
	if out.Steps != 4 || out.Deterministic || len(out.Differences) != 1 || out.Differences[0].Step != 1 {
		t.Fatalf("replay: %+v", out)
	}
	req.Keep, run.stopped, run.stdout["date"] = true, "", "out of date"
	if out, err = r.Replay(ctx, req, run); err != nil || !out.Deterministic || run.stopped != "" {
		t.Fatalf("a kept, deterministic replay: %+v %v, stopped %q", out, err, run.stopped)
	}
}

func TestReplayFilter(t *testing.T) {
	step := func(out, errs string, code int) *api.TrajectoryStep {
		return &api.TrajectoryStep{Op: "exec", Result: &api.ExecResult{Stdout: out, Stderr: errs, ExitCode: code}}
	}
	logged := step("Ran 2 tests in 0.005s\nOK\n", "took 17ms", 0)
	got := step("Ran 2 tests in 0.113s\nOK\n", "took 4ms", 1)
	none, err := edgeproto.NewReplayFilter(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Join(none.Differs(logged, got), ","); f != "exit_code,stdout,stderr" {
		t.Fatalf("unmasked: %s", f)
	}
	f, err := edgeproto.NewReplayFilter([]string{`in [0-9.]+s`, `took \d+ms`}, []string{"exit_code", "duration_ms"})
	if err != nil {
		t.Fatal(err)
	}
	if d := f.Differs(logged, got); len(d) != 0 {
		t.Fatalf("masked: %v", d)
	}
	// A mask hides only its matches.
	if d := f.Differs(logged, step("Ran 3 tests in 0.1s\nOK\n", "took 4ms", 0)); strings.Join(d, ",") != "stdout" {
		t.Fatalf("other text: %v", d)
	}
	// An error is a difference unless ignored.
	failed := &api.TrajectoryStep{Op: "exec", Error: &api.Error{Code: api.CodeConflict}}
	if d := f.Differs(logged, failed); strings.Join(d, ",") != "error" {
		t.Fatalf("error: %v", d)
	}
	if f2, _ := edgeproto.NewReplayFilter(nil, []string{"error"}); len(f2.Differs(logged, failed)) != 0 {
		t.Fatal("ignored error still differs")
	}
	for _, bad := range [][2][]string{{{"("}, nil}, {{""}, nil}, {nil, {"stdin"}}, {make([]string, api.MaxReplayMasks+1), nil}} {
		if _, err := edgeproto.NewReplayFilter(bad[0], bad[1]); err == nil {
			t.Errorf("edgeproto.NewReplayFilter(%q, %q) accepted", bad[0], bad[1])
		} else if ae := new(api.Error); !errors.As(err, &ae) || ae.Code != api.CodeBadRequest {
			t.Errorf("edgeproto.NewReplayFilter(%q, %q): %v is not a bad_request", bad[0], bad[1], err)
		}
	}
}
