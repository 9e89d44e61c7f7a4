// Package netrules is a node's copy of the cluster's named network rules
// (bus BucketNetworkRules) and what its sandboxes' egress lists make of
// them. Watch loads the rules and keeps them current; an egress entry
// that names a rule stands for the rule's destinations (Resolve), and a
// change of a rule is applied again to every running sandbox whose list
// names it (Apply; a rule deleted under a running sandbox stands for
// nothing there). An unknown rule is the caller's error when a list is
// given (a create, a change of the list: strict resolution). Read and Set
// answer the read of a sandbox's network and the change of its list
// (OpNetwork, OpNetworkSet).
//
// The lifecycle core (package edge) keeps the sandboxes and hands each
// over as a Sandbox; what the package needs of the core is its Host. It
// never sees the core's records or locks. A change of the list as a step
// of a trajectory stays with the core (it runs Set as the step).
//
// # Locks
//
// Rules.mu is a leaf: it is held only over a read or change of the rules,
// and no Host or Sandbox method and no runtime call is made while it is
// held. Sandbox.Network holds the core's sandbox.mu over its function,
// which may resolve a list (Rules.mu, under sandbox.mu) and set it in the
// runtime (SetEgress), so that two changes of a list land in the order
// they are recorded. The core's Edge.mu is never held with Rules.mu:
// Host.Users and Host.Lookup take it (and sandbox.mu), and the package
// calls them holding no lock (the function Users is given takes none).
// The core calls Watch, Apply, Read and Set holding none of its locks,
// and Resolve holding none or only sandbox.mu.
package netrules

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/runtime"
)

// answerWait bounds Watch's wait for the rules as they stand.
var answerWait = 30 * time.Second

// View is a sandbox's network as it stands.
type View struct {
	// Spec is its network as recorded (nil: loopback only).
	Spec *api.NetworkSpec
	// Handle is its container's (nil while it has none); Handle.Net is nil
	// when the container has no network.
	Handle *runtime.Handle
	// State is its state (api.State*).
	State string
}

// Sandbox is a sandbox of the core as the network rules see it.
type Sandbox interface {
	// ID is the sandbox's id.
	ID() string
	// Wait returns once its creation finished (either way).
	Wait()
	// Network calls f with its network under its lock (the core's
	// sandbox.mu, held over f) and returns f's error. record, called by f
	// only, makes n its network and writes its record; n is its network
	// even when the write fails (the error is the write's).
	Network(f func(v View, record func(n *api.NetworkSpec) error) error) error
}

// Host is what the network rules need of the lifecycle core.
type Host interface {
	Logger() *slog.Logger
	// Go runs f as one of the core's goroutines (its Close waits for it;
	// once Close began, it runs nothing).
	Go(f func())
	// Users lists the sandboxes that have a container and a network whose
	// egress list satisfies names (which takes no lock).
	Users(names func(egress []string) bool) []Sandbox
	// Lookup is the sandbox id names (an *api.Error when there is none).
	Lookup(id string) (Sandbox, error)
}

// Source is the cluster's rules, as the bus keeps them (*bus.Records): it
// delivers every record (the values as they stand, then ready once, then
// each change) to fn until ctx ends.
type Source interface {
	Watch(ctx context.Context, fn func(bus.RecordUpdate), ready func()) error
}

// Rules is the node's copy of the cluster's named rules.
type Rules struct {
	host Host
	ns   runtime.NetworkSetter   // nil: the runtime cannot change a list
	nr   runtime.NetworkReporter // nil: it cannot count refusals

	mu     sync.Mutex
	byName map[string]api.NetworkRule
}

// New makes the rules of a node whose sandboxes run on rt (it knows none
// until Watch).
func New(h Host, rt runtime.Runtime) *Rules {
	r := &Rules{host: h}
	r.ns, _ = rt.(runtime.NetworkSetter)
	r.nr, _ = rt.(runtime.NetworkReporter)
	return r
}

func (r *Rules) get(name string) (api.NetworkRule, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	nr, ok := r.byName[name]
	return nr, ok
}

