package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// Paging of GET /v1/trajectories/{name}.
const (
	defaultTrajPage = 500
	maxTrajPage     = 5000
)

func (s *Server) trajectoryRecord(ctx context.Context, p *iam.Principal, project, name string) (*edgeproto.TrajectoryRecord, error) {
	rec, _, err := s.trajectoryRecordRev(ctx, p, project, name)
	return rec, err
}

// trajectoryRecordRev reads trajectory name of project ("" = the caller's
// project): names are unique per project. A trajectory the caller may not
// see is answered as missing.
func (s *Server) trajectoryRecordRev(ctx context.Context, p *iam.Principal, project, name string) (*edgeproto.TrajectoryRecord, uint64, error) {
	if !sandboxspec.ValidTrajectory(name) {
		return nil, 0, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("trajectory %q is malformed", truncate(name))}
	}
	if project == "" {
		project = p.Project
	}
	if project != "" && !sandboxspec.ValidProject(project) {
		return nil, 0, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("project %q is not a project id", truncate(project))}
	}
	missing := &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("trajectory %q not found", truncate(name))}
	if err := own(p, iam.KindTrajectory, project, missing); err != nil {
		return nil, 0, err
	}
	var rec edgeproto.TrajectoryRecord
	found, rev, err := s.trajMeta.Get(ctx, edgeproto.TrajKey(project, name), &rec)
	if err == nil && !found && project != "" {
		// Recorded before trajectories had owners: under the bare name,
		// the project only in its spec.
		var old edgeproto.TrajectoryRecord
		var orev uint64
		if found, orev, err = s.trajMeta.Get(ctx, name, &old); found && (old.Project != "" || old.Spec.Project != project) {
			found = false
		}
		rec, rev = old, orev
	}
	if err != nil {
		return nil, 0, &api.Error{Code: api.CodeUnavailable, Message: err.Error()}
	}
	if !found {
		return nil, 0, missing
	}
	owner := rec.Project
	if owner == "" {
		owner = rec.Spec.Project // recorded before trajectories had owners
	}
	if err := own(p, iam.KindTrajectory, owner, missing); err != nil {
		return nil, 0, err
	}
	return &rec, rev, nil
}

// trajKey is where rec's log is stored.
func trajKey(rec *edgeproto.TrajectoryRecord) string { return edgeproto.TrajKey(rec.Project, rec.Name) }

// resumeSandbox re-attaches a client to its trajectory's sandbox.
func (s *Server) resumeTrajectory(w http.ResponseWriter, r *http.Request, req *api.CreateSandboxRequest) error {
	if req.Image != "" || len(req.Layers) > 0 || req.Snapshot != "" {
		return &api.Error{Code: api.CodeInvalid, Message: "resume takes the sandbox of the trajectory; image, layers and snapshot must be absent"}
	}
	ctx := r.Context()
	rec, rev, err := s.trajectoryRecordRev(ctx, principal(r), req.Project, req.Trajectory)
	if err != nil {
		return err
	}
	// A fast-forward this replica serves for the sandbox goes back to the
	// edge first: it decides whether a new resume may start.
	if err := s.endFastForward(ctx, rec.Sandbox); err != nil {
		s.log.Warn("hand a fast-forward back", "sandbox", rec.Sandbox, "err", err)
	}
	var sb api.Sandbox
	delegate := ""
	if !req.Branch && s.cfg.Watcher.APIServers() <= 1 {
		delegate = s.ff.id // serve the fast-forward here (see fastforward.go)
	}
	err = s.callEdge(ctx, rec.Sandbox, edgeproto.OpTrajResume, &edgeproto.ResumeRequest{ID: rec.Sandbox, Trajectory: req.Trajectory, Branch: req.Branch, Delegate: delegate}, &sb, nil)
	if err != nil {
		var ae *api.Error
		var le *lostError
		switch {
		case errors.As(err, &le):
			// Its node died (kill -9, power loss): rebuild on another.
			s.log.Info("trajectory sandbox lost with its node; rebuilding", "trajectory", req.Trajectory, "sandbox", rec.Sandbox, "node", le.node, "checkpoint", rec.CheckpointSnap)
			return s.rebuild(w, r, rec, rev, req.Branch)
		case errors.As(err, &ae) && ae.Code == api.CodeUnavailable && s.nodeDown(rec.Sandbox):
			s.log.Info("trajectory sandbox's node is down; rebuilding", "trajectory", req.Trajectory, "sandbox", rec.Sandbox, "checkpoint", rec.CheckpointSnap)
			return s.rebuild(w, r, rec, rev, req.Branch)
		case errors.As(err, &ae) && (ae.Code == api.CodeNotFound || (ae.Code == api.CodeConflict && !strings.Contains(ae.Message, "resumed by another"))):
			s.log.Info("trajectory sandbox lost; rebuilding", "trajectory", req.Trajectory, "sandbox", rec.Sandbox, "checkpoint", rec.CheckpointSnap, "reason", ae.Message)
			return s.rebuild(w, r, rec, rev, req.Branch)
		}
		return err
	}
	// The edge reset the trajectory's replay: a fast-forward held here
	// before is over.
	if old := s.ff.get(rec.Sandbox); old != nil {
		old.mu.Lock()
		old.done = true
		old.mu.Unlock()
		s.ff.drop(old)
	}
	if delegate != "" && sb.Replay > 0 {
		s.startFastForward(ctx, rec.Sandbox, sb.Project, trajKey(rec), sb.Replay)
	}
	writeJSON(w, http.StatusOK, &sb)
	return nil
}

