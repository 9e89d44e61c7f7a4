package sandboxspec

import (
	"testing"

	"github.com/warrenhq/warren/api"
)

func TestHistoryFields(t *testing.T) {
	ok := []api.CreateSandboxRequest{
		{Image: "busybox", Trajectory: "rollout-77/step-0", Checkpoint: "every-step"},
		{Image: "busybox", Trajectory: "t~2", Checkpoint: "10"},
		{Snapshot: "snap-abc123"},
		{Trajectory: "t", Resume: true, Snapshot: "snap-x"}, // an edge rebuild
	}
	for _, r := range ok {
		if err := Normalize(&r); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
	bad := []api.CreateSandboxRequest{
		{Snapshot: "../etc"},
		{Snapshot: "snap-a", Image: "busybox"},
		{Snapshot: "snap-a", Layers: []api.LayerAttachment{{Layer: "x"}}},
		{Image: "busybox", Trajectory: "../x"},
		{Image: "busybox", Trajectory: "a b"},
		{Image: "busybox", Trajectory: "a..b"},
		{Image: "busybox", Resume: true},
		{Image: "busybox", Checkpoint: "every-step"},
		{Image: "busybox", Trajectory: "t", Checkpoint: "0"},
		{Image: "busybox", Trajectory: "t", Checkpoint: "always"},
		{Trajectory: "t"},
	}
	for _, r := range bad {
		if err := Normalize(&r); err == nil || err.Code != api.CodeInvalid {
			t.Errorf("%+v: %v, want invalid", r, err)
		}
	}
	if CheckpointEvery("every-step") != 1 || CheckpointEvery("none") != 0 || CheckpointEvery("25") != 25 {
		t.Error("CheckpointEvery")
	}
}