// update applies one record of the bucket: Raw nil deletes Key.
func (r *Rules) update(u bus.RecordUpdate) bool {
	var nr api.NetworkRule
	if u.Raw != nil && json.Unmarshal(u.Raw, &nr) != nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if u.Raw == nil {
		delete(r.byName, u.Key)
	} else {
		r.byName[u.Key] = nr
	}
	return true
}

// Watch loads the rules from src and keeps them current until ctx ends
// (in a goroutine of the Host's); once they are loaded, a change reaches
// the running sandboxes that use the rule (Apply).
func (r *Rules) Watch(ctx context.Context, src Source) error {
	r.mu.Lock()
	r.byName = map[string]api.NetworkRule{}
	r.mu.Unlock()
	ready := make(chan struct{})
	failed := make(chan error, 1)
	var loaded bool
	watch := func() error {
		return src.Watch(ctx, func(u bus.RecordUpdate) {
			if r.update(u) && loaded {
				r.Apply(u.Key)
			}
		}, func() {
			if !loaded {
				loaded = true
				close(ready)
			}
		})
	}
	r.host.Go(func() {
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
	case <-time.After(answerWait):
		return fmt.Errorf("edge: network rules: no answer from %s", bus.BucketNetworkRules)
	}
}

// names reports whether an egress list names rule ("": any rule).
func names(egress []string, rule string) bool {
	if rule != "" {
		return slices.Contains(egress, rule)
	}
	return slices.ContainsFunc(egress, func(s string) bool { return s != api.EgressInternet && api.RuleNameRE.MatchString(s) })
}

// Apply sets again the egress of every running sandbox whose list names
// rule ("": any rule).
func (r *Rules) Apply(rule string) {
	users := r.host.Users(func(egress []string) bool { return names(egress, rule) })
	if r.ns == nil {
		return
	}
	for _, sb := range users {
		if err := r.reapply(sb); err != nil {
			r.host.Logger().Warn("edge: apply a changed network rule", "rule", rule, "id", sb.ID(), "err", err)
		}
	}
}

// reapply expands sb's list again (its rules changed) and sets it.
func (r *Rules) reapply(sb Sandbox) error {
	return sb.Network(func(v View, _ func(*api.NetworkSpec) error) error {
		if v.Spec == nil || v.Handle == nil || v.Handle.Net == nil ||
			(v.State != api.StateRunning && v.State != api.StatePaused) {
			return nil
		}
		rn, err := r.Resolve(v.Spec, true)
		if err != nil {
			return err
		}
		return r.ns.SetEgress(*v.Handle, rn.Egress)
	})
}

// Resolve parses a network (validated already by
// sandboxspec.CheckNetwork) for the runtime, with its rules' names
// expanded; nil stays nil: loopback only. An unknown rule is the caller's
// error, unless lenient (a rule deleted under a running sandbox: it
// stands for nothing).
func (r *Rules) Resolve(n *api.NetworkSpec, lenient bool) (*runtime.NetworkSpec, error) {
	if n == nil {
		return nil, nil
	}
	out := &runtime.NetworkSpec{}
	for _, s := range n.Egress {
		er, err := api.ParseEgress(s)
		if err != nil {
			return nil, &api.Error{Code: api.CodeInvalid, Message: "network." + err.Error()}
		}
		if er.Rule == "" {
			out.Egress = append(out.Egress, er)
			continue
		}
		nr, ok := r.get(er.Rule)
		if !ok {
			if lenient {
				continue
			}
			return nil, &api.Error{Code: api.CodeBadRequest, Message: fmt.Sprintf("network.egress: network rule %q is unknown (GET /v1/network-rules lists them)", er.Rule)}
		}
		out.Egress = append(out.Egress, nr.Expand()...)
	}
	if len(out.Egress) > api.MaxExpandedEgress {
		return nil, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("network.egress: %d destinations once its rules are expanded, at most %d", len(out.Egress), api.MaxExpandedEgress)}
	}
	return out, nil
}
