package edge

import (
	"testing"

	"github.com/warrenhq/warren/api"
)

func TestSameOp(t *testing.T) {
	exec := func(x api.ExecRequest) *api.TrajectoryStep { return &api.TrajectoryStep{Op: "exec", Exec: &x} }
	a := exec(api.ExecRequest{Cmd: "make", Env: map[string]string{}, Timeout: 10})
	if !sameOp(a, exec(api.ExecRequest{Cmd: "make", OutputCap: 5})) {
		t.Error("timeouts, output caps and an empty env must not count")
	}
	for _, b := range []*api.TrajectoryStep{
		exec(api.ExecRequest{Cmd: "make", Session: "s2"}),
		exec(api.ExecRequest{Cmd: "make", Cwd: "/x"}),
		exec(api.ExecRequest{Argv: []string{"make"}}),
		exec(api.ExecRequest{Cmd: "make", Env: map[string]string{"A": "1"}}),
		{Op: "write", Path: "/a"},
	} {
		if sameOp(a, b) {
			t.Errorf("%+v equals %+v", b, a)
		}
	}
	w := &api.TrajectoryStep{Op: "write", Path: "/a", DataHash: digest([]byte("x"))}
	if sameOp(w, &api.TrajectoryStep{Op: "write", Path: "/a", DataHash: digest([]byte("y"))}) {
		t.Error("different data must diverge")
	}
	if !sameOp(w, &api.TrajectoryStep{Op: "write", Path: "/a", DataHash: digest([]byte("x"))}) {
		t.Error("same write must match")
	}
}
