// Package tiers puts several runtimes (tiers) behind the one
// runtime.Runtime the edge drives: a sandbox's Spec.Tier picks the runtime
// that starts it, and its Handle.Tier the one that attaches, freezes and
// destroys it later ("" = the default tier, the container runtime). The
// optional capabilities (runtime.Reclaimer, CPUGater, …) are the default
// tier's: they reach it for its sandboxes; for another tier's sandbox they
// do nothing (a VM's memory is not reclaimed, its CPU not gated) or, where
// doing nothing would be wrong, fail (recycling: ErrNotReusable; egress).
//
// The edge gets a *Runtime only when the node offers more than one tier, so
// a node with containers alone behaves exactly as before.
package tiers

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
)

// Runtime dispatches by tier.
type Runtime struct {
	def   runtime.Runtime
	other map[string]runtime.Runtime
	names []string
}

// New puts def (the default tier) and more behind one runtime.
func New(def runtime.Runtime, more ...runtime.Runtime) *Runtime {
	r := &Runtime{def: def, other: map[string]runtime.Runtime{}, names: []string{def.Name()}}
	for _, m := range more {
		r.other[m.Name()] = m
		r.names = append(r.names, m.Name())
	}
	return r
}

var (
	_ runtime.Runtime              = (*Runtime)(nil)
	_ runtime.Reclaimer            = (*Runtime)(nil)
	_ runtime.KillCounter          = (*Runtime)(nil)
	_ runtime.NetworkReporter      = (*Runtime)(nil)
	_ runtime.NetworkSetter        = (*Runtime)(nil)
	_ runtime.Recycler             = (*Runtime)(nil)
	_ runtime.UsageReporter        = (*Runtime)(nil)
	_ runtime.CPUGater             = (*Runtime)(nil)
	_ runtime.ClassCapper          = (*Runtime)(nil)
	_ runtime.CgroupLister         = (*Runtime)(nil)
	_ runtime.SandboxUsageReporter = (*Runtime)(nil)
)

// Name is the default tier's.
func (r *Runtime) Name() string { return r.def.Name() }

// Tiers names every tier, the default first.
func (r *Runtime) Tiers() []string { return append([]string(nil), r.names...) }

// Tier is the runtime of tier ("" = the default), nil when there is none.
func (r *Runtime) Tier(tier string) runtime.Runtime {
	if tier == "" || tier == r.def.Name() {
		return r.def
	}
	return r.other[tier]
}

// isDef reports whether h belongs to the default tier.
func (r *Runtime) isDef(h runtime.Handle) bool { return h.Tier == "" || h.Tier == r.def.Name() }

func (r *Runtime) of(h runtime.Handle) (runtime.Runtime, error) {
	rt := r.Tier(h.Tier)
	if rt == nil {
		return nil, fmt.Errorf("tiers: sandbox %s has tier %q, which this node does not offer", h.ID, h.Tier)
	}
	return rt, nil
}

// Start starts spec on its tier's runtime.
func (r *Runtime) Start(ctx context.Context, spec *runtime.Spec) (*runtime.Instance, error) {
	rt := r.Tier(spec.Tier)
	if rt == nil {
		return nil, fmt.Errorf("tiers: this node does not offer tier %q", spec.Tier)
	}
	inst, err := rt.Start(ctx, spec)
	if err == nil && rt != r.def {
		inst.Handle.Tier = rt.Name()
	}
	return inst, err
}

// Attach reconnects through h's tier.
func (r *Runtime) Attach(ctx context.Context, h runtime.Handle) (*runtime.Instance, error) {
	rt, err := r.of(h)
	if err != nil {
		return nil, err
	}
	return rt.Attach(ctx, h)
}

// Destroy destroys through h's tier.
func (r *Runtime) Destroy(ctx context.Context, h runtime.Handle) error {
	rt, err := r.of(h)
	if err != nil {
		return err
	}
	return rt.Destroy(ctx, h)
}

// Leftovers are every tier's, each handle naming its tier.
func (r *Runtime) Leftovers(ctx context.Context) ([]runtime.Handle, error) {
	hs, err := r.def.Leftovers(ctx)
	if err != nil {
		return nil, err
	}
	for _, name := range r.names[1:] {
		more, err := r.other[name].Leftovers(ctx)
		if err != nil {
			return nil, fmt.Errorf("tiers: %s: %w", name, err)
		}
		for _, h := range more {
			h.Tier = name
			hs = append(hs, h)
		}
	}
	return hs, nil
}

// Freeze freezes through h's tier.
func (r *Runtime) Freeze(ctx context.Context, h runtime.Handle) error {
	rt, err := r.of(h)
	if err != nil {
		return err
	}
	return rt.Freeze(ctx, h)
}

// Thaw thaws through h's tier.
func (r *Runtime) Thaw(ctx context.Context, h runtime.Handle) error {
	rt, err := r.of(h)
	if err != nil {
		return err
	}
	return rt.Thaw(ctx, h)
}

