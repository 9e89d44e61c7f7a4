package e2e

// A node that always comes back (issue 19, problems 5 and 6, and the
// crash-point test): kill -9 of the server in the middle of an operation,
// then a restart that must serve within seconds and leave every sandbox
// running, paused and consistent, or gone without a trace.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/hoststat/swaptest"
	"github.com/warrenhq/warren/internal/serve"
	warren "github.com/warrenhq/warren/sdk/go"
)

// restartWithin starts s again (after a kill9) with the extra command
// prefix wrap (e.g. prlimit), and fails the test unless /healthz answers
// within d. On failure it thaws the server's cgroups by hand first, so a
// server stuck on a frozen sandbox can still be stopped by the cleanup.
func (s *server) restartWithin(t *testing.T, d time.Duration) time.Duration {
	t.Helper()
	t0 := time.Now()
	if err := s.launch(nil, d); err != nil {
		thawAll(s.dataDir)
		if errors.Is(err, errNotHealthy) {
			// Give it the rest of the usual minute, so the cleanup stops it.
			_ = s.waitHealthy(60 * time.Second)
		}
		t.Fatalf("restart: %v after %v\nserver log:\n%s", err, time.Since(t0).Round(time.Millisecond), tail(s.logs.String(), 40))
	}
	return time.Since(t0)
}

var errNotHealthy = errors.New("/healthz did not answer")

// launch starts the server process (with wrap before it, if any) and waits
// up to d for /healthz; it sets s.C on success.
func (s *server) launch(wrap []string, d time.Duration) error {
	s.logs = &syncBuffer{}
	argv := append(append([]string{}, wrap...), bins.warren, "serve", "--data-dir", s.dataDir, "--listen", s.listen, "--agent", bins.agent, "--node", "e2e")
	argv = append(argv, s.args...)
	s.cmd = exec.Command(argv[0], argv[1:]...)
	s.cmd.Stdout = s.logs
	s.cmd.Stderr = s.logs
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	noteStarted(s.dataDir)
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.done = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	s.URL = "http://" + s.listen
	if err := s.waitHealthy(d); err != nil {
		return err
	}
	tok, err := os.ReadFile(filepath.Join(s.dataDir, "admin-token"))
	if err != nil {
		return err
	}
	s.Token = strings.TrimSpace(string(tok))
	s.C = warren.New(s.URL, s.Token)
	return nil
}

func (s *server) waitHealthy(d time.Duration) error {
	deadline := time.Now().Add(d)
	hc := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-s.done:
			return fmt.Errorf("warren serve exited early")
		default:
		}
		resp, err := hc.Get(s.URL + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return errNotHealthy
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// thawAll thaws every freezer cgroup of the server of dataDir: v1's, and
// the cgroup v2 freezer (idle_cpu 0, the trust split).
func thawAll(dataDir string) {
	for _, f := range []struct{ root, file, thawed string }{
		{"/sys/fs/cgroup/freezer", "freezer.state", "THAWED"},
		{"/sys/fs/cgroup/unified", "cgroup.freeze", "0"},
		{"/sys/fs/cgroup", "cgroup.freeze", "0"},
	} {
		root := filepath.Join(f.root, serve.CgroupParent(dataDir))
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = os.WriteFile(filepath.Join(p, f.file), []byte(f.thawed), 0)
			}
			return nil
		})
	}
}

