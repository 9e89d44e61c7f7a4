package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// cgroupUsage reads the cumulative CPU time (ns) of the cgroup that holds
// pid: cpuacct.usage on cgroup v1, cpu.stat's usage_usec on v2.
func cgroupUsage(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var v2 string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "cpuacct" {
				u, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpuacct", parts[2], "cpuacct.usage"))
				if err != nil {
					t.Fatal(err)
				}
				n, _ := strconv.ParseInt(strings.TrimSpace(string(u)), 10, 64)
				return n
			}
		}
		if parts[0] == "0" {
			v2 = parts[2]
		}
	}
	s, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", v2, "cpu.stat"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n * 1000
		}
	}
	t.Fatal("no usage_usec")
	return 0
}

// cgroupQuota reads the CFS quota (µs per 100 ms period) of the cgroup
// that holds pid: cpu.cfs_quota_us on cgroup v1, cpu.max's first field on
// v2 (-1 for max).
func cgroupQuota(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	var v2 string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if slices.Contains(strings.Split(parts[1], ","), "cpu") {
			q, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/cpu", parts[2], "cpu.cfs_quota_us"))
			if err != nil {
				t.Fatal(err)
			}
			n, _ := strconv.ParseInt(strings.TrimSpace(string(q)), 10, 64)
			return n
		}
		if parts[0] == "0" {
			v2 = parts[2]
		}
	}
	q, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", v2, "cpu.max"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(q))
	if len(f) == 0 || f[0] == "max" {
		return -1
	}
	n, _ := strconv.ParseInt(f[0], 10, 64)
	return n
}

// cpuRateOf is the cores pid's cgroup uses over d.
func cpuRateOf(t *testing.T, pid int, d time.Duration) float64 {
	t.Helper()
	u0, t0 := cgroupUsage(t, pid), time.Now()
	time.Sleep(d)
	return float64(cgroupUsage(t, pid)-u0) / float64(time.Since(t0).Nanoseconds())
}

// spin starts a background CPU burner in the sandbox and waits until its
// cgroup burns at least some CPU at full level... or returns the rate
// measured while an operation keeps the CPU raised.
func spin(t *testing.T, s *server, id string) {
	t.Helper()
	if r := s.sh(t, id, "yes > /dev/null 2>&1 &"); r.ExitCode != 0 {
		t.Fatalf("start spinner: %+v", r)
	}
}

