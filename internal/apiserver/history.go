package apiserver

import (
	"net/http"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// listCommands answers a sandbox's recent command history (its owner's:
// callEdge scopes the request to the caller's project).
func (s *Server) listCommands(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var h api.CommandHistory
	if err := s.callEdge(r.Context(), id, edgeproto.OpCommands, &edgeproto.IDRequest{ID: id}, &h, nil); err != nil {
		return err
	}
	if h.Commands == nil {
		h.Commands = []api.CommandRecord{}
	}
	writeJSON(w, http.StatusOK, &h)
	return nil
}

// sandboxNetwork answers a sandbox's address, allowlist and refusals,
// read on its node (owned like every sandbox route: the edge answers a
// sandbox of another project as missing).
func (s *Server) sandboxNetwork(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var n api.SandboxNetwork
	if err := s.callEdge(r.Context(), id, edgeproto.OpNetwork, &edgeproto.IDRequest{ID: id}, &n, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &n)
	return nil
}

// sandboxNetworkDenials answers a sandbox's log of refusals.
func (s *Server) sandboxNetworkDenials(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var n api.NetworkDenials
	if err := s.callEdge(r.Context(), id, edgeproto.OpNetworkDenials, &edgeproto.IDRequest{ID: id}, &n, nil); err != nil {
		return err
	}
	if n.Denials == nil {
		n.Denials = []api.NetworkDenialRecord{}
	}
	writeJSON(w, http.StatusOK, &n)
	return nil
}

// setSandboxNetwork replaces a running networked sandbox's egress list.
func (s *Server) setSandboxNetwork(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var req api.NetworkSpec
	if err := decodeJSON(w, r, &req); err != nil {
		return err
	}
	if aerr := sandboxspec.CheckNetwork(&req); aerr != nil {
		return aerr
	}
	var n api.SandboxNetwork
	// A resuming client re-issuing a logged change: the sandbox has the
	// list already (it is alive, and every later change is logged too).
	if _, ok, err := s.fastForward(r.Context(), id, &api.TrajectoryStep{Op: "network", Egress: req.Egress}); err != nil {
		return err
	} else if ok {
		if err := s.callEdge(r.Context(), id, edgeproto.OpNetwork, &edgeproto.IDRequest{ID: id}, &n, nil); err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, &n)
		return nil
	}
	if err := s.callEdge(r.Context(), id, edgeproto.OpNetworkSet, &edgeproto.NetworkSetRequest{ID: id, Network: req}, &n, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &n)
	return nil
}

// sandboxStats answers what a sandbox uses now, measured on its node.
func (s *Server) sandboxStats(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var st api.SandboxStats
	if err := s.callEdge(r.Context(), id, edgeproto.OpStats, &edgeproto.IDRequest{ID: id}, &st, nil); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, &st)
	return nil
}
