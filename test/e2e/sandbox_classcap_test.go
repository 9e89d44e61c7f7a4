package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// classCPUDir is the directory, in the hierarchy that carries the cpu
// controller, of the parent of the cgroup that holds pid (the best-effort
// class's cgroup for a best-effort sandbox's agent), and whether that is
// cgroup v1.
func classCPUDir(t *testing.T, pid int) (string, bool) {
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
			return filepath.Join("/sys/fs/cgroup/cpu", filepath.Dir(parts[2])), true
		}
		if parts[0] == "0" {
			v2 = parts[2]
		}
	}
	// On v2 the agent may live in a child of the sandbox's cgroup (the
	// trust split): the class is the nearest "besteffort" above it.
	for d := filepath.Dir(v2); d != "/" && d != "."; d = filepath.Dir(d) {
		if filepath.Base(d) == "besteffort" {
			return filepath.Join("/sys/fs/cgroup", d), false
		}
	}
	return filepath.Join("/sys/fs/cgroup", filepath.Dir(v2)), false
}

// dirQuota is the CFS quota (µs per 100 ms) of the cgroup directory dir,
// -1 when unlimited.
func dirQuota(t *testing.T, dir string, v1 bool) int64 {
	t.Helper()
	name := "cpu.max"
	if v1 {
		name = "cpu.cfs_quota_us"
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) == 0 || f[0] == "max" {
		return -1
	}
	n, _ := strconv.ParseInt(f[0], 10, 64)
	return n
}

// TestBestEffortClassCapped (issue 21 item 5): while a latency-class
// sandbox runs an operation, the best-effort class's parent cgroup has the
// node's --best-effort-cap as its quota (on this host's cgroup v1 cpu
// controller too), a spinning best-effort process gets no more than the
// cap meanwhile, and the cap is released when the operation ends.
func TestBestEffortClassCapped(t *testing.T) {
	s := startServer(t, "--best-effort-cap", "0.03")
	be := s.create(t, api.CreateSandboxRequest{CPU: 1, AlwaysOn: true, Priority: api.PriorityBestEffort})
	lat := s.create(t, api.CreateSandboxRequest{CPU: 1, Priority: api.PriorityLatency})
	bpid := agentPid(t, s, be.ID)
	spin(t, s, be.ID)
	class, v1 := classCPUDir(t, bpid)
	t.Logf("best-effort class cgroup %s (v1 %v)", class, v1)
	if filepath.Base(class) != "besteffort" {
		t.Fatalf("the best-effort sandbox's cgroup is not in a class of its own: its parent is %s", class)
	}
	if q := dirQuota(t, class, v1); q != -1 {
		t.Errorf("no latency operation: the class's quota is %d, want none", q)
	}
	// The spinner is SCHED_IDLE: on a loaded host it gets what the other
	// jobs leave. Wait until it gets enough for the cap to show.
	var free float64
	for deadline := time.Now().Add(30 * time.Second); ; {
		if free = cpuRateOf(t, bpid, time.Second); free > 0.1 || time.Now().After(deadline) {
			break
		}
	}
	if free <= 0.1 {
		t.Fatalf("the best-effort spinner gets only %.3f cores uncapped; the test cannot tell", free)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if r := s.sh(t, lat.ID, "sleep 3"); r.ExitCode != 0 {
			t.Errorf("latency operation: %+v", r)
		}
	}()
	time.Sleep(500 * time.Millisecond)
	q := dirQuota(t, class, v1)
	capped := cpuRateOf(t, bpid, 2*time.Second)
	<-done
	after := dirQuota(t, class, v1)
	released := cpuRateOf(t, bpid, time.Second)
	t.Logf("best-effort spinner: %.3f cores before, %.3f during the latency operation, %.3f after; class quota %d during, %d after", free, capped, released, q, after)
	if q != 3000 {
		t.Errorf("during a latency operation the class's quota is %d, want the 0.03-core cap 3000", q)
	}
	if capped > 0.05 {
		t.Errorf("during a latency operation the best-effort spinner used %.3f cores, want at most the 0.03 cap", capped)
	}
	if after != -1 {
		t.Errorf("after the latency operation the class's quota is %d, want none", after)
	}
	// The spinner's own sandbox still gets its CPU in an operation of its
	// own, and the cap's clamp of its quota (cgroup v1) is undone.
	if r := s.sh(t, be.ID, "true"); r.ExitCode != 0 {
		t.Errorf("best-effort exec: %+v", r)
	}
	if q := cgroupQuota(t, bpid); q != 100000 {
		t.Errorf("the best-effort sandbox's own quota is %d after the cap, want its 100000", q)
	}
}
