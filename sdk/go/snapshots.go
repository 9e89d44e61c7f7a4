package warren

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/warrenhq/warren/api"
)

// Snapshot packs the sandbox's filesystem (only the filesystem: no process
// memory) into a snapshot that Create{Snapshot: id} restores.
func (c *Client) Snapshot(ctx context.Context, id string, req api.CreateSnapshotRequest) (*api.Snapshot, error) {
	var snap api.Snapshot
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/sandboxes/" + esc(id) + "/snapshots", json: req}, &snap); err != nil {
		return nil, err
	}
	return &snap, nil
}

// GetSnapshot returns one snapshot record.
func (c *Client) GetSnapshot(ctx context.Context, snapID string) (*api.Snapshot, error) {
	var snap api.Snapshot
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/snapshots/" + esc(snapID), retry: true}, &snap); err != nil {
		return nil, err
	}
	return &snap, nil
}

// DeleteSnapshot removes a snapshot and its layer. A snapshot still in use
// (a live sandbox restored from it, a later snapshot chained on it, a
// trajectory's start or latest checkpoint) is a 409 conflict.
func (c *Client) DeleteSnapshot(ctx context.Context, snapID string) error {
	_, err := c.doJSON(ctx, &request{method: http.MethodDelete, path: "/v1/snapshots/" + esc(snapID)}, nil)
	return err
}

// ListSnapshots lists the snapshots of the token's project and the
// projects below it (of one sandbox when sandbox is not ""), newest first.
func (c *Client) ListSnapshots(ctx context.Context, sandbox string) ([]api.Snapshot, error) {
	q := url.Values{}
	if sandbox != "" {
		q.Set("sandbox", sandbox)
	}
	var l api.SnapshotList
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/snapshots", query: q, retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Snapshots, nil
}

// ListTrajectories lists the trajectories of the token's project and the
// projects below it, with the bytes each stores and when it expires.
func (c *Client) ListTrajectories(ctx context.Context) ([]api.Trajectory, error) {
	var l api.TrajectoryList
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/trajectories", retry: true}, &l); err != nil {
		return nil, err
	}
	return l.Trajectories, nil
}

// DeleteTrajectory removes a trajectory of project ("" = the token's): its
// log, its inputs and its record, freeing their bytes from the project's
// storage quota. A trajectory a live sandbox still records, or that a
// branch shares its log with, is a 409 conflict.
func (c *Client) DeleteTrajectory(ctx context.Context, project, name string) error {
	q := url.Values{}
	if project != "" {
		q.Set("project", project)
	}
	_, err := c.doJSON(ctx, &request{method: http.MethodDelete, path: "/v1/trajectories/" + escPath(name), query: q}, nil)
	return err
}

// Fork makes count new sandboxes from one snapshot of the sandbox's current
// filesystem; the source keeps running.
func (c *Client) Fork(ctx context.Context, id string, count int) (*api.ForkResult, error) {
	var out api.ForkResult
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/sandboxes/" + esc(id) + "/fork", json: api.ForkRequest{Count: count}}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Trajectory returns one page of a trajectory's log: up to limit steps
// (0 = the server's default) after step after.
func (c *Client) Trajectory(ctx context.Context, name string, after int64, limit int) (*api.TrajectoryPage, error) {
	q := url.Values{}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var p api.TrajectoryPage
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/trajectories/" + escPath(name), query: q, retry: true}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// TrajectoryOf is Trajectory for a trajectory of project: names are
// unique per project, and a token reaches the trajectories of its own
// project (the default) and of the projects below it.
func (c *Client) TrajectoryOf(ctx context.Context, project, name string, after int64, limit int) (*api.TrajectoryPage, error) {
	q := url.Values{}
	if project != "" {
		q.Set("project", project)
	}
	if after > 0 {
		q.Set("after", strconv.FormatInt(after, 10))
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	var p api.TrajectoryPage
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/trajectories/" + escPath(name), query: q, retry: true}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// ReplayTrajectoryOf is ReplayTrajectory for a trajectory of project.
func (c *Client) ReplayTrajectoryOf(ctx context.Context, project, trajectory string, keep bool) (*api.TrajectoryReplay, error) {
	var out api.TrajectoryReplay
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/trajectories:replay", json: api.ReplayRequest{Trajectory: trajectory, Project: project, Keep: keep}}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// TrajectoryFiles lists the steps whose file operations changed path (or
// something under it): provenance. Commands are not analysed.
func (c *Client) TrajectoryFiles(ctx context.Context, name, path string) (*api.TrajectoryPage, error) {
	q := url.Values{"path": {path}, "limit": {"5000"}}
	var p api.TrajectoryPage
	if _, err := c.doJSON(ctx, &request{method: http.MethodGet, path: "/v1/trajectories/" + escPath(name), query: q, retry: true}, &p); err != nil {
		return nil, err
	}
	return &p, nil
}

// TrajectoryAll reads every step of a trajectory, page by page.
func (c *Client) TrajectoryAll(ctx context.Context, name string) ([]api.TrajectoryStep, error) {
	return c.TrajectoryAllOf(ctx, "", name)
}

// TrajectoryAllOf is TrajectoryAll for a trajectory of project ("" = the
// token's).
func (c *Client) TrajectoryAllOf(ctx context.Context, project, name string) ([]api.TrajectoryStep, error) {
	var all []api.TrajectoryStep
	var after int64
	for {
		p, err := c.TrajectoryOf(ctx, project, name, after, 0)
		if err != nil {
			return nil, err
		}
		all = append(all, p.Steps...)
		if p.Next == 0 {
			return all, nil
		}
		after = p.Next
	}
}

// ResumeTrajectory re-attaches to a trajectory: re-issued operations that equal the
// logged ones come back cached (Replayed) until the end of the log.
func (c *Client) ResumeTrajectory(ctx context.Context, trajectory string, branch bool) (*api.Sandbox, error) {
	return c.CreateWithKey(ctx, api.CreateSandboxRequest{Trajectory: trajectory, Resume: true, Branch: branch}, "")
}

// ReplayTrajectory re-executes a trajectory's log in a fresh sandbox from its
// original state and reports every step whose outcome differs from the log
// (a determinism check). keep leaves the replay's sandbox running.
func (c *Client) ReplayTrajectory(ctx context.Context, trajectory string, keep bool) (*api.TrajectoryReplay, error) {
	return c.ReplayTrajectoryWith(ctx, api.ReplayRequest{Trajectory: trajectory, Keep: keep})
}

// ReplayTrajectoryWith is ReplayTrajectory with every option: masks
// (regular expressions whose matches in stdout and stderr are not
// compared) and outcome fields to ignore.
func (c *Client) ReplayTrajectoryWith(ctx context.Context, req api.ReplayRequest) (*api.TrajectoryReplay, error) {
	var out api.TrajectoryReplay
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/trajectories:replay", json: req}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// escPath escapes each segment of a slash-separated name.
func escPath(name string) string {
	parts := strings.Split(name, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return strings.Join(parts, "/")
}

// ForkMemory makes count new sandboxes from one memory snapshot of a VM
// sandbox (tiers api.MemoryForkTiers): they continue its running
// processes, each with its own hostname, machine-id and entropy.
func (c *Client) ForkMemory(ctx context.Context, id string, count int) (*api.ForkResult, error) {
	var out api.ForkResult
	if _, err := c.doJSON(ctx, &request{method: http.MethodPost, path: "/v1/sandboxes/" + esc(id) + "/fork", json: api.ForkRequest{Count: count, Memory: true}}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}
