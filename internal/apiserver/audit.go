package apiserver

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge"
)

// getAudit answers GET /v1/sandboxes/{id}/audit?step=&kind=: what the
// sandbox's processes did, from its node's kernel telemetry. The sandbox's
// owner rule is the edge's, as for every sandbox route (callEdge sends the
// caller's project scope; a sandbox outside it is a 404).
func (s *Server) getAudit(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	q := r.URL.Query()
	req := &edge.AuditRequest{ID: id, Kind: q.Get("kind")}
	req.Summary, _ = strconv.ParseBool(q.Get("summary"))
	if v := q.Get("step"); v != "" {
		step, err := strconv.ParseInt(v, 10, 64)
		if err != nil || step < 0 {
			return &api.Error{Code: api.CodeBadRequest, Message: fmt.Sprintf("step %q is not a step number (0 = between steps)", truncate(v))}
		}
		req.Step, req.HasStep = step, true
	}
	var out api.AuditList
	if err := s.callEdge(r.Context(), id, edge.OpAudit, req, &out, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &out)
	return nil
}

// attachAudit gives each step the audit records of its step from sandbox
// id (the trajectory's sandbox now; nothing once it is gone).
func (s *Server) attachAudit(ctx context.Context, id string, steps []api.TrajectoryStep) {
	var out api.AuditList
	if err := s.callEdge(ctx, id, edge.OpAudit, &edge.AuditRequest{ID: id}, &out, nil); err != nil {
		s.log.Debug("trajectory audit", "sandbox", id, "err", err)
		return
	}
	at := make(map[int64]int, len(steps))
	for i := range steps {
		at[steps[i].Step] = i
	}
	for _, rec := range out.Records {
		if i, ok := at[rec.Step]; ok && rec.Step > 0 {
			steps[i].Audit = append(steps[i].Audit, rec)
		}
	}
}