// nodeDown reports whether the node of sandbox id is known and marked
// down by the watcher (missed its heartbeats), not merely slow to answer.
func (s *Server) nodeDown(id string) bool {
	node := edgeproto.NodeOf(id)
	if node == "" {
		return false
	}
	known, up := s.cfg.Watcher.Known(node)
	return known && !up
}

// rebuild makes a new sandbox for a trajectory whose sandbox was lost: from
// its last checkpoint snapshot, or from its original state without one.
// The edge then serves the logged steps up to that state from the log and
// runs the later ones again as the client re-issues them.
func (s *Server) rebuild(w http.ResponseWriter, r *http.Request, rec *edgeproto.TrajectoryRecord, rev uint64, branch bool) error {
	ctx := r.Context()
	spec := rec.Spec
	spec.Resume, spec.Branch = true, branch
	var from int64
	if rec.CheckpointSnap != "" {
		spec.Snapshot, from = rec.CheckpointSnap, rec.CheckpointStep
	}
	if spec.Snapshot != "" {
		spec.Image, spec.Layers = "", nil
	}
	limits := s.limitsOf(spec.Project)
	node, err := s.placer.Pick(&spec, nil, limits)
	if err != nil {
		return placeError(err, "the trajectory's rebuilt sandbox")
	}
	id := edgeproto.NewSandboxID(node)
	next := *rec
	next.Sandbox = id
	if err := s.trajMeta.Update(ctx, edgeproto.TrajKey(rec.Project, rec.Name), &next, rev); err != nil {
		s.placer.Release(node, &spec, limits)
		if errors.Is(err, bus.ErrExists) {
			return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("trajectory %q is being resumed by another client", rec.Name)}
		}
		return &api.Error{Code: api.CodeUnavailable, Message: err.Error()}
	}
	var sb api.Sandbox
	if err := s.callEdge(ctx, id, edgeproto.OpCreate, &edgeproto.CreateRequest{ID: id, Spec: spec, FromStep: from}, &sb, nil); err != nil {
		s.placer.Release(node, &spec, limits)
		return err
	}
	writeJSON(w, http.StatusCreated, &sb)
	return nil
}

// replayTrajectory re-executes a trajectory's log in a fresh sandbox from
// its original state (on a node the placer picks) and reports the steps
// whose outcome differs.
func (s *Server) replayTrajectory(w http.ResponseWriter, r *http.Request) error {
	var req api.ReplayRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if _, err := edgeproto.NewReplayFilter(req.Masks, req.Ignore); err != nil {
		return err
	}
	ctx := r.Context()
	rec, err := s.trajectoryRecord(ctx, principal(r), req.Project, req.Trajectory)
	if err != nil {
		return err
	}
	spec := rec.Spec
	spec.Trajectory, spec.Resume, spec.Branch, spec.Checkpoint = "", false, false, ""
	spec.Project = rec.Project
	if spec.Project == "" {
		spec.Project = rec.Spec.Project
	}
	limits := s.limitsOf(spec.Project)
	node, err := s.placer.Pick(&spec, nil, limits)
	if err != nil {
		return placeError(err, "the replay's sandbox")
	}
	id := edgeproto.NewSandboxID(node)
	var out api.TrajectoryReplay
	if err := s.callEdge(ctx, id, edgeproto.OpTrajReplay, &edgeproto.ReplayRequest{ID: id, Trajectory: rec.Name, Project: rec.Project, Spec: spec, Keep: req.Keep, Masks: req.Masks, Ignore: req.Ignore}, &out, nil); err != nil {
		s.placer.Release(node, &spec, limits)
		return err
	}
	writeJSON(w, http.StatusOK, &out)
	return nil
}

