package edge

// Network rules: the edge keeps the cluster's named rules (bus
// BucketNetworkRules, watched) and expands an egress entry naming one
// into its destinations; a change of a rule is applied to every running
// sandbox that names it.
//
// Lock order: sandbox.mu, then netRules.mu (a leaf); Edge.mu is never
// held with netRules.mu.

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// netRules is the edge's copy of the cluster's named rules.
type netRules struct {
	mu     sync.Mutex
	byName map[string]api.NetworkRule
}

func (r *netRules) get(name string) (api.NetworkRule, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	nr, ok := r.byName[name]
	return nr, ok
}

// watchNetRules loads the rules and keeps them current until ctx ends; a
// change reaches the running sandboxes that use the rule.
func (e *Edge) watchNetRules(ctx context.Context) error {
	recs, err := e.cfg.Bus.Records(ctx, bus.BucketNetworkRules)
	if err != nil {
		return err
	}
	e.rules.mu.Lock()
	e.rules.byName = map[string]api.NetworkRule{}
	e.rules.mu.Unlock()
	ready := make(chan struct{})
	failed := make(chan error, 1)
	var loaded bool
	watch := func() error {
		return recs.Watch(ctx, func(u bus.RecordUpdate) {
			var nr api.NetworkRule
			if u.Raw != nil && json.Unmarshal(u.Raw, &nr) != nil {
				return
			}
			e.rules.mu.Lock()
			if u.Raw == nil {
				delete(e.rules.byName, u.Key)
			} else {
				e.rules.byName[u.Key] = nr
			}
			e.rules.mu.Unlock()
			if loaded {
				e.applyNetRule(u.Key)
			}
		}, func() {
			if !loaded {
				loaded = true
				close(ready)
			}
		})
	}
	e.wg.Go(func() {
		if err := watch(); err != nil {
			failed <- err
		}
	})
	select {
	case <-ready:
		return nil
	case err := <-failed:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(30 * time.Second):
		return fmt.Errorf("edge: network rules: no answer from %s", bus.BucketNetworkRules)
	}
}

// applyNetRule sets again the egress of every running sandbox whose list
// names rule ("": any rule).
func (e *Edge) applyNetRule(rule string) {
	names := func(egress []string) bool {
		if rule != "" {
			return slices.Contains(egress, rule)
		}
		return slices.ContainsFunc(egress, func(s string) bool { return s != api.EgressInternet && api.RuleNameRE.MatchString(s) })
	}
	e.mu.Lock()
	var users []*sandbox
	for _, sb := range e.sandboxes {
		sb.mu.Lock()
		if n := sb.rec.Spec.Network; n != nil && names(n.Egress) && sb.inst != nil {
			users = append(users, sb)
		}
		sb.mu.Unlock()
	}
	e.mu.Unlock()
	ns, ok := e.cfg.Runtime.(runtime.NetworkSetter)
	if !ok {
		return
	}
	for _, sb := range users {
		if err := e.reapplyNetwork(sb, ns); err != nil {
			e.log.Warn("edge: apply a changed network rule", "rule", rule, "id", sb.rec.Sandbox.ID, "err", err)
		}
	}
}

// reapplyNetwork expands sb's list again (its rules changed) and sets it.
func (e *Edge) reapplyNetwork(sb *sandbox, ns runtime.NetworkSetter) error {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	n := sb.rec.Spec.Network
	if n == nil || sb.inst == nil || sb.inst.Handle.Net == nil ||
		(sb.rec.Sandbox.State != api.StateRunning && sb.rec.Sandbox.State != api.StatePaused) {
		return nil
	}
	rn, err := e.runtimeNetwork(n, true)
	if err != nil {
		return err
	}
	return ns.SetEgress(sb.inst.Handle, rn.Egress)
}

