package edge

import (
	"context"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge/trajectory"
)

// replayTrajectory re-executes every logged step of a trajectory in a
// fresh sandbox and reports the steps whose outcome differs from the log
// (trajectory.Recorder.Replay), through the core's own calls (replayer).
func (e *Edge) replayTrajectory(ctx context.Context, req *ReplayRequest) (*api.TrajectoryReplay, error) {
	return e.trajs.Replay(ctx, req, replayer{e})
}

// replayer is the core as a replay runs logged operations again.
type replayer struct{ e *Edge }

var _ trajectory.Runner = replayer{}

func (r replayer) Start(ctx context.Context, id string, spec api.CreateSandboxRequest) (func(), error) {
	if _, err := r.e.create(ctx, &CreateRequest{ID: id, Spec: spec}); err != nil {
		return nil, err
	}
	sb, err := r.e.lookup(id)
	if err != nil {
		return nil, err
	}
	return func() { r.e.stop(context.WithoutCancel(ctx), sb, api.StateStopped, "replay done") }, nil
}

func (r replayer) Exec(ctx context.Context, id string, x api.ExecRequest, chunk func(stream string, data []byte) error) (*api.ExecResult, error) {
	out, err := r.e.exec(ctx, &ExecRequest{ID: id, Exec: x}, chunk)
	if err != nil {
		return nil, err
	}
	return out.(*api.ExecResult), nil
}

// fileOpOf maps the logged file operations to the edge's ops.
var fileOpOf = map[string]string{"write": OpFileWrite, "mkdir": OpFileMkdir, "remove": OpFileRemove, "rename": OpFileRename}

func (r replayer) File(ctx context.Context, id string, st *api.TrajectoryStep, data []byte) (any, error) {
	req := &FileRequest{ID: id, Path: st.Path, To: st.To, Mode: st.Mode, Parents: st.Parents, Recursive: st.Recursive, Append: st.Append, Data: data}
	return r.e.file(ctx, fileOpOf[st.Op], req, nil)
}

func (r replayer) Network(_ context.Context, id string, egress []string) error {
	_, err := r.e.rules.Set(id, &api.NetworkSpec{Egress: egress})
	return err
}
