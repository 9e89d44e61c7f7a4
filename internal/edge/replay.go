package edge

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge/trajectory"
)

// replayTrajectory re-executes every logged step of a trajectory, in
// order, in a fresh sandbox from the trajectory's original state, and
// reports every step whose outcome differs from the log.
func (e *Edge) replayTrajectory(ctx context.Context, req *ReplayRequest) (*api.TrajectoryReplay, error) {
	start := time.Now()
	filter, err := NewReplayFilter(req.Masks, req.Ignore)
	if err != nil {
		return nil, err
	}
	steps, err := e.trajs.Read(ctx, TrajKey(req.Project, req.Trajectory))
	if err != nil {
		return nil, err
	}
	spec := req.Spec
	spec.Trajectory, spec.Resume, spec.Branch, spec.Checkpoint = "", false, false, ""
	if _, err := e.create(ctx, &CreateRequest{ID: req.ID, Spec: spec}); err != nil {
		return nil, err
	}
	sb, err := e.lookup(req.ID)
	if err != nil {
		return nil, err
	}
	if !req.Keep {
		defer e.stop(context.WithoutCancel(ctx), sb, api.StateStopped, "replay done")
	}
	keys := e.trajs.InputKeys(ctx, req.Project, req.Trajectory)
	out := &api.TrajectoryReplay{Trajectory: req.Trajectory, Sandbox: req.ID, Differences: []api.StepDifference{}}
	for i := range steps {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		logged := &steps[i]
		got, err := e.rerun(ctx, req.ID, logged, keys)
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
func (e *Edge) rerun(ctx context.Context, id string, logged *api.TrajectoryStep, keys []string) (*api.TrajectoryStep, error) {
	got := trajectory.OpOnly(*logged)
	got.Sandbox, got.At = id, time.Now().UTC()
	input := func(hash string, _ int64) ([]byte, error) { return e.trajs.Input(ctx, keys, hash) }
	var out any
	var err error
	switch logged.Op {
	case "exec":
		if logged.Exec == nil {
			return nil, fmt.Errorf("step %d: exec without a command", logged.Step)
		}
		x := *logged.Exec
		var stdin []byte
		if stdin, err = input(logged.StdinHash, 0); err == nil {
			x.Stdin = string(stdin)
			var stdout, stderr []byte
			out, err = e.exec(ctx, &ExecRequest{ID: id, Exec: x}, func(stream string, data []byte) error {
				buf := &stdout
				if stream == "stderr" {
					buf = &stderr
				}
				if n := trajectory.MaxLoggedOutput - len(*buf); n > 0 {
					*buf = append(*buf, data[:min(n, len(data))]...)
				}
				return nil
			})
			if err == nil {
				r := *out.(*api.ExecResult)
				r.Stdout, r.Stderr = string(stdout), string(stderr)
				got.Result = &r
			}
		}
	case "write", "mkdir", "remove", "rename":
		op := map[string]string{"write": OpFileWrite, "mkdir": OpFileMkdir, "remove": OpFileRemove, "rename": OpFileRename}[logged.Op]
		freq := &FileRequest{ID: id, Path: logged.Path, To: logged.To, Mode: logged.Mode, Parents: logged.Parents, Recursive: logged.Recursive, Append: logged.Append}
		if logged.Op == "write" {
			freq.Data, err = input(logged.DataHash, logged.DataSize)
		}
		if err == nil {
			out, err = e.file(ctx, op, freq, nil)
			if fi, ok := out.(*api.FileInfo); ok && err == nil {
				c := *fi
				got.File = &c
			}
		}
	case "network":
		_, err = e.applyNetwork(id, &api.NetworkSpec{Egress: append([]string{}, logged.Egress...)})
	default:
		return nil, fmt.Errorf("step %d: unknown operation %q", logged.Step, logged.Op)
	}
	if err != nil {
		var ae *api.Error
		switch {
		case errors.Is(err, trajectory.ErrNoInput):
			got.Error = &api.Error{Code: api.CodeNotFound, Message: "the operation's input (file data or stdin) was not kept: it cannot be re-executed"}
		case errors.As(err, &ae) && !trajectory.UnknownOutcome(err):
			got.Error = &api.Error{Code: ae.Code, Message: ae.Message}
		default:
			return nil, err
		}
	}
	return &got, nil
}
