package trajectory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// Runner runs a trajectory's logged operations again for Replay: the
// core's create, exec, file operations and network changes.
type Runner interface {
	// Start creates the sandbox id of spec that the replay runs in; stop
	// stops it.
	Start(ctx context.Context, id string, spec api.CreateSandboxRequest) (stop func(), err error)
	// Exec runs x in sandbox id; chunk receives its output.
	Exec(ctx context.Context, id string, x api.ExecRequest, chunk func(stream string, data []byte) error) (*api.ExecResult, error)
	// File runs the file operation of the logged step st ("write" with
	// data, "mkdir", "remove", "rename") in sandbox id; its answer is an
	// *api.FileInfo when the operation has one.
	File(ctx context.Context, id string, st *api.TrajectoryStep, data []byte) (any, error)
	// Network replaces sandbox id's egress list.
	Network(ctx context.Context, id string, egress []string) error
}

// Replay re-executes every logged step of a trajectory, in order, in a
// fresh sandbox (req.ID) from the trajectory's original state, and reports
// every step whose outcome differs from the log (but for req's masks and
// ignored fields). The sandbox is stopped at the end unless req.Keep.
func (r *Recorder) Replay(ctx context.Context, req *edgeproto.ReplayRequest, run Runner) (*api.TrajectoryReplay, error) {
	start := time.Now()
	filter, err := edgeproto.NewReplayFilter(req.Masks, req.Ignore)
	if err != nil {
		return nil, err
	}
	steps, err := r.Read(ctx, edgeproto.TrajKey(req.Project, req.Trajectory))
	if err != nil {
		return nil, err
	}
	spec := req.Spec
	spec.Trajectory, spec.Resume, spec.Branch, spec.Checkpoint = "", false, false, ""
	stop, err := run.Start(ctx, req.ID, spec)
	if err != nil {
		return nil, err
	}
	if !req.Keep {
		defer stop()
	}
	keys := r.InputKeys(ctx, req.Project, req.Trajectory)
	out := &api.TrajectoryReplay{Trajectory: req.Trajectory, Sandbox: req.ID, Differences: []api.StepDifference{}}
	for i := range steps {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		logged := &steps[i]
		got, err := r.rerun(ctx, run, req.ID, logged, keys)
		if err != nil {
			return nil, fmt.Errorf("replay of %q stopped at step %d: %w", req.Trajectory, logged.Step, err)
		}
		out.Steps++
		if fields := filter.Differs(logged, got); len(fields) > 0 {
			out.Differences = append(out.Differences, api.StepDifference{Step: logged.Step, Op: logged.Op, Fields: fields, Logged: *logged, Got: *got})
		}
	}
	out.Deterministic = len(out.Differences) == 0
	out.DurationMs = float64(time.Since(start).Microseconds()) / 1000
	return out, nil
}

// rerun runs a logged operation again on sandbox id and returns the step
// with the new result. An error means the replay cannot go on.
func (r *Recorder) rerun(ctx context.Context, run Runner, id string, logged *api.TrajectoryStep, keys []string) (*api.TrajectoryStep, error) {
	got := OpOnly(*logged)
	got.Sandbox, got.At = id, time.Now().UTC()
	var err error
	switch logged.Op {
	case "exec":
		if logged.Exec == nil {
			return nil, fmt.Errorf("step %d: exec without a command", logged.Step)
		}
		got.Result, err = r.rerunExec(ctx, run, id, logged, keys)
	case "write", "mkdir", "remove", "rename":
		var data []byte
		if logged.Op == "write" {
			data, err = r.Input(ctx, keys, logged.DataHash)
		}
		if err == nil {
			var out any
			out, err = run.File(ctx, id, logged, data)
			if fi, ok := out.(*api.FileInfo); ok && err == nil {
				c := *fi
				got.File = &c
			}
		}
	case "network":
		err = run.Network(ctx, id, append([]string{}, logged.Egress...))
	default:
		return nil, fmt.Errorf("step %d: unknown operation %q", logged.Step, logged.Op)
	}
	if err != nil {
		var ae *api.Error
		switch {
		case errors.Is(err, ErrNoInput):
			got.Error = &api.Error{Code: api.CodeNotFound, Message: "the operation's input (file data or stdin) was not kept: it cannot be re-executed"}
		case errors.As(err, &ae) && !UnknownOutcome(err):
			got.Error = &api.Error{Code: ae.Code, Message: ae.Message}
		default:
			return nil, err
		}
	}
	return &got, nil
}

// rerunExec runs a logged exec again with its logged stdin and answers its
// result with its output (as much as the log keeps).
func (r *Recorder) rerunExec(ctx context.Context, run Runner, id string, logged *api.TrajectoryStep, keys []string) (*api.ExecResult, error) {
	x := *logged.Exec
	stdin, err := r.Input(ctx, keys, logged.StdinHash)
	if err != nil {
		return nil, err
	}
	x.Stdin = string(stdin)
	var stdout, stderr []byte
	res, err := run.Exec(ctx, id, x, func(stream string, data []byte) error {
		buf := &stdout
		if stream == "stderr" {
			buf = &stderr
		}
		if n := MaxLoggedOutput - len(*buf); n > 0 {
			*buf = append(*buf, data[:min(n, len(data))]...)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	c := *res
	c.Stdout, c.Stderr = string(stdout), string(stderr)
	return &c, nil
}