// TestCPUOnlyWhileWorkRuns: a sandbox's background spinner gets the idle
// budget between operations, its next exec runs at full speed, always_on
// keeps the CPU, a paused-then-resumed sandbox keeps the policy, and the
// sandbox and node views show the split.
func TestCPUOnlyWhileWorkRuns(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	idle := 0.02
	gated := s.create(t, api.CreateSandboxRequest{CPU: 1, IdleCPU: &idle, Priority: api.PriorityLatency})
	on := s.create(t, api.CreateSandboxRequest{CPU: 1, AlwaysOn: true, Priority: api.PriorityLatency})
	if gated.IdleCPU != 0.02 || gated.AlwaysOn || !on.AlwaysOn {
		t.Errorf("views: idle_cpu %g always_on %v / %v", gated.IdleCPU, gated.AlwaysOn, on.AlwaysOn)
	}
	gpid, opid := agentPid(t, s, gated.ID), agentPid(t, s, on.ID)
	spin(t, s, gated.ID)
	spin(t, s, on.ID)
	time.Sleep(time.Second) // one second to settle
	rg, ro := cpuRateOf(t, gpid, 2*time.Second), cpuRateOf(t, opid, 2*time.Second)
	t.Logf("between operations: gated %.3f cores, always_on %.3f cores", rg, ro)
	if rg > 0.04 {
		t.Errorf("between operations the gated sandbox uses %.3f cores, want its 0.02 idle budget", rg)
	}
	if ro < 0.05 {
		t.Errorf("the always_on sandbox uses only %.3f cores between operations", ro)
	}

	// The next exec runs at full speed: a CPU-bound loop takes about as
	// long as in the always_on sandbox (both compete with their own
	// spinner and with each other equally).
	const burn = "i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done"
	var dg, do []time.Duration
	for i := 0; i < 5; i++ {
		order := []string{gated.ID, on.ID}
		if i%2 == 1 {
			order = []string{on.ID, gated.ID}
		}
		for _, id := range order {
			r := s.sh(t, id, burn)
			if r.ExitCode != 0 {
				t.Fatalf("burn: %+v", r)
			}
			d := time.Duration(r.DurationMs * float64(time.Millisecond))
			if id == gated.ID {
				dg = append(dg, d)
			} else {
				do = append(do, d)
			}
		}
	}
	slices.Sort(dg)
	slices.Sort(do)
	t.Logf("CPU-bound exec: gated %v, always_on %v (sorted)", dg, do)
	// At its 0.02 idle budget the loop would take 20-50 times as long. On
	// this loaded machine, with the spinner beside it, the gated run is
	// measured at 1-3.5 times the always_on one (docs/BENCHMARKS.md; not
	// understood yet), so the bound is loose.
	if mg, mo := dg[2], do[2]; mg > mo*4+300*time.Millisecond {
		t.Errorf("the gated sandbox's exec took %v (median) against %v always_on: it did not get its CPU", mg, mo)
	}

	// Paused, then resumed: still gated between operations.
	if _, err := s.C.Pause(ctx, gated.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.C.Resume(ctx, gated.ID); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if r := cpuRateOf(t, gpid, 2*time.Second); r > 0.04 {
		t.Errorf("after pause and resume the gated sandbox uses %.3f cores between operations", r)
	}
	// ... and still raised while an operation runs: the quota in effect
	// during a command is the full cpu, and the idle budget after it.
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.sh(t, gated.ID, "sleep 1")
	}()
	time.Sleep(400 * time.Millisecond)
	if q := cgroupQuota(t, gpid); q != 100000 {
		t.Errorf("after pause and resume, during an operation: quota %d, want the full 100000", q)
	}
	<-done
	if q := cgroupQuota(t, gpid); q != 2000 {
		t.Errorf("after pause and resume, after the operation: quota %d, want the idle 2000", q)
	}

	// The views: the sandbox's split, the node's sums.
	v, err := s.C.Get(ctx, gated.ID)
	if err != nil {
		t.Fatal(err)
	}
	cs := v.CPUStats
	if cs == nil || cs.Level != "idle" || cs.Idle <= 0 || cs.Active <= 0 || cs.Throttled <= 1 {
		t.Errorf("cpu stats of the gated sandbox: %+v", cs)
	} else {
		t.Logf("gated: %+v", *cs)
	}
	if st, err := s.C.Stats(ctx, gated.ID); err != nil || st.CPUStats == nil || st.CPUStats.Idle <= 0 || st.CPUStats.Active <= 0 {
		t.Errorf("stats of the gated sandbox: %+v %v", st, err)
	}
	if v, err := s.C.Get(ctx, on.ID); err != nil || v.CPUStats == nil || v.CPUStats.Level != "full" {
		t.Errorf("cpu stats of the always_on sandbox: %+v %v", v, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		nodes, err := s.C.Nodes(ctx)
		if err != nil || len(nodes) == 0 {
			t.Fatalf("nodes: %v %v", nodes, err)
		}
		el := nodes[0].Elastic
		if el.IdleSandboxes >= 1 && el.HarvestedSeconds > 1 && el.ActiveSeconds > 0 {
			t.Logf("node: %+v", el)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node view: %+v", el)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Bad input is refused.
	for _, bad := range []float64{-1, 2} {
		b := bad
		if _, err := s.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 1, IdleCPU: &b}); err == nil ||
			!strings.Contains(err.Error(), "idle_cpu") {
			t.Errorf("idle_cpu %g: %v", bad, err)
		}
	}
}

// TestKeepCPU: a background command started with keep_cpu keeps the
// sandbox's full CPU while it runs, and the sandbox falls back to its idle
// budget once it ends.
func TestKeepCPU(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	idle := 0.02
	sb := s.create(t, api.CreateSandboxRequest{CPU: 1, IdleCPU: &idle, Priority: api.PriorityLatency})
	pid := agentPid(t, s, sb.ID)
	r, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "timeout 4 yes > /dev/null", Background: true, KeepCPU: true})
	if err != nil || r.CommandID == "" {
		t.Fatalf("background: %+v %v", r, err)
	}
	time.Sleep(500 * time.Millisecond)
	if rate := cpuRateOf(t, pid, time.Second); rate < 0.05 {
		t.Errorf("keep_cpu: the command gets only %.3f cores", rate)
	}
	time.Sleep(4 * time.Second) // it ended
	spin(t, s, sb.ID)
	time.Sleep(500 * time.Millisecond)
	if rate := cpuRateOf(t, pid, time.Second); rate > 0.04 {
		t.Errorf("after the keep_cpu command ended the sandbox uses %.3f cores between operations", rate)
	}
	if _, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "true", KeepCPU: true}); err == nil {
		t.Errorf("keep_cpu without background was accepted")
	}
}

