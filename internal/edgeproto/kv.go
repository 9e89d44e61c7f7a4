package edgeproto

import (
	"time"

	"github.com/warrenhq/warren/api"
)

// TrajectoryRecord is a trajectory's entry in the KV bucket: where it
// lives and its last checkpoint.
type TrajectoryRecord struct {
	Name string `json:"name"`
	// Project owns the trajectory: names are unique per project, and only
	// a token that sees the project (iam.Principal.Sees) reads or uses it.
	Project        string                   `json:"project,omitempty"`
	Sandbox        string                   `json:"sandbox"`
	Spec           api.CreateSandboxRequest `json:"spec"`
	CheckpointSnap string                   `json:"checkpoint_snapshot,omitempty"`
	CheckpointStep int64                    `json:"checkpoint_step,omitempty"`
	// Parent, ParentStep: a branch shares its parent's log up to ParentStep.
	Parent     string    `json:"parent,omitempty"`
	ParentStep int64     `json:"parent_step,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	// ExpiresAt: the apiservers' sweeper deletes the trajectory (its log,
	// inputs and record) after this, once no live sandbox records it
	// (CreateSandboxRequest.TrajectoryTTL). Zero = never.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// TrajKey is where the record and the log of project's trajectory name
// are stored: names are chosen by clients and unique per project, so two
// projects may both have a "run-42". The root project's keys are the bare
// names (as before projects owned trajectories); "|" is in no project id
// and no trajectory name, so keys never collide.
func TrajKey(project, name string) string {
	if project == "" {
		return name
	}
	return project + "|" + name
}
