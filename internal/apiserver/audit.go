package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// getAudit answers GET /v1/sandboxes/{id}/audit?step=&kind=: what the
// sandbox's processes did, from its node's kernel telemetry. The sandbox's
// owner rule is the edge's, as for every sandbox route (callEdge sends the
// caller's project scope; a sandbox outside it is a 404).
func (s *Server) getAudit(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	q := r.URL.Query()
	req := &edgeproto.AuditRequest{ID: id, Kind: q.Get("kind")}
	req.Summary, _ = strconv.ParseBool(q.Get("summary"))
	if v := q.Get("after"); v != "" {
		after, err := strconv.ParseInt(v, 10, 64)
		if err != nil || after < 0 {
			return &api.Error{Code: api.CodeBadRequest, Message: fmt.Sprintf("after %q is not a record's seq", truncate(v))}
		}
		req.After = after
	}
	follow := false
	switch q.Get("follow") {
	case "", "0", "false":
	case "1", "true":
		follow = true
	default:
		return &api.Error{Code: api.CodeBadRequest, Message: "follow must be 1 or 0"}
	}
	if v := q.Get("step"); v != "" {
		step, err := strconv.ParseInt(v, 10, 64)
		if err != nil || step < 0 {
			return &api.Error{Code: api.CodeBadRequest, Message: fmt.Sprintf("step %q is not a step number (0 = between steps)", truncate(v))}
		}
		req.Step, req.HasStep = step, true
	}
	if follow && req.Summary {
		return &api.Error{Code: api.CodeBadRequest, Message: "follow streams records: it does not go with summary"}
	}
	var out api.AuditList
	if err := s.callEdge(r.Context(), id, edgeproto.OpAudit, req, &out, nil); err != nil {
		return err
	}
	if follow {
		return s.followAudit(w, r, req, &out)
	}
	writeJSON(w, http.StatusOK, &out)
	return nil
}

// auditPoll is how often a followed audit asks the sandbox's node for new
// records.
var auditPoll = 250 * time.Millisecond

// followAudit streams a sandbox's records as NDJSON, starting with first
// (the answer already read), polling its node until the sandbox stopped
// and its last records were sent, or the client left. Empty lines are
// keepalives; a failure after the stream began ends it with an error line.
func (s *Server) followAudit(w http.ResponseWriter, r *http.Request, req *edgeproto.AuditRequest, first *api.AuditList) error {
	fl, _ := w.(http.Flusher)
	h := w.Header()
	h.Set("Content-Type", "application/x-ndjson")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	ctx := r.Context()
	write := func(b []byte) error {
		if _, err := w.Write(b); err != nil {
			return err
		}
		if fl != nil {
			fl.Flush()
		}
		return nil
	}
	if err := write(nil); err != nil {
		return nil
	}
	out, lastLine, ended := first, time.Now(), false
	for {
		for i := range out.Records {
			b, err := json.Marshal(&out.Records[i])
			if err != nil {
				return nil
			}
			if err := write(append(b, '\n')); err != nil {
				return nil // the client left
			}
			req.After, lastLine = out.Records[i].Seq, time.Now()
		}
		if ended {
			return nil
		}
		// A stopped sandbox's last records may still be on their way
		// from the kernel: one more round, then the end.
		ended = !out.Live
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(auditPoll):
		}
		if time.Since(lastLine) >= eventKeepalive {
			if err := write([]byte("\n")); err != nil {
				return nil
			}
			lastLine = time.Now()
		}
		var next api.AuditList
		if err := s.callEdge(ctx, req.ID, edgeproto.OpAudit, req, &next, nil); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			b, _ := json.Marshal(api.ErrorBody{Error: *s.toAPIError(err)})
			_ = write(append(b, '\n'))
			return nil
		}
		out = &next
	}
}

// trajectoryAudit collects trajectory rec's audit by step: the entries
// persisted with its log (they outlive its sandboxes), then what its
// sandbox now holds for steps not persisted yet. Step 0 gathers the
// records between steps.
func (s *Server) trajectoryAudit(ctx context.Context, rec *edgeproto.TrajectoryRecord) (map[int64][]api.AuditRecord, int64) {
	by := map[int64][]api.AuditRecord{}
	var dropped int64
	saved := map[int64]bool{}
	raw, err := s.tlog.ReadAudit(ctx, trajKey(rec))
	if err != nil {
		s.log.Debug("trajectory audit: persisted", "trajectory", rec.Name, "err", err)
	}
	seen := map[int64]map[int64]bool{} // step -> seqs of the persisting sandbox
	for _, b := range raw {
		var ent edgeproto.AuditEntry
		if json.Unmarshal(b, &ent) != nil {
			continue
		}
		saved[ent.Step] = true
		dropped += ent.Dropped
		for _, r := range ent.Records {
			by[r.Step] = append(by[r.Step], r)
			if seen[r.Step] == nil {
				seen[r.Step] = map[int64]bool{}
			}
			seen[r.Step][r.Seq] = true
		}
	}
	var live api.AuditList
	if err := s.callEdge(ctx, rec.Sandbox, edgeproto.OpAudit, &edgeproto.AuditRequest{ID: rec.Sandbox}, &live, nil); err != nil {
		s.log.Debug("trajectory audit: live", "sandbox", rec.Sandbox, "err", err)
		return by, dropped
	}
	dropped += live.Dropped
	for _, r := range live.Records {
		if (r.Step != 0 && saved[r.Step]) || seen[r.Step][r.Seq] {
			continue
		}
		by[r.Step] = append(by[r.Step], r)
	}
	return by, dropped
}

// attachAudit gives each step its audit records (trajectoryAudit).
func (s *Server) attachAudit(ctx context.Context, rec *edgeproto.TrajectoryRecord, steps []api.TrajectoryStep) {
	by, _ := s.trajectoryAudit(ctx, rec)
	for i := range steps {
		if st := steps[i].Step; st > 0 {
			steps[i].Audit = append(steps[i].Audit, by[st]...)
		}
	}
}

// trajectoryAuditSummary answers GET /v1/trajectories/{name}/audit/summary
// (and ?audit=summary): per step, how many records of each kind, and how
// many a policy rule matched, so that a grader can flag a rollout in one
// call.
func (s *Server) trajectoryAuditSummary(w http.ResponseWriter, r *http.Request, rec *edgeproto.TrajectoryRecord) error {
	by, dropped := s.trajectoryAudit(r.Context(), rec)
	var all []api.AuditRecord
	for _, recs := range by {
		all = append(all, recs...)
	}
	writeJSON(w, http.StatusOK, &api.AuditList{Records: []api.AuditRecord{}, Dropped: dropped, Summary: edgeproto.SummarizeAudit(all)})
	return nil
}