// TestCPUGateRecycledAndAdopted: a sandbox in the recycled container of an
// always_on one gets its own idle budget, and after a crash of warren
// (kill -9) while the sandbox had its full CPU, the restarted edge puts
// the adopted sandbox back at its idle budget.
func TestCPUGateRecycledAndAdopted(t *testing.T) {
	s := startServer(t, "--recycle-idle", "30s")
	ctx := context.Background()
	shape := api.CreateSandboxRequest{CPU: 1, MemoryMB: 128, Priority: api.PriorityLatency}
	first := shape
	first.AlwaysOn = true
	a := s.create(t, first)
	if _, err := s.C.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Kept >= 1 })
	second := shape
	idle := 0.02
	second.IdleCPU = &idle
	b := s.create(t, second)
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Reused >= 1 })
	pid := agentPid(t, s, b.ID)
	spin(t, s, b.ID)
	time.Sleep(500 * time.Millisecond)
	if r := cpuRateOf(t, pid, 2*time.Second); r > 0.04 {
		t.Errorf("in the recycled container of an always_on sandbox: %.3f cores between operations", r)
	}

	// Full CPU at the crash: a keep_cpu command holds it.
	if _, err := s.C.Exec(ctx, b.ID, api.ExecRequest{Cmd: "sleep 1000", Background: true, KeepCPU: true}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	if r := cpuRateOf(t, pid, time.Second); r < 0.05 {
		t.Fatalf("keep_cpu: %.3f cores", r)
	}
	s.kill9()
	s.start()
	if got, err := s.C.Get(ctx, b.ID); err != nil || got.State != api.StateRunning {
		t.Fatalf("not adopted: %+v %v", got, err)
	}
	time.Sleep(300 * time.Millisecond)
	if r := cpuRateOf(t, pid, 2*time.Second); r > 0.04 {
		t.Errorf("adopted after a crash at full CPU: %.3f cores between operations", r)
	}
	if r := s.sh(t, b.ID, "echo ok"); r.Stdout != "ok\n" {
		t.Errorf("exec after adoption: %+v", r)
	}
}

// TestProjectIdleCPU: a project's idle_cpu is the default of its
// sandboxes and its subprojects' sandboxes; a create's own wins.
func TestProjectIdleCPU(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	v := 0.03
	if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: "cpugate", IdleCPU: &v}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: "sub", Parent: "cpugate"}); err != nil {
		t.Fatal(err)
	}
	bad := -1.0
	if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: "bad", IdleCPU: &bad}); err == nil || !strings.Contains(err.Error(), "idle_cpu") {
		t.Errorf("project idle_cpu -1: %v", err)
	}
	own := 0.1
	for _, c := range []struct {
		req  api.CreateSandboxRequest
		want float64
	}{
		{api.CreateSandboxRequest{Project: "cpugate.sub"}, 0.03},
		{api.CreateSandboxRequest{Project: "cpugate", IdleCPU: &own}, 0.1},
		{api.CreateSandboxRequest{Project: "cpugate", CPU: 0.02}, 0.02},
		{api.CreateSandboxRequest{}, 0.05},
	} {
		sb := s.create(t, c.req)
		if sb.IdleCPU != c.want {
			t.Errorf("project %q, idle_cpu %v, cpu %g: got idle_cpu %g, want %g", c.req.Project, c.req.IdleCPU, c.req.CPU, sb.IdleCPU, c.want)
		}
	}
}

// TestAdmissionCountsIdleBudget: on a node whose cpu is all requested, a
// best-effort create still fits while the best-effort sandboxes wait
// between operations (they count with their idle_cpu); a latency-class
// create does not (its guarantee is the full request).
func TestAdmissionCountsIdleBudget(t *testing.T) {
	// 2 cores × 0.5 = 1 core to admit; no CPU-pressure check (the test
	// machine is loaded by other jobs).
	s := startServer(t, "--cpu-overcommit", "0.5", "--max-cpu-pressure", "-1")
	ctx := context.Background()
	a := s.create(t, api.CreateSandboxRequest{CPU: 1})
	deadline := time.Now().Add(10 * time.Second)
	for {
		nodes, err := s.C.Nodes(ctx)
		if err != nil || len(nodes) != 1 {
			t.Fatalf("nodes: %v %v", nodes, err)
		}
		if el := nodes[0].Elastic; el.FreedCPU >= 0.94 && el.IdleSandboxes == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node view never showed the freed cpu: %+v", nodes[0].Elastic)
		}
		time.Sleep(200 * time.Millisecond)
	}
	b := s.create(t, api.CreateSandboxRequest{CPU: 0.9})
	if b.State != api.StateRunning {
		t.Fatalf("best-effort create on the idle budget: %+v", b)
	}
	once := warren.New(s.URL, s.Token, warren.WithRetry(1, time.Millisecond, time.Millisecond))
	_, err := once.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.5, Priority: api.PriorityLatency})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeUnavailable {
		t.Errorf("latency-class create on a node whose cpu is all requested: %v", err)
	}
	// Both still work at full speed when asked.
	for _, id := range []string{a.ID, b.ID} {
		if r := s.sh(t, id, "echo ok"); r.Stdout != "ok\n" {
			t.Errorf("exec in %s: %+v", id, r)
		}
	}
}

