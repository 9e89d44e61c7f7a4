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

// attachAudit gives each step the audit records of its step from sandbox
// id (the trajectory's sandbox now; nothing once it is gone).
func (s *Server) attachAudit(ctx context.Context, id string, steps []api.TrajectoryStep) {
	var out api.AuditList
	if err := s.callEdge(ctx, id, edgeproto.OpAudit, &edgeproto.AuditRequest{ID: id}, &out, nil); err != nil {
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
