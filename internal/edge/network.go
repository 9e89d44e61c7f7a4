package edge

import (
	"fmt"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/sandboxspec"
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
	out := &api.SandboxNetwork{ID: id, Egress: []string{}, DeniedBy: map[string]int64{}, DeniedDestinations: []api.NetworkDenial{}}
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
	dd, err := nr.NetworkDeniedDestinations(*h)
	if err != nil {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s (%s): network record cannot be read now: %v", id, state, err)}
	}
	out.DeniedDestinations = append(out.DeniedDestinations, dd...)
	return out, nil
}

// setNetwork answers OpNetworkSet: the running sandbox's egress list is
// replaced (new connections obey it when this returns; open ones to
// destinations no longer listed are cut) and recorded.
func (e *Edge) setNetwork(req *NetworkSetRequest) (*api.SandboxNetwork, error) {
	n := req.Network
	if aerr := sandboxspec.CheckNetwork(&n); aerr != nil {
		return nil, aerr
	}
	rules, err := runtimeNetwork(&n)
	if err != nil {
		return nil, err
	}
	sb, err := e.lookup(req.ID)
	if err != nil {
		return nil, err
	}
	<-sb.ready
	ns, ok := e.cfg.Runtime.(runtime.NetworkSetter)
	if !ok {
		return nil, &api.Error{Code: api.CodeUnavailable, Message: "this node's runtime cannot change a sandbox's network"}
	}
	if err := e.setNetworkLocked(sb, ns, req.ID, &n, rules.Egress); err != nil {
		return nil, err
	}
	return e.network(req.ID)
}

// setNetworkLocked changes and records sb's list under sb.mu, so that two
// changes land in the order they are recorded.
func (e *Edge) setNetworkLocked(sb *sandbox, ns runtime.NetworkSetter, id string, n *api.NetworkSpec, egress []api.EgressRule) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	switch {
	case sb.rec.Spec.Network == nil:
		return &api.Error{Code: api.CodeConflict, Message: "sandbox " + id + " was created without network (loopback only): its network cannot be changed"}
	case sb.inst == nil || sb.inst.Handle.Net == nil || (sb.rec.Sandbox.State != api.StateRunning && sb.rec.Sandbox.State != api.StatePaused):
		return &api.Error{Code: api.CodeConflict, Message: "sandbox " + id + " is " + sb.rec.Sandbox.State + ": its network cannot be changed"}
	}
	if err := ns.SetEgress(sb.inst.Handle, egress); err != nil {
		return fmt.Errorf("set network of %s: %w", id, err)
	}
	sb.rec.Spec.Network = n
	if err := e.persist(&sb.rec); err != nil {
		e.log.Warn("record network change", "id", id, "err", err)
	}
	return nil
}
