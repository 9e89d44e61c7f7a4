package netrules

// A sandbox's network: its read (OpNetwork) and the change of its list
// (OpNetworkSet).

import (
	"fmt"

	"github.com/warrenhq/warren/api"
)

// Read answers OpNetwork: the sandbox's address, allowlist and what its
// policy refused so far (read from the host's kernel).
func (r *Rules) Read(id string) (*api.SandboxNetwork, error) {
	sb, err := r.host.Lookup(id)
	if err != nil {
		return nil, err
	}
	var v View
	_ = sb.Network(func(cur View, _ func(*api.NetworkSpec) error) error {
		v = cur
		return nil
	})
	out := &api.SandboxNetwork{ID: id, Egress: []string{}, DeniedBy: map[string]int64{}, DeniedDestinations: []api.NetworkDenial{}}
	if v.Spec == nil {
		return out, nil
	}
	out.Enabled, out.Egress = true, v.Spec.Egress
	h := v.Handle
	if h == nil || h.Net == nil {
		return out, nil // not running: its network is gone
	}
	out.Address, out.Gateway = h.Net.Address, h.Net.Gateway
	if r.nr == nil {
		return out, nil
	}
	by, err := r.nr.NetworkDenied(*h)
	if err != nil {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s (%s): network counters cannot be read now: %v", id, v.State, err)}
	}
	for k, n := range by {
		out.DeniedBy[k] = n
		out.Denied += n
	}
	dd, err := r.nr.NetworkDeniedDestinations(*h)
	if err != nil {
		return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s (%s): network record cannot be read now: %v", id, v.State, err)}
	}
	out.DeniedDestinations = append(out.DeniedDestinations, dd...)
	return out, nil
}

// Set replaces id's list with n (checked already by
// sandboxspec.CheckNetwork) once its creation finished and answers its
// network (Read). The list keeps the sandbox's group, rates and limit; an
// unknown rule in it is the caller's error.
func (r *Rules) Set(id string, n *api.NetworkSpec) (*api.SandboxNetwork, error) {
	rn, err := r.Resolve(n, false)
	if err != nil {
		return nil, err
	}
	sb, err := r.host.Lookup(id)
	if err != nil {
		return nil, err
	}
	sb.Wait()
	if r.ns == nil {
		return nil, &api.Error{Code: api.CodeUnavailable, Message: "this node's runtime cannot change a sandbox's network"}
	}
	err = sb.Network(func(v View, record func(*api.NetworkSpec) error) error {
		return r.setLocked(v, record, id, n, rn.Egress)
	})
	if err != nil {
		return nil, err
	}
	return r.Read(id)
}

// setLocked changes and records a sandbox's list under its lock, so that
// two changes land in the order they are recorded.
func (r *Rules) setLocked(v View, record func(*api.NetworkSpec) error, id string, n *api.NetworkSpec, egress []api.EgressRule) error {
	cur := v.Spec
	switch {
	case cur == nil:
		return &api.Error{Code: api.CodeConflict, Message: "sandbox " + id + " was created without network (loopback only): its network cannot be changed"}
	case v.Handle == nil || v.Handle.Net == nil || (v.State != api.StateRunning && v.State != api.StatePaused):
		return &api.Error{Code: api.CodeConflict, Message: "sandbox " + id + " is " + v.State + ": its network cannot be changed"}
	case n.Group != "" && n.Group != cur.Group:
		return &api.Error{Code: api.CodeConflict, Message: "sandbox " + id + ": network.group is set at create only (it is \"" + cur.Group + "\")"}
	}
	// A change of the list keeps the group, the rates and the limit.
	n.Group, n.EgressRateMbit = cur.Group, cur.EgressRateMbit
	n.IngressRateMbit, n.MaxConns = cur.IngressRateMbit, cur.MaxConns
	if err := r.ns.SetEgress(*v.Handle, egress); err != nil {
		return fmt.Errorf("set network of %s: %w", id, err)
	}
	if err := record(n); err != nil {
		r.host.Logger().Warn("record network change", "id", id, "err", err)
	}
	return nil
}