// TestIdleCPUZeroFreezes: idle_cpu 0 freezes the sandbox between
// operations (its background spinner uses no CPU at all), every operation
// thaws it first and runs whole, and the policy holds after a pause and
// resume and after the server was killed with -9 and adopted it again (the
// frozen agent is thawed to attach, and frozen again).
func TestIdleCPUZeroFreezes(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	zero := 0.0
	sb := s.create(t, api.CreateSandboxRequest{CPU: 1, IdleCPU: &zero, Priority: api.PriorityLatency})
	if sb.IdleCPU != 0 {
		t.Errorf("view: idle_cpu %g", sb.IdleCPU)
	}
	pid := agentPid(t, s, sb.ID)
	spin(t, s, sb.ID)
	frozen := func(when string) {
		t.Helper()
		time.Sleep(300 * time.Millisecond)
		if r := cpuRateOf(t, pid, 2*time.Second); r > 0.003 {
			t.Errorf("%s: the sandbox uses %.4f cores between operations, want none (frozen)", when, r)
		}
		t0 := time.Now()
		r := s.sh(t, sb.ID, "echo $((6*7))")
		if r.ExitCode != 0 || r.Stdout != "42\n" {
			t.Errorf("%s: exec after frozen: %+v", when, r)
		}
		t.Logf("%s: exec from frozen answered in %v", when, time.Since(t0).Round(time.Microsecond))
		// During an operation the spinner runs.
		done := make(chan struct{})
		go func() {
			defer close(done)
			s.sh(t, sb.ID, "sleep 1")
		}()
		time.Sleep(300 * time.Millisecond)
		if r := cpuRateOf(t, pid, 500*time.Millisecond); r < 0.2 {
			t.Errorf("%s: during an operation the sandbox uses only %.3f cores", when, r)
		}
		<-done
	}
	frozen("created")
	if _, err := s.C.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.C.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	frozen("paused and resumed")
	s.kill9()
	took := s.restartWithin(t, 5*time.Second)
	t.Logf("restart served after %v", took.Round(time.Millisecond))
	if v, err := s.C.Get(ctx, sb.ID); err != nil || v.State != api.StateRunning {
		t.Fatalf("after the restart: %+v %v", v, err)
	}
	frozen("adopted")
	if _, err := s.C.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s.stop()
	assertNoLeaks(t, s)
}

// TestIdleCPUZeroRecycled: the container of a deleted idle_cpu 0 sandbox,
// frozen between its operations, is thawed before it is wiped and kept,
// and the next sandbox in it (idle_cpu 0.02) runs at its own budget and
// answers; the reverse (idle_cpu 0 in the container of an idle_cpu 0.02
// sandbox) is frozen between operations.
func TestIdleCPUZeroRecycled(t *testing.T) {
	s := startServer(t, "--recycle-idle", "30s")
	ctx := context.Background()
	shape := api.CreateSandboxRequest{CPU: 1, MemoryMB: 128, Priority: api.PriorityLatency}
	zero, small := 0.0, 0.02
	kept := 0
	for i, c := range []struct {
		idle     *float64
		min, max float64
	}{{&zero, 0, 0.003}, {&small, 0.005, 0.04}, {&zero, 0, 0.003}} {
		req := shape
		req.IdleCPU = c.idle
		sb := s.create(t, req)
		if i > 0 {
			s.recycling(t, func(r api.NodeRecycling) bool { return r.Reused >= int64(i) })
		}
		pid := agentPid(t, s, sb.ID)
		spin(t, s, sb.ID)
		time.Sleep(500 * time.Millisecond)
		if r := cpuRateOf(t, pid, 2*time.Second); r < c.min || r > c.max {
			t.Errorf("sandbox %d (idle_cpu %g): %.4f cores between operations, want %g–%g", i, *c.idle, r, c.min, c.max)
		}
		if r := s.sh(t, sb.ID, "echo ok"); r.Stdout != "ok\n" {
			t.Errorf("sandbox %d: exec: %+v", i, r)
		}
		if _, err := s.C.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		kept++
		s.recycling(t, func(r api.NodeRecycling) bool { return r.Kept >= int64(kept) })
	}
}
