package tiers

import (
	"context"
	"errors"
	"net"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/runtime/fake"
)

// named renames a fake runtime: a second tier.
type named struct {
	*fake.Runtime
	name string
}

func (n named) Name() string { return n.name }

func TestDispatch(t *testing.T) {
	ctx := context.Background()
	def, vm := fake.New(), fake.New()
	r := New(def, named{vm, "microvm"})
	if got := r.Tiers(); len(got) != 2 || got[0] != "fake" || got[1] != "microvm" {
		t.Fatalf("tiers %v", got)
	}
	a, err := r.Start(ctx, &runtime.Spec{ID: "sb-a", StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Start(ctx, &runtime.Spec{ID: "sb-b", StateDir: t.TempDir(), Tier: "microvm"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Handle.Tier != "" || b.Handle.Tier != "microvm" {
		t.Errorf("handles' tiers %q %q", a.Handle.Tier, b.Handle.Tier)
	}
	if _, err := r.Start(ctx, &runtime.Spec{ID: "sb-c", StateDir: t.TempDir(), Tier: "quantum"}); err == nil {
		t.Error("a tier the node lacks started")
	}
	left, err := r.Leftovers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tiers := map[string]string{}
	for _, h := range left {
		tiers[h.ID] = h.Tier
	}
	if len(tiers) != 2 || tiers["sb-a"] != "" || tiers["sb-b"] != "microvm" {
		t.Errorf("leftovers %v", tiers)
	}
	// A VM's sandbox is never recycled; a tier without a CPU gate (the
	// fake) gives one that does nothing.
	if err := r.Wipe(ctx, b); !errors.Is(err, runtime.ErrNotReusable) {
		t.Errorf("Wipe of the second tier's sandbox: %v", err)
	}
	g, err := r.CPUGate(b.Handle, 1, 0.1)
	if err != nil || g.Set(false) != nil {
		t.Errorf("CPU gate of the second tier's sandbox: %v", err)
	}
	// Destroy reaches each sandbox's own runtime.
	if err := r.Destroy(ctx, b.Handle); err != nil {
		t.Fatal(err)
	}
	if left, _ := vm.Leftovers(ctx); len(left) != 0 {
		t.Errorf("the second tier still has %v", left)
	}
	if left, _ := def.Leftovers(ctx); len(left) != 1 {
		t.Errorf("the default tier has %v", left)
	}
	if err := r.Destroy(ctx, a.Handle); err != nil {
		t.Fatal(err)
	}
	a.Agent.Close()
	b.Agent.Close()
}

// dialer is a default tier that forwards ports.
type dialer struct {
	*fake.Runtime
	dialed *int
}

func (d dialer) DialPort(_ context.Context, _ runtime.Handle, port int) (net.Conn, error) {
	*d.dialed = port
	a, b := net.Pipe()
	b.Close()
	return a, nil
}

// TestPortsAndDisplay: a node with several tiers still forwards its
// containers' ports (the default tier's), refuses a tier without them, and
// answers ErrNoDisplay for a sandbox of a tier without a screen.
func TestPortsAndDisplay(t *testing.T) {
	ctx := context.Background()
	var dialed int
	r := New(dialer{fake.New(), &dialed}, named{fake.New(), "vm"})
	pd, ok := any(r).(runtime.PortDialer)
	if !ok {
		t.Fatal("a node with several tiers does not forward ports")
	}
	c, err := pd.DialPort(ctx, runtime.Handle{ID: "sb-a"}, 8000)
	if err != nil || dialed != 8000 {
		t.Fatalf("DialPort of the default tier: %v (dialed %d)", err, dialed)
	}
	c.Close()
	if _, err := pd.DialPort(ctx, runtime.Handle{ID: "sb-b", Tier: "vm"}, 8000); err == nil {
		t.Error("DialPort reached a tier that forwards no ports")
	}
	if _, err := r.Screenshot(ctx, runtime.Handle{ID: "sb-a"}); !errors.Is(err, runtime.ErrNoDisplay) {
		t.Errorf("Screenshot of a container: %v", err)
	}
}

// TestClassCapReachesDefaultTier: the best-effort class's cap is the
// default tier's (a node with the microvm tiers on capped nothing: the
// edge found no runtime.ClassCapper behind the dispatcher).
func TestClassCapReachesDefaultTier(t *testing.T) {
	def := fake.New()
	var r runtime.Runtime = New(def, named{fake.New(), "microvm"})
	cc, ok := r.(runtime.ClassCapper)
	if !ok {
		t.Fatal("the tier dispatcher offers no best-effort class cap")
	}
	if _, err := cc.ClassCap(0.1); !errors.Is(err, runtime.ErrGone) {
		t.Errorf("ClassCap before a best-effort sandbox: %v, want ErrGone", err)
	}
	inst, err := r.Start(context.Background(), &runtime.Spec{ID: "sb-be", StateDir: t.TempDir(), Priority: api.PriorityBestEffort})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Agent.Close()
	g, err := cc.ClassCap(0.1)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Set(false); err != nil {
		t.Fatal(err)
	}
	if c, _, capped := def.ClassWrites(); c != 1 || !capped {
		t.Errorf("the default tier saw %d caps, capped %v", c, capped)
	}
}
