package container

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/runtime/runtimetest"
)

// cpuRate samples the gate's usage over d: cores used.
var cpuRate = runtimetest.GateRate

// TestCPUGate: a sandbox's background spinner falls to the idle budget
// once the gate is lowered, gets its CPU back at once when it is raised,
// and the switch is a single cheap write.
func TestCPUGate(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "cpugate")
	spec.CPU = 1
	spec.Priority = api.PriorityLatency
	inst := f.start(t, spec)
	g, err := f.rt.CPUGate(inst.Handle, 1, 0.02)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var res agentproto.ExecResult
	if err := inst.Agent.Call(ctx, agentproto.OpExec, &agentproto.ExecRequest{Cmd: "yes > /dev/null", Background: true}, &res, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if r := cpuRate(t, g, 500*time.Millisecond); r < 0.05 {
		t.Fatalf("the spinner uses only %.3f cores at full CPU; the test cannot tell", r)
	}
	if err := g.Set(false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // one period to settle
	if r := cpuRate(t, g, time.Second); r > 0.04 {
		t.Errorf("lowered: the spinner uses %.3f cores, want the 0.02 idle budget", r)
	}
	_, th0, _ := g.Sample()
	if err := g.Set(true); err != nil {
		t.Fatal(err)
	}
	if r := cpuRate(t, g, 500*time.Millisecond); r < 0.05 {
		t.Errorf("raised: the spinner uses only %.3f cores", r)
	}
	if _, th1, _ := g.Sample(); th0 <= 0 || th1 < th0 {
		t.Errorf("throttled time %d then %d: the idle period should have been counted", th0, th1)
	}
	const n = 2000
	t0 := time.Now()
	for i := 0; i < n; i++ {
		if err := g.Set(i%2 == 0); err != nil {
			t.Fatal(err)
		}
	}
	per := time.Since(t0) / n
	t0 = time.Now()
	for i := 0; i < n; i++ {
		if _, _, err := g.Sample(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("one switch: %v; one sample: %v", per, time.Since(t0)/n)
	if per > 200*time.Microsecond {
		t.Errorf("a switch takes %v", per)
	}

	// After a long stretch at the idle budget, a raise gives the whole
	// quota at once: a CPU-bound command is not throttled (a period timer
	// left armed by another level's period would hold it up to that
	// period: a 1 s idle period did, 465-977 ms per run). The spinner
	// stops meanwhile: beside it, the command shared the one core of the
	// quota and was throttled for that alone (256 ms in a loaded run).
	var stop agentproto.ExecResult
	if err := inst.Agent.Call(ctx, agentproto.OpExec, &agentproto.ExecRequest{Cmd: "killall yes; while pidof yes >/dev/null; do sleep 0.05; done"}, &stop, nil); err != nil || stop.ExitCode != 0 {
		t.Fatalf("stop the spinner: %v exit %d", err, stop.ExitCode)
	}
	if err := g.Set(false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := g.Set(true); err != nil {
		t.Fatal(err)
	}
	_, th0, _ = g.Sample()
	var burn agentproto.ExecResult
	if err := inst.Agent.Call(ctx, agentproto.OpExec, &agentproto.ExecRequest{Cmd: "i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done"}, &burn, nil); err != nil {
		t.Fatal(err)
	}
	// The bound is far below what the stale period timer cost.
	_, th1, _ := g.Sample()
	if th1-th0 > int64(250*time.Millisecond) {
		t.Errorf("a command after a raise was throttled for %v (it ran %.0f ms)", time.Duration(th1-th0), burn.Duration)
	}
	t.Logf("a command after a raise: throttled %v in %.0f ms", time.Duration(th1-th0), burn.Duration)
	// The spinner again, for the freezing below.
	if err := inst.Agent.Call(ctx, agentproto.OpExec, &agentproto.ExecRequest{Cmd: "yes > /dev/null", Background: true}, &res, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)

	// idle_cpu 0: frozen between operations, the agent too; the raise
	// thaws it, and a command sent right after runs at once.
	g0, err := f.rt.CPUGate(inst.Handle, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer g0.Close()
	if err := g0.Set(false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if r := cpuRate(t, g0, 2*time.Second); r > 0.002 {
		t.Errorf("idle_cpu 0: the spinner uses %.4f cores, want none (frozen)", r)
	}
	if st := freezerState(t, f.rt, inst.Handle.Cgroup); st != "FROZEN" {
		t.Errorf("idle_cpu 0: the sandbox's freezer is %s", st)
	}
	t0 = time.Now()
	if err := g0.Set(true); err != nil {
		t.Fatal(err)
	}
	if st := freezerState(t, f.rt, inst.Handle.Cgroup); st != "THAWED" {
		t.Errorf("raised from idle_cpu 0: the sandbox's freezer is %s", st)
	}
	var echo agentproto.ExecResult
	ectx, ecancel := context.WithTimeout(ctx, 2*time.Second)
	defer ecancel()
	if err := inst.Agent.Call(ectx, agentproto.OpExec, &agentproto.ExecRequest{Cmd: "echo ok", Collect: true}, &echo, nil); err != nil || string(echo.Stdout) != "ok\n" {
		t.Fatalf("exec after the raise from frozen: %v %q", err, echo.Stdout)
	}
	t.Logf("raise from frozen to the answer of an exec: %v", time.Since(t0))
	if r := cpuRate(t, g0, 500*time.Millisecond); r < 0.05 {
		t.Errorf("raised from idle_cpu 0: the spinner uses only %.3f cores", r)
	}
}

// freezerState is the sandbox's freezer as the gate of idle_cpu 0 sets it:
// FROZEN (or FREEZING) and THAWED, from v1's freezer.state or v2's
// cgroup.freeze.
func freezerState(t *testing.T, rt *Runtime, cg string) string {
	t.Helper()
	path := filepath.Join(rt.cg.unified(cg), "cgroup.freeze")
	if d, ok := rt.cg.(*v1Driver); ok && d.unified(cg) == "" {
		b, err := os.ReadFile(filepath.Join(d.root, "freezer", cg, "freezer.state"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(b)) == "1" {
		return "FROZEN"
	}
	return "THAWED"
}

// TestBestEffortClassCap: on cgroup v2, best-effort sandboxes live under
// the class's parent cgroup (lowest weight, cpu.idle), which ClassCap caps
// as a whole with one write and releases with another; Leftovers and a
// handle made from the id alone find the sandbox there. On cgroup v1 the
// kernel refuses a parent quota below a child's, so the runtime keeps the
// flat layout and offers no cap.
func TestBestEffortClassCap(t *testing.T) {
	f := newFixture(t)
	if _, err := f.rt.ClassCap(0.05); err == nil {
		t.Errorf("ClassCap before any best-effort sandbox: no error")
	}
	spec := f.spec(t, "classcap")
	spec.CPU = 1
	spec.Priority = api.PriorityBestEffort
	inst := f.start(t, spec)
	if d, ok := f.rt.cg.(*v1Driver); ok {
		if want := f.parent + "/classcap"; inst.Handle.Cgroup != want {
			t.Errorf("best-effort cgroup on v1 %s, want %s", inst.Handle.Cgroup, want)
		}
		if _, err := f.rt.ClassCap(0.05); !errors.Is(err, ErrClassCapV1) {
			t.Errorf("ClassCap on cgroup v1: %v, want ErrClassCapV1", err)
		}
		// The kernel rule that forbids it: a parent (here the sandboxes'
		// parent, whose child has its cpu's quota) cannot take a quota
		// below a child's.
		q := filepath.Join(d.mountOf("cpu"), f.parent, "cpu.cfs_quota_us")
		err := os.WriteFile(q, []byte("5000"), 0)
		if !errors.Is(err, unix.EINVAL) {
			t.Errorf("a v1 parent quota below its child's: %v, want EINVAL", err)
		}
		_ = os.WriteFile(q, []byte("-1"), 0)
		return
	}
	if want := f.parent + "/" + ClassBestEffort + "/classcap"; inst.Handle.Cgroup != want {
		t.Fatalf("best-effort cgroup %s, want %s", inst.Handle.Cgroup, want)
	}
	if got := f.rt.cgroupPath("classcap"); got != inst.Handle.Cgroup {
		t.Errorf("cgroupPath from the id: %s", got)
	}
	left, err := f.rt.Leftovers(context.Background())
	if err != nil || len(left) != 1 || left[0].ID != "classcap" || left[0].Cgroup != inst.Handle.Cgroup {
		t.Errorf("Leftovers = %+v, %v", left, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var res agentproto.ExecResult
	if err := inst.Agent.Call(ctx, agentproto.OpExec, &agentproto.ExecRequest{Cmd: "yes > /dev/null", Background: true}, &res, nil); err != nil {
		t.Fatal(err)
	}
	g, err := f.rt.ClassCap(0.05)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	time.Sleep(200 * time.Millisecond)
	if r := cpuRate(t, g, 500*time.Millisecond); r < 0.06 {
		t.Fatalf("the spinner uses only %.3f cores uncapped; the test cannot tell", r)
	}
	if err := g.Set(false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if r := cpuRate(t, g, time.Second); r > 0.07 {
		t.Errorf("capped: the class uses %.3f cores, want at most the 0.05 cap", r)
	}
	if err := g.Set(true); err != nil {
		t.Fatal(err)
	}
	if r := cpuRate(t, g, 500*time.Millisecond); r < 0.06 {
		t.Errorf("released: the class uses only %.3f cores", r)
	}
}
