package trajectory

import (
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
)

func TestSameOp(t *testing.T) {
	exec := func(x api.ExecRequest) *api.TrajectoryStep { return &api.TrajectoryStep{Op: "exec", Exec: &x} }
	a := exec(api.ExecRequest{Cmd: "make", Env: map[string]string{}, Timeout: 10})
	if !edgeproto.SameOp(a, exec(api.ExecRequest{Cmd: "make", OutputCap: 5})) {
		t.Error("timeouts, output caps and an empty env must not count")
	}
	for _, b := range []*api.TrajectoryStep{
		exec(api.ExecRequest{Cmd: "make", Session: "s2"}),
		exec(api.ExecRequest{Cmd: "make", Cwd: "/x"}),
		exec(api.ExecRequest{Argv: []string{"make"}}),
		exec(api.ExecRequest{Cmd: "make", Env: map[string]string{"A": "1"}}),
		{Op: "write", Path: "/a"},
	} {
		if edgeproto.SameOp(a, b) {
			t.Errorf("%+v equals %+v", b, a)
		}
	}
	w := &api.TrajectoryStep{Op: "write", Path: "/a", DataHash: Digest([]byte("x"))}
	if edgeproto.SameOp(w, &api.TrajectoryStep{Op: "write", Path: "/a", DataHash: Digest([]byte("y"))}) {
		t.Error("different data must diverge")
	}
	if !edgeproto.SameOp(w, &api.TrajectoryStep{Op: "write", Path: "/a", DataHash: Digest([]byte("x"))}) {
		t.Error("same write must match")
	}
}
