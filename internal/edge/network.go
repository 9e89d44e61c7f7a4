package edge

// Network rules and a sandbox's network are internal/edge/netrules' (its
// package comment). The core opens the cluster's rules for it
// (watchNetRules), resolves a create's list through it (startNetwork),
// hands it the sandboxes, each as a netrules.Sandbox (netSandbox), and
// runs its change of a list as a step of a trajectory (setNetwork).

import (
	"context"
	"log/slog"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edge/netrules"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// netSandbox is sb as the network rules see it.
type netSandbox struct {
	*sandbox
	e *Edge
}

var _ netrules.Sandbox = netSandbox{}

func (s netSandbox) ID() string { return s.rec.Sandbox.ID }
func (s netSandbox) Wait()      { <-s.ready }

func (s netSandbox) Network(f func(netrules.View, func(*api.NetworkSpec) error) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := netrules.View{Spec: s.rec.Spec.Network, State: s.rec.Sandbox.State}
	if s.inst != nil {
		h := s.inst.Handle
		v.Handle = &h
	}
	return f(v, func(n *api.NetworkSpec) error {
		s.rec.Spec.Network = n
		return s.e.persist(&s.rec)
	})
}

// netHost is the core as the network rules see it.
type netHost struct{ e *Edge }

var _ netrules.Host = netHost{}

func (h netHost) Logger() *slog.Logger { return h.e.log }
func (h netHost) Go(f func())          { h.e.wg.Go(f) }

func (h netHost) Users(names func(egress []string) bool) []netrules.Sandbox {
	h.e.mu.Lock()
	defer h.e.mu.Unlock()
	var users []netrules.Sandbox
	for _, sb := range h.e.sandboxes {
		sb.mu.Lock()
		if n := sb.rec.Spec.Network; n != nil && names(n.Egress) && sb.inst != nil {
			users = append(users, netSandbox{sb, h.e})
		}
		sb.mu.Unlock()
	}
	return users
}

func (h netHost) Lookup(id string) (netrules.Sandbox, error) {
	sb, err := h.e.lookup(id)
	if err != nil {
		return nil, err
	}
	return netSandbox{sb, h.e}, nil
}

// watchNetRules loads the rules and keeps them current until ctx ends; a
// change reaches the running sandboxes that use the rule.
func (e *Edge) watchNetRules(ctx context.Context) error {
	recs, err := e.cfg.Bus.Records(ctx, bus.BucketNetworkRules)
	if err != nil {
		return err
	}
	return e.rules.Watch(ctx, recs)
}

// setNetwork answers OpNetworkSet: the running sandbox's egress list is
// replaced (new connections obey it when this returns; open ones to
// destinations no longer listed are cut) and recorded (netrules'
// Rules.Set); for a sandbox that records a trajectory, as a step of it
// ("network", with the list).
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
		return e.rules.Set(req.ID, &n)
	}
	if _, err := e.rules.Resolve(&n, false); err != nil {
		return nil, err // the caller's error: not a step
	}
	id := req.ID
	apply := func() (any, error) { return e.rules.Set(id, &n) }
	out, err := e.recorded(ctx, sb, &recOp{
		step:   &api.TrajectoryStep{Op: "network", Egress: n.Egress},
		run:    apply,
		record: func(*api.TrajectoryStep, any) {},
		// Served from the log to a resuming client: the list is set again
		// (the same list: nothing changes for a sandbox that has it).
		replay: func(*api.TrajectoryStep) (any, error) { return apply() },
		redo: func(_ context.Context, to string) error {
			_, err := e.rules.Set(to, &n)
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