// listTrajectories lists the trajectories the caller sees (its project's
// and those below it), oldest first.
func (s *Server) listTrajectories(w http.ResponseWriter, r *http.Request) error {
	p := principal(r)
	out := api.TrajectoryList{Trajectories: []api.Trajectory{}}
	err := s.trajMeta.Each(r.Context(), func(_ string, raw []byte) error {
		var rec edgeproto.TrajectoryRecord
		if json.Unmarshal(raw, &rec) != nil {
			return nil
		}
		if !p.Sees(iam.KindTrajectory, trajOwner(&rec)) {
			return nil
		}
		t := trajectoryOf(&rec)
		if n, err := s.storage.TrajectoryBytes(r.Context(), trajKey(&rec)); err == nil {
			t.Bytes = n
		}
		out.Trajectories = append(out.Trajectories, t)
		return nil
	})
	if err != nil {
		return storeUnavailable("the trajectory store", err)
	}
	sort.Slice(out.Trajectories, func(i, j int) bool {
		return out.Trajectories[i].CreatedAt.Before(out.Trajectories[j].CreatedAt)
	})
	writeJSON(w, http.StatusOK, &out)
	return nil
}

// trajOwner is the project that owns rec.
func trajOwner(rec *edgeproto.TrajectoryRecord) string {
	if rec.Project == "" {
		return rec.Spec.Project // recorded before trajectories had owners
	}
	return rec.Project
}

// trajectoryOf is the wire form of a trajectory's record.
func trajectoryOf(rec *edgeproto.TrajectoryRecord) api.Trajectory {
	return api.Trajectory{
		Name: rec.Name, Project: trajOwner(rec), Sandbox: rec.Sandbox, Parent: rec.Parent,
		CheckpointSnap: rec.CheckpointSnap, CreatedAt: rec.CreatedAt, ExpiresAt: rec.ExpiresAt,
	}
}

func (s *Server) getTrajectory(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	ctx := r.Context()
	q := r.URL.Query()
	summary := q.Get("audit") == "summary"
	if base, ok := strings.CutSuffix(name, auditSummarySuffix); ok && sandboxspec.ValidTrajectory(base) {
		// GET /v1/trajectories/{name}/audit/summary, unless a trajectory
		// has that whole name.
		if _, err := s.trajectoryRecord(ctx, principal(r), q.Get("project"), name); err != nil {
			name, summary = base, true
		}
	}
	rec, err := s.trajectoryRecord(ctx, principal(r), q.Get("project"), name)
	if err != nil {
		return err
	}
	if summary {
		return s.trajectoryAuditSummary(w, r, rec)
	}
	after, limit := int64(0), defaultTrajPage
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return &api.Error{Code: api.CodeBadRequest, Message: "after must be a step number"}
		}
		after = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxTrajPage {
			return &api.Error{Code: api.CodeBadRequest, Message: fmt.Sprintf("limit must be between 1 and %d", maxTrajPage)}
		}
		limit = n
	}
	path := q.Get("path")
	page := api.TrajectoryPage{Trajectory: name, Sandbox: rec.Sandbox, Steps: []api.TrajectoryStep{}}
	// Steps are numbered from 1, so step after+1 is about entry after (a
	// failed append can leave a gap; read a little earlier).
	skip := max(int(after)-64, 0)
	want := limit + 1 + int(after) - skip
	if path != "" {
		want = 0
	}
	raw, err := s.tlog.Read(ctx, trajKey(rec), skip, want)
	if err != nil {
		return &api.Error{Code: api.CodeUnavailable, Message: err.Error()}
	}
	for _, b := range raw {
		var st api.TrajectoryStep
		if err := json.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("trajectory %s: corrupt entry: %w", name, err)
		}
		if st.Step <= after {
			continue
		}
		if path != "" && !touches(&st, path) {
			continue
		}
		if len(page.Steps) == limit {
			page.Next = page.Steps[limit-1].Step
			break
		}
		page.Steps = append(page.Steps, st)
	}
	if audit, _ := strconv.ParseBool(q.Get("audit")); audit && len(page.Steps) > 0 {
		s.attachAudit(r.Context(), rec, page.Steps)
	}
	writeJSON(w, http.StatusOK, &page)
	return nil
}

// auditSummarySuffix ends the path of a trajectory's audit summary.
const auditSummarySuffix = "/audit/summary"

// touches reports whether a file operation changed p (or something under it).
func touches(st *api.TrajectoryStep, p string) bool {
	under := func(x string) bool {
		return x != "" && (x == p || strings.HasPrefix(x, strings.TrimSuffix(p, "/")+"/"))
	}
	return under(st.Path) || under(st.To)
}