// runtimeNetwork parses a network (validated already by
// sandboxspec.CheckNetwork) for the runtime, with its rules' names
// expanded; nil stays nil: loopback only. An unknown rule is the caller's
// error, unless lenient (a rule deleted under a running sandbox: it
// stands for nothing).
func (e *Edge) runtimeNetwork(n *api.NetworkSpec, lenient bool) (*runtime.NetworkSpec, error) {
	if n == nil {
		return nil, nil
	}
	out := &runtime.NetworkSpec{}
	for _, s := range n.Egress {
		r, err := api.ParseEgress(s)
		if err != nil {
			return nil, &api.Error{Code: api.CodeInvalid, Message: "network." + err.Error()}
		}
		if r.Rule == "" {
			out.Egress = append(out.Egress, r)
			continue
		}
		nr, ok := e.rules.get(r.Rule)
		if !ok {
			if lenient {
				continue
			}
			return nil, &api.Error{Code: api.CodeBadRequest, Message: fmt.Sprintf("network.egress: network rule %q is unknown (GET /v1/network-rules lists them)", r.Rule)}
		}
		out.Egress = append(out.Egress, nr.Expand()...)
	}
	if len(out.Egress) > api.MaxExpandedEgress {
		return nil, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("network.egress: %d destinations once its rules are expanded, at most %d", len(out.Egress), api.MaxExpandedEgress)}
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
// destinations no longer listed are cut) and recorded; for a sandbox
// that records a trajectory, as a step of it ("network", with the list).
func (e *Edge) setNetwork(ctx context.Context, req *NetworkSetRequest) (*api.SandboxNetwork, error) {
	n := req.Network
	if aerr := sandboxspec.CheckNetwork(&n); aerr != nil {
		return nil, aerr
	}
	sb, err := e.lookup(req.ID)
	if err != nil {
		return nil, err
	}
	<-sb.ready
	if sb.traj == nil {
		return e.applyNetwork(req.ID, &n)
	}
	if _, err := e.runtimeNetwork(&n, false); err != nil {
		return nil, err // the caller's error: not a step
	}
	id := req.ID
	apply := func() (any, error) { return e.applyNetwork(id, &n) }
	out, err := e.recorded(ctx, sb, &recOp{
		step:   &api.TrajectoryStep{Op: "network", Egress: n.Egress},
		run:    apply,
		record: func(*api.TrajectoryStep, any) {},
		// Served from the log to a resuming client: the list is set again
		// (the same list: nothing changes for a sandbox that has it).
		replay: func(*api.TrajectoryStep) (any, error) { return apply() },
		redo: func(_ context.Context, to string) error {
			_, err := e.applyNetwork(to, &n)
			return err
		},
		retarget: func(to string) { id = to },
		size:     256,
	})
	if err != nil {
		return nil, err
	}
	sn, _ := out.(*api.SandboxNetwork)
	return sn, nil
}

// applyNetwork replaces id's list with n (checked) and answers its
// network.
func (e *Edge) applyNetwork(id string, n *api.NetworkSpec) (*api.SandboxNetwork, error) {
	rules, err := e.runtimeNetwork(n, false)
	if err != nil {
		return nil, err
	}
	sb, err := e.lookup(id)
	if err != nil {
		return nil, err
	}
	<-sb.ready
	ns, ok := e.cfg.Runtime.(runtime.NetworkSetter)
	if !ok {
		return nil, &api.Error{Code: api.CodeUnavailable, Message: "this node's runtime cannot change a sandbox's network"}
	}
	if err := e.setNetworkLocked(sb, ns, id, n, rules.Egress); err != nil {
		return nil, err
	}
	return e.network(id)
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
	case n.Group != "" && n.Group != sb.rec.Spec.Network.Group:
		return &api.Error{Code: api.CodeConflict, Message: "sandbox " + id + ": network.group is set at create only (it is \"" + sb.rec.Spec.Network.Group + "\")"}
	}
	// A change of the list keeps the group, the rates and the limit.
	n.Group, n.EgressRateMbit = sb.rec.Spec.Network.Group, sb.rec.Spec.Network.EgressRateMbit
	n.IngressRateMbit, n.MaxConns = sb.rec.Spec.Network.IngressRateMbit, sb.rec.Spec.Network.MaxConns
	if err := ns.SetEgress(sb.inst.Handle, egress); err != nil {
		return fmt.Errorf("set network of %s: %w", id, err)
	}
	sb.rec.Spec.Network = n
	if err := e.persist(&sb.rec); err != nil {
		e.log.Warn("record network change", "id", id, "err", err)
	}
	return nil
}
