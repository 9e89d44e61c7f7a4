package microvm

import (
	"context"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/runtime/runtimetest"
)

// TestCPUGate: QEMU's cgroup quota follows the gate: a spinner in the guest
// gets the VM's cpu at the full level and the idle budget at the idle one,
// and the guest answers at once after a raise.
func TestCPUGate(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "gate")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	inst := f.boot(t, ctx, spec)
	g, err := f.rt.CPUGate(inst.Handle, spec.CPU, 0.05)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Set(true); err != nil {
		t.Fatal(err)
	}
	if r, err := runtimetest.Exec(ctx, inst.Agent, "yes > /dev/null 2>&1 & echo started"); err != nil || r.Stdout != "started\n" {
		t.Fatalf("spinner: %v %+v", err, r)
	}
	time.Sleep(300 * time.Millisecond)
	if r := runtimetest.GateRate(t, g, time.Second); r < 0.3 {
		t.Fatalf("full level: QEMU uses only %.3f cores with a spinning guest; the test cannot tell", r)
	}
	t0 := time.Now()
	if r, err := runtimetest.Exec(ctx, inst.Agent, "echo up"); err != nil || r.Stdout != "up\n" {
		t.Fatalf("exec at the full level: %v %+v", err, r)
	}
	t.Logf("exec at the full level: %v", time.Since(t0))
	if err := g.Set(false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if r := runtimetest.GateRate(t, g, 2*time.Second); r > 0.08 {
		t.Errorf("idle level: QEMU uses %.3f cores, want the 0.05 budget", r)
	}
	_, th0, _ := g.Sample()
	t0 = time.Now()
	if err := g.Set(true); err != nil {
		t.Fatal(err)
	}
	if r, err := runtimetest.Exec(ctx, inst.Agent, "echo up"); err != nil || r.Stdout != "up\n" {
		t.Fatalf("exec after the raise: %v %+v", err, r)
	}
	t.Logf("raise to the guest's answer: %v", time.Since(t0))
	if r := runtimetest.GateRate(t, g, time.Second); r < 0.3 {
		t.Errorf("raised: QEMU uses only %.3f cores", r)
	}
	if _, th1, _ := g.Sample(); th0 <= 0 || th1 < th0 {
		t.Errorf("throttled time %d then %d: the idle level should have throttled QEMU", th0, th1)
	}
}