// Reclaim: the sandbox's tier's (the microvm tier writes a memory snapshot
// and ends QEMU); a tier without it keeps the sandbox's memory.
func (r *Runtime) Reclaim(ctx context.Context, h runtime.Handle) (int64, int64, error) {
	rt, err := r.of(h)
	if err != nil {
		return 0, 0, err
	}
	if rc, ok := rt.(runtime.Reclaimer); ok {
		return rc.Reclaim(ctx, h)
	}
	return 0, 0, nil
}

// Restore: the sandbox's tier's.
func (r *Runtime) Restore(ctx context.Context, h runtime.Handle, memoryMB int64) error {
	rt, err := r.of(h)
	if err != nil {
		return err
	}
	if rc, ok := rt.(runtime.Reclaimer); ok {
		return rc.Restore(ctx, h, memoryMB)
	}
	return nil
}

// Prefetch: the sandbox's tier's.
func (r *Runtime) Prefetch(ctx context.Context, h runtime.Handle, rest bool) (int64, error) {
	rt, err := r.of(h)
	if err != nil {
		return 0, err
	}
	if rc, ok := rt.(runtime.Reclaimer); ok {
		return rc.Prefetch(ctx, h, rest)
	}
	return 0, nil
}

// OOMKills: the default tier's.
func (r *Runtime) OOMKills(h runtime.Handle) (int64, error) {
	if kc, ok := r.def.(runtime.KillCounter); ok && r.isDef(h) {
		return kc.OOMKills(h)
	}
	return 0, nil
}

// PidsRefused: the default tier's.
func (r *Runtime) PidsRefused(h runtime.Handle) (int64, error) {
	if kc, ok := r.def.(runtime.KillCounter); ok && r.isDef(h) {
		return kc.PidsRefused(h)
	}
	return 0, nil
}

// NetworkDenied: the sandbox's tier's (container and VM tiers share one
// sandboxnet.Manager).
func (r *Runtime) NetworkDenied(h runtime.Handle) (map[string]int64, error) {
	if nr, ok := r.Tier(h.Tier).(runtime.NetworkReporter); ok {
		return nr.NetworkDenied(h)
	}
	return nil, nil
}

// NetworkDeniedDestinations: the sandbox's tier's.
func (r *Runtime) NetworkDeniedDestinations(h runtime.Handle) ([]api.NetworkDenial, error) {
	if nr, ok := r.Tier(h.Tier).(runtime.NetworkReporter); ok {
		return nr.NetworkDeniedDestinations(h)
	}
	return nil, nil
}

// SetEgress: the sandbox's tier's.
func (r *Runtime) SetEgress(h runtime.Handle, egress []api.EgressRule) error {
	if ns, ok := r.Tier(h.Tier).(runtime.NetworkSetter); ok {
		return ns.SetEgress(h, egress)
	}
	return fmt.Errorf("tiers: sandbox %s (tier %s) has no network", h.ID, h.Tier)
}

// Wipe: the default tier's; another tier's sandbox is not reusable.
func (r *Runtime) Wipe(ctx context.Context, inst *runtime.Instance) error {
	if rc, ok := r.def.(runtime.Recycler); ok && r.isDef(inst.Handle) {
		return rc.Wipe(ctx, inst)
	}
	return runtime.ErrNotReusable
}

// Reroot: the default tier's.
func (r *Runtime) Reroot(ctx context.Context, inst *runtime.Instance, spec *runtime.Spec) error {
	if rc, ok := r.def.(runtime.Recycler); ok && r.isDef(inst.Handle) {
		return rc.Reroot(ctx, inst, spec)
	}
	return runtime.ErrNotReusable
}

// Resume: the default tier's.
func (r *Runtime) Resume(ctx context.Context, inst *runtime.Instance, spec *runtime.Spec) error {
	if rc, ok := r.def.(runtime.Recycler); ok && r.isDef(inst.Handle) {
		return rc.Resume(ctx, inst, spec)
	}
	return runtime.ErrNotReusable
}

// Usage is the default tier's.
func (r *Runtime) Usage() (runtime.Usage, error) {
	if ur, ok := r.def.(runtime.UsageReporter); ok {
		return ur.Usage()
	}
	return runtime.Usage{}, errors.ErrUnsupported
}

// CPUGate: the sandbox's tier's; a tier without one gives a gate that
// does nothing.
func (r *Runtime) CPUGate(h runtime.Handle, full, idle float64) (runtime.CPUGate, error) {
	rt, err := r.of(h)
	if err != nil {
		return nil, err
	}
	if g, ok := rt.(runtime.CPUGater); ok {
		return g.CPUGate(h, full, idle)
	}
	return noGate{}, nil
}

