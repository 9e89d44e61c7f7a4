package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/iam"
)

// Bounded storage. What a project stores (its trajectories' logs and
// inputs, its snapshots, its layers) is counted in the storage account
// (bus.Storage) and bounded by its storage_bytes quota and its
// ancestors'; the apiservers copy those quotas from IAM into the account,
// where the edges, which may not read IAM, find them. Trajectories go by
// DELETE /v1/trajectories/{name} or, with a trajectory_ttl, by the
// sweeper; the streams' own byte limits are the backstop (bus).

// DefaultSweepEvery is how often the sweeper deletes expired trajectories
// and copies the storage quotas into the account.
const DefaultSweepEvery = 30 * time.Second

// syncStorageLimit copies p's storage quota into the account.
func (s *Server) syncStorageLimit(ctx context.Context, p *api.Project) {
	if err := s.storage.SetLimit(ctx, p.ID, p.Quota.StorageBytes); err != nil {
		s.log.Warn("copy a storage quota into the account", "project", p.ID, "err", err)
	}
}

// charge adds n stored bytes (negative: freed) to project's account.
func (s *Server) charge(ctx context.Context, project string, n int64) {
	if err := s.storage.Add(context.WithoutCancel(ctx), project, n); err != nil {
		s.log.Warn("charge stored bytes", "project", project, "bytes", n, "err", err)
	}
}

// checkStorage refuses (413) n more bytes for project beyond a storage
// quota.
func (s *Server) checkStorage(ctx context.Context, project string, n int64) error {
	err := s.storage.Check(ctx, project, n)
	var se *bus.StorageError
	if errors.As(err, &se) {
		return bus.QuotaError(err)
	}
	if err != nil {
		s.log.Warn("read the storage account", "project", project, "err", err)
	}
	return nil
}

// sweep runs until ctx ends: every interval it copies the quotas into the
// account and deletes the trajectories whose ttl has passed.
func (s *Server) sweep(ctx context.Context, every time.Duration) {
	defer close(s.sweepDone)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.sweepOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) sweepOnce(ctx context.Context) {
	root := &iam.Principal{Role: api.RoleAdmin}
	for _, p := range s.cfg.IAM.Projects(root) {
		if ctx.Err() != nil {
			return
		}
		s.syncStorageLimit(ctx, &p)
	}
	now := time.Now()
	var expired []edgeproto.TrajectoryRecord
	err := s.trajMeta.Each(ctx, func(_ string, raw []byte) error {
		var rec edgeproto.TrajectoryRecord
		if json.Unmarshal(raw, &rec) == nil && !rec.ExpiresAt.IsZero() && now.After(rec.ExpiresAt) {
			expired = append(expired, rec)
		}
		return nil
	})
	if err != nil {
		s.log.Warn("sweep trajectories", "err", err)
		return
	}
	// Branches before the trajectories they branched from.
	for pass := 0; pass < 4 && len(expired) > 0; pass++ {
		var left []edgeproto.TrajectoryRecord
		for i := range expired {
			rec := &expired[i]
			// The sweeper acts in the trajectory's project, as its admin.
			pctx := context.WithValue(ctx, principalKey{}, &iam.Principal{Name: "warren-sweeper", Role: api.RoleAdmin, Project: trajOwner(rec)})
			if _, err := s.removeTrajectory(pctx, rec); err != nil {
				s.log.Debug("expired trajectory kept", "trajectory", rec.Name, "project", trajOwner(rec), "why", err)
				left = append(left, *rec)
				continue
			}
			s.log.Info("trajectory expired and deleted", "trajectory", rec.Name, "project", trajOwner(rec))
		}
		if len(left) == len(expired) {
			break // nothing went: a live sandbox or a branch keeps them
		}
		expired = left
	}
}

// deleteTrajectory removes a trajectory: its log, its inputs, its record.
func (s *Server) deleteTrajectory(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	p := principal(r)
	name := r.PathValue("name")
	rec, err := s.trajectoryRecord(ctx, p, r.URL.Query().Get("project"), name)
	if err != nil {
		return err
	}
	missing := &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("trajectory %q not found", truncate(name))}
	if err := ownChange(p, iam.KindTrajectory, trajOwner(rec), missing); err != nil {
		return err
	}
	if _, err := s.removeTrajectory(ctx, rec); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// removeTrajectory deletes rec's log, the inputs it kept and its record,
// and frees their bytes from its project's account; it returns them. A
// trajectory is in use (409) while a live sandbox records it or a branch
// shares its log.
func (s *Server) removeTrajectory(ctx context.Context, rec *edgeproto.TrajectoryRecord) (int64, error) {
	key := trajKey(rec)
	owner := trajOwner(rec)
	inUse := func(format string, a ...any) error {
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("trajectory %q is in use: ", rec.Name) + fmt.Sprintf(format, a...)}
	}
	err := s.trajMeta.Each(ctx, func(_ string, raw []byte) error {
		var o edgeproto.TrajectoryRecord
		if json.Unmarshal(raw, &o) == nil && o.Parent == rec.Name && trajOwner(&o) == owner && o.Name != rec.Name {
			return &errInUse{fmt.Sprintf("trajectory %q branches from it (delete that first)", o.Name)}
		}
		return nil
	})
	var iu *errInUse
	if errors.As(err, &iu) {
		return 0, inUse("%s", iu.why)
	}
	if err != nil {
		return 0, storeUnavailable("the trajectory store", err)
	}
	if rec.Sandbox != "" {
		var sb api.Sandbox
		err := s.callEdge(ctx, rec.Sandbox, edgeproto.OpGet, &edgeproto.IDRequest{ID: rec.Sandbox}, &sb, nil)
		var ae *api.Error
		switch {
		case err == nil && sb.State != api.StateStopped && sb.State != api.StateFailed:
			return 0, inUse("sandbox %s records it (delete the sandbox first)", rec.Sandbox)
		case err == nil, errors.As(err, new(*lostError)), errors.As(err, &ae) && ae.Code == api.CodeNotFound:
		case s.nodeDown(rec.Sandbox):
			// Its node is gone: nothing records it any more.
		default:
			return 0, err
		}
	}
	steps, err := s.tlog.Read(ctx, key, 0, 0)
	if err != nil {
		return 0, storeUnavailable("the trajectory log", err)
	}
	hashes := map[string]bool{}
	for _, raw := range steps {
		var st api.TrajectoryStep
		if json.Unmarshal(raw, &st) != nil {
			continue
		}
		for _, h := range []string{st.StdinHash, st.DataHash} {
			if h != "" {
				hashes[h] = true
			}
		}
	}
	for h := range hashes {
		if _, err := s.inputs.Delete(ctx, bus.InputKey(key, h)); err != nil {
			return 0, storeUnavailable("the trajectory inputs", err)
		}
	}
	if err := s.tlog.Purge(ctx, key); err != nil {
		return 0, storeUnavailable("the trajectory log", err)
	}
	if err := s.trajMeta.Delete(ctx, key); err != nil {
		return 0, storeUnavailable("the trajectory store", err)
	}
	n, err := s.storage.TrajectoryBytes(ctx, key)
	if err != nil {
		s.log.Warn("read a trajectory's bytes", "trajectory", rec.Name, "err", err)
	}
	s.charge(ctx, owner, -n)
	if err := s.storage.ForgetTrajectory(ctx, key); err != nil {
		s.log.Warn("forget a trajectory's bytes", "trajectory", rec.Name, "err", err)
	}
	return n, nil
}

// Close stops the sweeper.
func (s *Server) Close() {
	if s.sweepStop != nil {
		s.sweepStop()
		<-s.sweepDone
	}
}
