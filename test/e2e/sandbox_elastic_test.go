package e2e

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/hoststat/swaptest"
	"github.com/warrenhq/warren/internal/serve"
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
		if n.SandboxesByPriority[api.PriorityLatency] >= 1 && n.SandboxesByPriority[api.PriorityBestEffort] >= 1 && n.MemoryUsedMB > 0 &&
			n.SandboxesByState[api.StateRunning] >= 2 { // a view of before both were created counts one as creating
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
	first := s2.create(t, api.CreateSandboxRequest{CPU: 1})
	once2 := warren.New(s2.URL, s2.Token, warren.WithRetry(1, time.Millisecond, time.Millisecond))
	_, err = once2.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 1})
	if !errors.As(err, &ae) || ae.Code != api.CodeUnavailable {
		t.Fatalf("create beyond capacity: %v", err)
	}
	// A stopped sandbox (kept as a tombstone) no longer counts, on the node
	// at once and in placement from the node's next heartbeat.
	if _, err := s2.C.Delete(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	var sb *api.Sandbox
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if sb, err = once2.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 1}); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("create after the first was deleted: %v", err)
	}
	if _, err := s2.C.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}

func (s *server) cgroupFile(t *testing.T, controller, id, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", controller, serve.CgroupParent(s.dataDir), id, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestPauseResume(t *testing.T) {
	swaptest.Ensure(t, 2048)
	s := sharedServer(t)
	ctx := context.Background()
	// A shape of its own (the hostname is part of it): a container recycled
	// from another test's sandbox of the same shape keeps that sandbox's
	// cgroup name, and cgroupFile reads the cgroup by this one's id.
	sb := s.create(t, api.CreateSandboxRequest{MemoryMB: 256, Hostname: "pause-resume", Labels: map[string]string{"job": "pause-a"}})
	// A shell holding ~64 MiB of anonymous memory.
	if _, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: `echo $$ >/tmp/holder; x=$(head -c 64000000 /dev/zero | tr '\0' a); echo ready >/tmp/ready; sleep 600`, Background: true}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.sh(t, sb.ID, "cat /tmp/ready 2>/dev/null").Stdout != "ready\n" {
		if time.Now().After(deadline) {
			t.Fatal("memory holder not ready")
		}
		time.Sleep(100 * time.Millisecond)
	}
	before, _ := strconv.ParseInt(s.cgroupFile(t, "memory", sb.ID, "memory.usage_in_bytes"), 10, 64)
	p, err := s.C.Pause(ctx, sb.ID)
	if err != nil || p.State != api.StatePaused || p.PausedAt == nil {
		t.Fatalf("pause: %+v %v", p, err)
	}
	after, _ := strconv.ParseInt(s.cgroupFile(t, "memory", sb.ID, "memory.usage_in_bytes"), 10, 64)
	t.Logf("paused: charged memory %d MiB -> %d MiB", before>>20, after>>20)
	if before < 60<<20 || after > before-50<<20 {
		t.Errorf("pause returned too little memory: %d -> %d", before, after)
	}
	if st := s.cgroupFile(t, "freezer", sb.ID, "freezer.state"); st != "FROZEN" {
		t.Errorf("freezer.state %s", st)
	}
	if l, err := s.C.List(ctx, warren.ListOptions{State: api.StatePaused, Labels: map[string]string{"job": "pause-a"}}); err != nil || len(l) != 1 {
		t.Errorf("list paused: %v %v", l, err)
	}
	if p2, err := s.C.Pause(ctx, sb.ID); err != nil || p2.State != api.StatePaused {
		t.Errorf("second pause: %+v %v", p2, err)
	}
	// Any operation resumes transparently; the memory holder survived.
	if r := s.sh(t, sb.ID, `kill -0 $(cat /tmp/holder) && echo alive`); r.Stdout != "alive\n" {
		t.Fatalf("after transparent resume: %+v", r)
	}
	if g, _ := s.C.Get(ctx, sb.ID); g.State != api.StateRunning || g.PausedAt != nil {
		t.Errorf("state after exec: %+v", g)
	}
	if st := s.cgroupFile(t, "freezer", sb.ID, "freezer.state"); st != "THAWED" {
		t.Errorf("freezer.state after resume %s", st)
	}
	// The sandbox's processes get the limit back (in the box cgroup; the
	// sandbox's cgroup adds the agent's 32 MiB).
	if lim := s.cgroupFile(t, "memory", sb.ID, "box/memory.limit_in_bytes"); lim != strconv.Itoa(256<<20) {
		t.Errorf("memory limit after resume %s", lim)
	}
	// Explicit resume; and a pause then delete leaves nothing behind.
	if _, err := s.C.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if r, err := s.C.Resume(ctx, sb.ID); err != nil || r.State != api.StateRunning {
		t.Fatalf("resume: %+v %v", r, err)
	}
	// The resume prefetched: the holder's memory is charged again before
	// anything touched it.
	back := int64(0)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && back < before-16<<20; time.Sleep(20 * time.Millisecond) {
		back, _ = strconv.ParseInt(s.cgroupFile(t, "memory", sb.ID, "memory.usage_in_bytes"), 10, 64)
	}
	if back < before-16<<20 {
		t.Errorf("after a prefetching resume the sandbox holds %d MiB of %d", back>>20, before>>20)
	}
	// Without prefetch; a bad body is a 400.
	if _, err := s.C.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if code, body := s.rawRequest(t, "POST", "/v1/sandboxes/"+sb.ID+"/resume", "", []byte(`{"prefetch":"no"}`), nil); code != 400 {
		t.Errorf("resume with a bad body: %d %s", code, body)
	}
	if r, err := s.C.ResumeWith(ctx, sb.ID, api.ResumeRequest{Prefetch: new(bool)}); err != nil || r.State != api.StateRunning {
		t.Fatalf("resume without prefetch: %+v %v", r, err)
	}
	if _, err := s.C.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if d, err := s.C.Delete(ctx, sb.ID); err != nil || d.State != api.StateStopped {
		t.Fatalf("delete paused: %+v %v", d, err)
	}
	var ae *api.Error
	if _, err := s.C.Pause(ctx, sb.ID); !errors.As(err, &ae) || ae.Code != api.CodeConflict {
		t.Errorf("pause of a stopped sandbox: %v", err)
	}
}