// ClassCap: the default tier's best-effort class (other tiers' sandboxes
// are not in it).
func (r *Runtime) ClassCap(cores float64) (runtime.CPUGate, error) {
	if cc, ok := r.def.(runtime.ClassCapper); ok {
		return cc.ClassCap(cores)
	}
	return nil, fmt.Errorf("tiers: the default tier %s has no best-effort class: %w", r.def.Name(), errors.ErrUnsupported)
}

type noGate struct{}

func (noGate) Set(bool) error                { return nil }
func (noGate) Sample() (int64, int64, error) { return 0, 0, nil }
func (noGate) Close() error                  { return nil }

// UnifiedCgroups: the default tier's.
func (r *Runtime) UnifiedCgroups(h runtime.Handle) []string {
	if cl, ok := r.def.(runtime.CgroupLister); ok && r.isDef(h) {
		return cl.UnifiedCgroups(h)
	}
	return nil
}

// UnifiedRoot is the default tier's.
func (r *Runtime) UnifiedRoot() string {
	if cl, ok := r.def.(runtime.CgroupLister); ok {
		return cl.UnifiedRoot()
	}
	return ""
}

// SandboxUsage: the tier's own when it measures one sandbox, else none.
func (r *Runtime) SandboxUsage(h runtime.Handle) (runtime.Usage, error) {
	rt, err := r.of(h)
	if err != nil {
		return runtime.Usage{}, err
	}
	if ur, ok := rt.(runtime.SandboxUsageReporter); ok {
		return ur.SandboxUsage(h)
	}
	return runtime.Usage{}, nil
}

// Isolation is the default tier's (the container tier's user namespaces).
func (r *Runtime) Isolation() (mode, detail string) {
	if iso, ok := r.def.(interface{ Isolation() (string, string) }); ok {
		return iso.Isolation()
	}
	return "", ""
}

// Accel is the accelerator of the first tier that has one ("kvm", "tcg").
func (r *Runtime) Accel() string {
	for _, name := range r.names[1:] {
		if a, ok := r.other[name].(interface{ Accel() string }); ok {
			return a.Accel()
		}
	}
	return ""
}

// KernelVersion is the guest kernel of the first tier that has one.
func (r *Runtime) KernelVersion() string {
	for _, name := range r.names[1:] {
		if k, ok := r.other[name].(interface{ KernelVersion() string }); ok {
			return k.KernelVersion()
		}
	}
	return ""
}

var _ runtime.Display = (*Runtime)(nil)

// display is h's tier's screen capability, ErrNoDisplay when it has none.
func (r *Runtime) display(h runtime.Handle) (runtime.Display, error) {
	rt, err := r.of(h)
	if err != nil {
		return nil, err
	}
	d, ok := rt.(runtime.Display)
	if !ok {
		return nil, runtime.ErrNoDisplay
	}
	return d, nil
}

// Screenshot: h's tier's.
func (r *Runtime) Screenshot(ctx context.Context, h runtime.Handle) ([]byte, error) {
	d, err := r.display(h)
	if err != nil {
		return nil, err
	}
	return d.Screenshot(ctx, h)
}

// SendInput: h's tier's.
func (r *Runtime) SendInput(ctx context.Context, h runtime.Handle, in runtime.DisplayInput) error {
	d, err := r.display(h)
	if err != nil {
		return err
	}
	return d.SendInput(ctx, h, in)
}

// DialDisplay: h's tier's.
func (r *Runtime) DialDisplay(ctx context.Context, h runtime.Handle) (net.Conn, error) {
	d, err := r.display(h)
	if err != nil {
		return nil, err
	}
	return d.DialDisplay(ctx, h)
}

var _ runtime.PortDialer = (*Runtime)(nil)

// DialPort: h's tier's, an error when that tier forwards no ports.
func (r *Runtime) DialPort(ctx context.Context, h runtime.Handle, port int) (net.Conn, error) {
	rt, err := r.of(h)
	if err != nil {
		return nil, err
	}
	d, ok := rt.(runtime.PortDialer)
	if !ok {
		return nil, fmt.Errorf("tiers: the %s tier does not forward ports", rt.Name())
	}
	return d.DialPort(ctx, h, port)
}

var _ runtime.MemoryForker = (*Runtime)(nil)

// Fork: h's tier's, when it forks from memory (runtime.ErrNoMemoryFork
// else); the children are of h's tier.
func (r *Runtime) Fork(ctx context.Context, h runtime.Handle, specs []*runtime.Spec) ([]*runtime.Instance, error) {
	rt, err := r.of(h)
	if err != nil {
		return nil, err
	}
	fk, ok := rt.(runtime.MemoryForker)
	if !ok {
		return nil, fmt.Errorf("tiers: %s: %w", rt.Name(), runtime.ErrNoMemoryFork)
	}
	insts, err := fk.Fork(ctx, h, specs)
	if err == nil && rt != r.def {
		for _, in := range insts {
			in.Handle.Tier = rt.Name()
		}
	}
	return insts, err
}
