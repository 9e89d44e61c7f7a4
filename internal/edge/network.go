package edge

import (
	"fmt"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
)

// runtimeNetwork parses a create request's network (validated already by
// sandboxspec.Normalize) for the runtime; nil stays nil: loopback only.
func runtimeNetwork(n *api.NetworkSpec) (*runtime.NetworkSpec, error) {
	if n == nil {
		return nil, nil
	}
	out := &runtime.NetworkSpec{}
	for _, e := range n.Egress {
		r, err := api.ParseEgress(e)
		if err != nil {
			return nil, &api.Error{Code: api.CodeInvalid, Message: "network." + err.Error()}
		}
		out.Egress = append(out.Egress, r)
	}
	return out, nil
}

// network answers OpNetwork: the sandbox's address, allowlist and what
// its policy refused so far (read from the host's kernel).
func (e *Edge) network(id string) (*api.SandboxNetwork, error) {
	sb, err := e.lookup(id)
	if err != nil {
		return nil, err
	}
	sb.mu.Lock()
	spec := sb.rec.Spec.Network
	var h *runtime.Handle
	if sb.inst != nil {
		hh := sb.inst.Handle
		h = &hh
	}
	state := sb.rec.Sandbox.State
	sb.mu.Unlock()
	out := &api.SandboxNetwork{ID: id, Egress: []string{}, DeniedBy: map[string]int64{}}
	if spec == nil {
		return out, nil
	}
	out.Enabled, out.Egress = true, spec.Egress
	if h == nil || h.Net == nil {
		return out, nil // not running: its network is gone
	}
	out.Address, out.Gateway = h.Net.Address, h.Net.Gateway
	nr, ok := e.cfg.Runtime.(runtime.NetworkReporter)
	if !ok {
		return out, nil
	}
	by, err := nr.NetworkDenied(*h)
	if err != nil {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s (%s): network counters cannot be read now: %v", id, state, err)}
	}
	for k, v := range by {
		out.DeniedBy[k] = v
		out.Denied += v
	}
	return out, nil
}