// recordState is the state a sandbox's record on disk says.
func recordState(t *testing.T, s *server, id string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.dataDir, "edge", "sandboxes", id+".json"))
	if err != nil {
		return "(no record: " + err.Error() + ")"
	}
	var rec struct {
		Sandbox api.Sandbox `json:"sandbox"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return "(unreadable record)"
	}
	return rec.Sandbox.State
}

// cgroupValue reads a file of a sandbox's cgroup ("" when it is gone).
func (s *server) cgroupValue(controller, id, name string) string {
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", controller, serve.CgroupParent(s.dataDir), id, name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// checkUsableOrPaused fails unless the sandbox is running (thawed, its
// swappiness back to the parent's, exec works) or paused (frozen, and a
// resume brings it back with its files).
func checkUsableOrPaused(t *testing.T, s *server, id, file, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	g, err := s.C.Get(ctx, id)
	if err != nil {
		t.Fatalf("get %s after restart: %v", id, err)
	}
	store := storageOf(s, id)
	freezer := s.cgroupValue("freezer", store, "freezer.state")
	switch g.State {
	case api.StateRunning:
		if freezer != "THAWED" {
			t.Errorf("running sandbox's freezer.state is %q", freezer)
		}
		parent := strings.TrimSpace(readFile(filepath.Join("/sys/fs/cgroup/memory", serve.CgroupParent(s.dataDir), "memory.swappiness")))
		if sw := s.cgroupValue("memory", store, "memory.swappiness"); sw != parent {
			t.Errorf("running sandbox's memory.swappiness is %s, want the parent's %s", sw, parent)
		}
	case api.StatePaused:
		if freezer != "FROZEN" {
			t.Errorf("paused sandbox's freezer.state is %q", freezer)
		}
		if _, err := s.C.Resume(ctx, id); err != nil {
			t.Fatalf("resume after restart: %v", err)
		}
	default:
		t.Fatalf("sandbox %s is %s (%s) after restart", id, g.State, g.Reason)
	}
	r, err := s.C.Exec(ctx, id, api.ExecRequest{Cmd: "cat " + file})
	if err != nil || r.Stdout != want {
		t.Fatalf("exec after restart: %+v %v", r, err)
	}
}

// storageOf is the name of sandbox id's cgroup (its record's storage: a
// recycled container keeps its first name).
func storageOf(s *server, id string) string {
	b, err := os.ReadFile(filepath.Join(s.dataDir, "edge", "sandboxes", id+".json"))
	var r hostRecord
	if err == nil && json.Unmarshal(b, &r) == nil && r.Storage != "" {
		return r.Storage
	}
	return id
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// TestKillDuringPauseRestartServes (problem 5): the server is killed while
// a pause is under way, just after the freezer froze the sandbox; the
// restart answers /healthz within 5 s and the sandbox is running and thawed
// or paused and consistent.
func TestKillDuringPauseRestartServes(t *testing.T) {
	swaptest.Ensure(t, 2048)
	s := startServer(t)
	t.Cleanup(func() { thawAll(s.dataDir) })
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{MemoryMB: 512})
	s.sh(t, sb.ID, "echo kept >/tmp/kept")
	// Memory to push out, so the pause spends its time in reclaim after the freeze.
	if _, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: `x=$(head -c 150000000 /dev/zero | tr '\0' a); echo ready >/tmp/ready; sleep 3600`, Background: true}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for s.sh(t, sb.ID, "cat /tmp/ready 2>/dev/null").Stdout != "ready\n" {
		if time.Now().After(deadline) {
			t.Fatal("memory holder did not start")
		}
		time.Sleep(100 * time.Millisecond)
	}
	go func() { _, _ = s.C.Pause(context.Background(), sb.ID) }()
	state := filepath.Join("/sys/fs/cgroup/freezer", serve.CgroupParent(s.dataDir), sb.ID, "freezer.state")
	deadline = time.Now().Add(30 * time.Second)
	for strings.TrimSpace(readFile(state)) != "FROZEN" {
		if time.Now().After(deadline) {
			t.Fatal("the sandbox never froze")
		}
		time.Sleep(200 * time.Microsecond)
	}
	time.Sleep(5 * time.Millisecond)
	s.kill9()
	t.Logf("killed with freezer.state %s and the record saying %q", strings.TrimSpace(readFile(state)), recordState(t, s, sb.ID))

	took := s.restartWithin(t, 5*time.Second)
	t.Logf("restart served after %v", took.Round(time.Millisecond))
	checkUsableOrPaused(t, s, sb.ID, "/tmp/kept", "kept\n")
	if _, err := s.C.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s.stop()
	assertNoLeaks(t, s)
}

// TestRestartThawsFrozenRunningSandbox (problem 5, the state the issue saw):
// a record that says running over a frozen cgroup whose swappiness is 100
// (what a pause cut short left before the intent was recorded first). The
// restart serves within 5 s, and the sandbox comes back thawed, with its
// swappiness restored, and usable.
func TestRestartThawsFrozenRunningSandbox(t *testing.T) {
	s := startServer(t)
	t.Cleanup(func() { thawAll(s.dataDir) })
	sb := s.create(t, api.CreateSandboxRequest{})
	s.sh(t, sb.ID, "echo kept >/tmp/kept")
	s.kill9()
	cg := func(ctrl, name string) string {
		return filepath.Join("/sys/fs/cgroup", ctrl, serve.CgroupParent(s.dataDir), sb.ID, name)
	}
	if err := os.WriteFile(cg("memory", "memory.swappiness"), []byte("100"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cg("freezer", "freezer.state"), []byte("FROZEN"), 0); err != nil {
		t.Fatal(err)
	}
	if st := recordState(t, s, sb.ID); st != api.StateRunning {
		t.Fatalf("record says %q", st)
	}
	took := s.restartWithin(t, 5*time.Second)
	t.Logf("restart served after %v", took.Round(time.Millisecond))
	checkUsableOrPaused(t, s, sb.ID, "/tmp/kept", "kept\n")
	s.stop()
	assertNoLeaks(t, s)
}

// TestAdoptedSandboxesKeepTheirClocks (problem 6): the idle clock and the
// TTL run on while the server is down; a restart does not start them again.
func TestAdoptedSandboxesKeepTheirClocks(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	idle := s.create(t, api.CreateSandboxRequest{IdleTimeout: 8})
	ttl := s.create(t, api.CreateSandboxRequest{TTL: 9})
	keep := s.create(t, api.CreateSandboxRequest{IdleTimeout: 120})
	for _, id := range []string{idle.ID, ttl.ID, keep.ID} {
		s.sh(t, id, "true")
	}
	time.Sleep(3 * time.Second) // the reaper records the last activity meanwhile
	s.kill9()
	time.Sleep(7 * time.Second) // downtime: idle ≈ 10 s > 8 s; age ≈ 10 s > 9 s
	s.restartWithin(t, 10*time.Second)
	deadline := time.Now().Add(4 * time.Second)
	for _, c := range []struct{ id, why string }{{idle.ID, "idle timeout"}, {ttl.ID, "ttl expired"}} {
		for {
			g, err := s.C.Get(ctx, c.id)
			if err != nil {
				t.Fatal(err)
			}
			if g.State == api.StateStopped {
				if g.Reason != c.why {
					t.Errorf("%s stopped for %q, want %q", c.id, g.Reason, c.why)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s (%s) is still %s 4 s after the restart: its clock restarted at adoption", c.id, c.why, g.State)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if g, err := s.C.Get(ctx, keep.ID); err != nil || g.State != api.StateRunning {
		t.Fatalf("sandbox with a long idle timeout: %+v %v", g, err)
	}
	s.stop()
	assertNoLeaks(t, s)
}

// hostRecord is what the test reads of a sandbox record on disk.
type hostRecord struct {
	Sandbox api.Sandbox `json:"sandbox"`
	Storage string      `json:"storage"`
	Layer   string      `json:"layer"`
	Layers  []string    `json:"layers"`
}

// liveRecords reads the server's records of running and paused sandboxes,
// by storage name (the name of their cgroup).
func liveRecords(t *testing.T, s *server) map[string]hostRecord {
	t.Helper()
	out := map[string]hostRecord{}
	files, _ := filepath.Glob(filepath.Join(s.dataDir, "edge", "sandboxes", "*.json"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var r hostRecord
		if json.Unmarshal(b, &r) != nil {
			continue
		}
		if r.Sandbox.State != api.StateRunning && r.Sandbox.State != api.StatePaused {
			continue
		}
		store := r.Storage
		if store == "" {
			store = r.Sandbox.ID
		}
		out[store] = r
	}
	return out
}

// hostMismatch compares what the node reports with what the host holds:
// /v1/nodes counts the live records; every cgroup has a live record and
// vice versa; every writable layer (subvolume) and layer mount belongs to
// one; a frozen cgroup is a paused sandbox's and a paused sandbox's cgroup
// is frozen. "" = all agree.
func hostMismatch(t *testing.T, s *server) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs := liveRecords(t, s)
	nodes, err := s.C.Nodes(ctx)
	if err != nil {
		return "nodes: " + err.Error()
	}
	var problems []string
	if len(nodes) != 1 || nodes[0].Sandboxes != len(recs) {
		n := -1
		if len(nodes) == 1 {
			n = nodes[0].Sandboxes
		}
		problems = append(problems, fmt.Sprintf("/v1/nodes says %d sandboxes, the host has %d live records", n, len(recs)))
	}
	parent := filepath.Join("/sys/fs/cgroup/freezer", serve.CgroupParent(s.dataDir))
	ents, _ := os.ReadDir(parent)
	cgroups := map[string]bool{}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		cgroups[e.Name()] = true
		r, ok := recs[e.Name()]
		frozen := strings.TrimSpace(readFile(filepath.Join(parent, e.Name(), "freezer.state"))) != "THAWED"
		switch {
		case !ok:
			problems = append(problems, "cgroup without a live record: "+e.Name())
		case frozen && r.Sandbox.State != api.StatePaused:
			problems = append(problems, fmt.Sprintf("%s is frozen but recorded %s", r.Sandbox.ID, r.Sandbox.State))
		case !frozen && r.Sandbox.State == api.StatePaused:
			problems = append(problems, fmt.Sprintf("%s is recorded paused but not frozen", r.Sandbox.ID))
		}
	}
	layers := map[string]bool{}
	held := map[string]bool{} // layer mounts the live records hold, by hex digest
	for store, r := range recs {
		for _, d := range r.Layers {
			held[strings.TrimPrefix(d, "sha256:")] = true
		}
		if !cgroups[store] {
			problems = append(problems, "live record without a cgroup: "+r.Sandbox.ID)
		}
		l := r.Layer
		if l == "" {
			l = store
		}
		layers[l] = true
	}
	wents, _ := os.ReadDir(filepath.Join(s.dataDir, "writable"))
	for _, e := range wents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && !layers[e.Name()] {
			problems = append(problems, "writable layer without a live record: "+e.Name())
		}
	}
	mi := readFile("/proc/self/mountinfo")
	under := filepath.Join(s.dataDir, "layers") + "/"
	mounts := 0
	for _, l := range strings.Split(mi, "\n") {
		f := strings.Fields(l)
		if len(f) <= 4 || !strings.HasPrefix(f[4], under) {
			continue
		}
		mounts++
		if !held[strings.TrimPrefix(f[4], under)] {
			problems = append(problems, "layer mount no live record holds: "+f[4])
		}
	}
	if len(held) > 0 && mounts == 0 {
		problems = append(problems, fmt.Sprintf("%d live sandboxes hold layers, but no layer is mounted", len(recs)))
	}
	return strings.Join(problems, "; ")
}

// crashOp is one operation the crash-point test interrupts.
type crashOp struct {
	name string
	// within is how long after its start the kill may come.
	within time.Duration
	// prepare readies base for run (before the clock starts).
	prepare func(ctx context.Context, s *server, base string) error
	run     func(ctx context.Context, s *server, base string) error
}

func crashOps(batch int) []crashOp {
	none := func(context.Context, *server, string) error { return nil }
	return []crashOp{
		{"pause", 300 * time.Millisecond, none, func(ctx context.Context, s *server, base string) error {
			_, err := s.C.Pause(ctx, base)
			return err
		}},
		{"resume", 300 * time.Millisecond, func(ctx context.Context, s *server, base string) error {
			_, err := s.C.Pause(ctx, base)
			return err
		}, func(ctx context.Context, s *server, base string) error {
			_, err := s.C.Resume(ctx, base)
			return err
		}},
		{"snapshot", time.Second, none, func(ctx context.Context, s *server, base string) error {
			_, err := s.C.Snapshot(ctx, base, api.CreateSnapshotRequest{})
			return err
		}},
		{"fork-8", 2 * time.Second, none, func(ctx context.Context, s *server, base string) error {
			_, err := s.C.Fork(ctx, base, 8)
			return err
		}},
		{fmt.Sprintf("batch-%d", batch), 3 * time.Second, none, func(ctx context.Context, s *server, base string) error {
			_, err := s.C.BatchCreate(ctx, api.BatchCreateRequest{Count: batch, Spec: api.CreateSandboxRequest{Image: "busybox"}, IDsOnly: true})
			return err
		}},
		{"layer-publish", time.Second, none, func(ctx context.Context, s *server, base string) error {
			_, err := s.C.CreateLayerFromSandbox(ctx, base, "crash/layer", 0)
			return err
		}},
	}
}

// TestCrashPoints (issue 19): kill -9 at a random moment of pause, resume,
// snapshot, fork of 8, batch create and layer publish; each restart must
// serve within 5 s with the node's counts matching the host and no frozen
// or orphaned sandbox. WARREN_CRASH_ITERATIONS sets the number of
// iterations (default 6: each operation once; the run is 50),
// WARREN_CRASH_BATCH the batch size (default 20; the is 60).
func TestCrashPoints(t *testing.T) {
	iterations := envInt("WARREN_CRASH_ITERATIONS", 6)
	batch := envInt("WARREN_CRASH_BATCH", 20)
	seed := time.Now().UnixNano()
	t.Logf("%d iterations, batch %d, seed %d", iterations, batch, seed)
	rng := rand.New(rand.NewSource(seed))
	s := startServer(t)
	t.Cleanup(func() { thawAll(s.dataDir) })
	ops := crashOps(batch)
	var worst time.Duration
	for i := 0; i < iterations; i++ {
		op := ops[i%len(ops)]
		if i >= len(ops) {
			op = ops[rng.Intn(len(ops))]
		}
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		base, err := s.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", MemoryMB: 256})
		if err != nil {
			cancel()
			t.Fatalf("iteration %d: create: %v", i, err)
		}
		if _, err := s.C.Exec(ctx, base.ID, api.ExecRequest{Cmd: "head -c 20000000 /dev/urandom >/tmp/data; echo kept >/tmp/kept"}); err != nil {
			cancel()
			t.Fatalf("iteration %d: exec: %v", i, err)
		}
		if err := op.prepare(ctx, s, base.ID); err != nil {
			cancel()
			t.Fatalf("iteration %d: prepare %s: %v", i, op.name, err)
		}
		delay := time.Duration(rng.Int63n(int64(op.within)))
		go func() { _ = op.run(ctx, s, base.ID) }()
		time.Sleep(delay)
		s.kill9()
		cancel()
		took := s.restartWithin(t, 5*time.Second)
		worst = max(worst, took)
		deadline := time.Now().Add(15 * time.Second)
		for {
			// Refreezes and retries run in the background for a moment.
			p := hostMismatch(t, s)
			if p == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("iteration %d (%s, killed after %v): the node and the host disagree: %s\n%s", i, op.name, delay, p, tail(s.logs.String(), 40))
			}
			time.Sleep(250 * time.Millisecond)
		}
		t.Logf("iteration %d: %s killed after %v; served again after %v", i, op.name, delay.Round(time.Millisecond), took.Round(time.Millisecond))
		checkUsableOrPaused(t, s, base.ID, "/tmp/kept", "kept\n")
		// Start the next iteration with an empty node.
		list, err := s.C.List(context.Background(), warren.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range list {
			if sb.State == api.StateRunning || sb.State == api.StatePaused {
				if _, err := s.C.Delete(context.Background(), sb.ID); err != nil {
					t.Fatalf("delete %s: %v", sb.ID, err)
				}
			}
		}
	}
	t.Logf("slowest restart: %v", worst.Round(time.Millisecond))
	s.stop()
	assertNoLeaks(t, s)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}
