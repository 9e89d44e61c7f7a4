package e2e

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// schedPolicy reads the scheduling policy of pid from /proc/<pid>/sched
// ("policy : N"); 5 is SCHED_IDLE, 0 SCHED_NORMAL.
func schedPolicy(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/sched")
	if err != nil {
		t.Skipf("SKIP: /proc/<pid>/sched is unreadable: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "policy" {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	t.Fatalf("no policy in /proc/%d/sched", pid)
	return -1
}

func TestPriorityAndNodeView(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	be := s.create(t, api.CreateSandboxRequest{Labels: map[string]string{"t": "prio"}})
	lat := s.create(t, api.CreateSandboxRequest{Priority: api.PriorityLatency, Labels: map[string]string{"t": "prio"}})
	if be.Priority != api.PriorityBestEffort || lat.Priority != api.PriorityLatency {
		t.Fatalf("priorities: %q %q", be.Priority, lat.Priority)
	}
	if p := schedPolicy(t, agentPid(t, s, be.ID)); p != 5 {
		t.Errorf("best-effort agent policy %d, want 5 (SCHED_IDLE)", p)
	}
	if p := schedPolicy(t, agentPid(t, s, lat.ID)); p != 0 {
		t.Errorf("latency agent policy %d, want 0 (SCHED_NORMAL)", p)
	}
	// Inside: the shell that runs a command inherits the class ("policy" of itself).
	if r := s.sh(t, be.ID, "grep ^policy /proc/self/sched"); !strings.Contains(r.Stdout, "5") {
		t.Errorf("best-effort command: %q", r.Stdout)
	}
	_, err := s.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Priority: "realtime"})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeInvalid {
		t.Errorf("bad priority: %v", err)
	}

	// The node view has the new figures (after a heartbeat).
	var n api.Node
	deadline := time.Now().Add(5 * time.Second)
	for {
		nodes, err := s.C.Nodes(ctx)
		if err != nil || len(nodes) != 1 {
			t.Fatalf("nodes: %v %v", nodes, err)
		}
		n = nodes[0]
		if n.SandboxesByPriority[api.PriorityLatency] >= 1 && n.SandboxesByPriority[api.PriorityBestEffort] >= 1 && n.MemoryUsedMB > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node view never counted the sandboxes: %+v", n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n.SandboxesByState[api.StateRunning] < 2 || n.MemoryAvailableMB <= 0 || n.CPUOvercommit != 20 || n.MemoryOvercommit != 1.5 {
		t.Errorf("node view: %+v", n)
	}
	if !n.Features.SchedIdle || !n.Features.Freezer {
		t.Errorf("features: %+v", n.Features)
	}
	if _, err := os.Stat("/proc/pressure/memory"); err == nil && !n.Features.PSI {
		t.Errorf("PSI not reported: %+v", n.Features)
	}
	t.Logf("node: %+v", n)
}

func TestAdmissionRefusesUnderMeasuredPressure(t *testing.T) {
	// A reserve larger than the machine: every create must be refused by
	// the measured-pressure check, with a reason, and nothing half-made.
	s := startServer(t, "--min-memory-available-mb", "100000000")
	ctx := context.Background()
	once := warren.New(s.URL, s.Token, warren.WithRetry(1, time.Millisecond, time.Millisecond))
	_, err := once.Create(ctx, api.CreateSandboxRequest{Image: "busybox"})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeUnavailable || !strings.Contains(ae.Message, "memory pressure") {
		t.Fatalf("create under pressure: %v", err)
	}
	code, body := s.rawRequest(t, "POST", "/v1/sandboxes", s.Token, []byte(`{"image":"busybox"}`), nil)
	if code != 503 || !strings.Contains(body, "MiB available") {
		t.Fatalf("raw create: %d %s", code, body)
	}
	l, err := s.C.List(ctx, warren.ListOptions{})
	if err != nil || len(l) != 0 {
		t.Fatalf("list after refusals: %v %v", l, err)
	}
	// Capacity × overcommit: 2 cores × 0.5 = 1 core; a second 1-core sandbox does not fit.
	s2 := startServer(t, "--cpu-overcommit", "0.5", "--min-memory-available-mb", "-1")
	s2.create(t, api.CreateSandboxRequest{CPU: 1})
	once2 := warren.New(s2.URL, s2.Token, warren.WithRetry(1, time.Millisecond, time.Millisecond))
	_, err = once2.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 1})
	if !errors.As(err, &ae) || ae.Code != api.CodeUnavailable {
		t.Fatalf("create beyond capacity: %v", err)
	}
}