func TestJobPauseAndIdlePause(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	a := s.create(t, api.CreateSandboxRequest{Labels: map[string]string{"job": "pause-j", "rank": "0"}})
	b := s.create(t, api.CreateSandboxRequest{Labels: map[string]string{"job": "pause-j", "rank": "1"}})
	other := s.create(t, api.CreateSandboxRequest{Labels: map[string]string{"job": "pause-other"}})
	code, body := s.rawRequest(t, "POST", "/v1/sandboxes:pause", s.Token, []byte(`{"label":"job=pause-j"}`), nil)
	if code != 200 || !strings.Contains(body, a.ID) || !strings.Contains(body, b.ID) || strings.Contains(body, other.ID) {
		t.Fatalf("job pause: %d %s", code, body)
	}
	for _, id := range []string{a.ID, b.ID} {
		if g, _ := s.C.Get(ctx, id); g.State != api.StatePaused {
			t.Errorf("%s is %s", id, g.State)
		}
	}
	if g, _ := s.C.Get(ctx, other.ID); g.State != api.StateRunning {
		t.Errorf("other job's sandbox is %s", g.State)
	}
	res, err := s.C.ResumeMatching(ctx, map[string]string{"job": "pause-j"})
	if err != nil || len(res.Sandboxes) != 2 {
		t.Fatalf("job resume: %+v %v", res, err)
	}
	for _, bad := range []string{`{}`, `{"label":"nolabel"}`, `{"label":"=x"}`} {
		if code, body := s.rawRequest(t, "POST", "/v1/sandboxes:pause", s.Token, []byte(bad), nil); code != 422 {
			t.Errorf("pause %s: %d %s", bad, code, body)
		}
	}
	if code, _ := s.rawRequest(t, "POST", "/v1/sandboxes:pause", s.Token, []byte(`{"bogus":1}`), nil); code != 400 {
		t.Errorf("unknown field: %d", code)
	}

	// idle_timeout_action "pause": the reaper pauses instead of stopping.
	idle := s.create(t, api.CreateSandboxRequest{IdleTimeout: 1, IdleTimeoutAction: api.IdleActionPause})
	if idle.IdleAction != api.IdleActionPause {
		t.Fatalf("idle action %q", idle.IdleAction)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		g, err := s.C.Get(ctx, idle.ID)
		if err != nil {
			t.Fatal(err)
		}
		if g.State == api.StatePaused {
			break
		}
		if g.State != api.StateRunning || time.Now().After(deadline) {
			t.Fatalf("idle sandbox is %s (%s)", g.State, g.Reason)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if r := s.sh(t, idle.ID, "echo back"); r.Stdout != "back\n" {
		t.Fatalf("exec on idle-paused: %+v", r)
	}
	if _, err := s.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", IdleTimeoutAction: "hibernate"}); err == nil {
		t.Error("unknown idle_timeout_action accepted")
	}
}

func TestPausedSandboxSurvivesRestart(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{})
	s.sh(t, sb.ID, "echo kept >/tmp/kept")
	if _, err := s.C.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s.kill9()
	s.start()
	g, err := s.C.Get(ctx, sb.ID)
	if err != nil || g.State != api.StatePaused {
		t.Fatalf("after restart: %+v %v\n%s", g, err, tail(s.logs.String(), 20))
	}
	if st := s.cgroupFile(t, "freezer", sb.ID, "freezer.state"); st != "FROZEN" {
		t.Errorf("freezer.state after restart %s", st)
	}
	if r := s.sh(t, sb.ID, "cat /tmp/kept"); r.Stdout != "kept\n" {
		t.Fatalf("exec after restart: %+v", r)
	}
}
