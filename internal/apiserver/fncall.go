package apiserver

import (
	"errors"
	"net/http"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/placement"
)

// fncall runs one stateless task on a node placed like a sandbox of the
// task's shape; a node that is full or down is skipped.
func (s *Server) fncall(w http.ResponseWriter, r *http.Request) error {
	var req api.FnCallRequest
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	spec, aerr := edgeproto.NormalizeFnCall(&req)
	if aerr != nil {
		return aerr
	}
	exclude := map[string]bool{}
	var lastErr error
	for try := 0; try < maxPlacementTries; try++ {
		node, err := s.placer.PickTransient(&spec, exclude)
		if err != nil {
			if lastErr != nil {
				return lastErr
			}
			if errors.Is(err, placement.ErrNoNode) {
				return noNode(err, "this task")
			}
			return err
		}
		var res api.ExecResult
		err = s.cfg.Bus.Call(r.Context(), bus.EdgeSubject(node), edgeproto.OpFnCall, &edgeproto.FnCallRequest{Call: req, Project: principal(r).Project}, &res, nil)
		if err == nil {
			writeJSON(w, http.StatusOK, &res)
			return nil
		}
		var ae *api.Error
		if errors.Is(err, bus.ErrNoResponders) || (errors.As(err, &ae) && ae.Code == api.CodeUnavailable) {
			exclude[node] = true
			lastErr = err
			continue
		}
		return err
	}
	return lastErr
}
