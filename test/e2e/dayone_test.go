package e2e

// Regression tests for the bugs a new user hit on the first day (issue 14).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// TestFnCallWorkersYieldToSandboxes: FnCall workers left idle after a burst
// must not keep sandboxes out. A create that needs their room evicts them,
// the burst itself leaves room for sandboxes, and a 503 names the resource
// that is short.
func TestFnCallWorkersYieldToSandboxes(t *testing.T) {
	// 2 cores x 2 = 4 cores to admit.
	s := startServer(t, "--cpu-overcommit", "2")
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.C.FnCall(ctx, api.FnCallRequest{Cmd: "sleep 0.3; echo ok", CPU: 1})
			if err == nil && r.Stdout != "ok\n" {
				err = fmt.Errorf("task answered %+v", r)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	var failed []string
	for err := range errs {
		if err != nil {
			failed = append(failed, err.Error())
		}
	}
	time.Sleep(time.Second) // the pool's background top-up settles

	// The idle workers give their room to sandboxes: two sandboxes of 2
	// cores fill the node (always_on: a waiting best-effort sandbox would
	// count at its idle_cpu and leave room).
	for i := 0; i < 2; i++ {
		s.create(t, api.CreateSandboxRequest{CPU: 2, MemoryMB: 64, AlwaysOn: true})
	}
	// The node is full now: the 503 says of what.
	_, err := s.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 1, MemoryMB: 64})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeUnavailable || ae.Reason != api.ReasonCPU || !strings.Contains(ae.Message, "cpu") {
		t.Fatalf("create on a full node: %v (%+v), want 503 with reason cpu", err, ae)
	}
	if len(failed) > 0 {
		t.Fatalf("%d of 8 tasks failed during the burst: %s", len(failed), strings.Join(failed, "; "))
	}
}

// TestDeletePausedSandboxes: deleting a paused sandbox is as quick as
// deleting a running one (it waited 10 s for its frozen agent to die).
// WARREN_PAUSED_N sets how many (default 10); the total is logged.
func TestDeletePausedSandboxes(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	n := 10
	if v := os.Getenv("WARREN_PAUSED_N"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	res, err := s.C.BatchCreate(ctx, api.BatchCreateRequest{Count: n, Spec: api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 32}})
	if err != nil || len(res.IDs) != n {
		t.Fatalf("batch create: %v %+v", err, res)
	}
	t.Cleanup(func() {
		for _, id := range res.IDs {
			_, _ = s.C.Delete(context.Background(), id)
		}
	})
	for _, id := range res.IDs {
		if sb, err := s.C.Pause(ctx, id); err != nil || sb.State != api.StatePaused {
			t.Fatalf("pause %s: %v %+v", id, err, sb)
		}
	}
	t0 := time.Now()
	var slowest time.Duration
	for _, id := range res.IDs {
		t1 := time.Now()
		if sb, err := s.C.Delete(ctx, id); err != nil || sb.State != api.StateStopped {
			t.Fatalf("delete %s: %v %+v", id, err, sb)
		}
		slowest = max(slowest, time.Since(t1))
	}
	total := time.Since(t0)
	t.Logf("deleted %d paused sandboxes one at a time in %v (slowest %v)", n, total, slowest)
	if slowest > 3*time.Second {
		t.Errorf("deleting a paused sandbox took %v", slowest)
	}
}

// TestExecResumesPausedTrajectorySandbox: any operation resumes a paused
// sandbox, exec on one that records a trajectory too (it answered 409).
func TestExecResumesPausedTrajectorySandbox(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{Trajectory: "dayone-paused-exec", Checkpoint: "none"})
	if _, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo one > /tmp/f"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.C.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	r, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "cat /tmp/f"})
	if err != nil || r.ExitCode != 0 || r.Stdout != "one\n" {
		t.Fatalf("exec on the paused trajectory sandbox: %v %+v", err, r)
	}
	if got, err := s.C.Get(ctx, sb.ID); err != nil || got.State != api.StateRunning {
		t.Fatalf("after exec: %v %+v", err, got)
	}
}

// TestLayerPublishIsIdempotent: the CLI and the Python SDK pack the same
// directory to the same layer digest, and publishing unchanged content
// again (without a version) gives back the same version.
func TestLayerPublishIsIdempotent(t *testing.T) {
	s := sharedServer(t)
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "pkg", "sub"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "calc.py"), []byte("def add(a, b):\n    return a + b\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "pkg", "sub", "run.sh"), []byte("#!/bin/sh\necho hi\n"), 0o755))
	must(os.Symlink("calc.py", filepath.Join(dir, "link.py")))
	// Sub-second mtimes: Python's tar keeps them, Go's USTAR does not.
	at := time.Unix(1_700_000_000, 123_456_789)
	for _, p := range []string{"calc.py", "pkg/sub/run.sh", "pkg/sub", "pkg"} {
		must(os.Chtimes(filepath.Join(dir, p), at, at))
	}
	name := "ws/calc-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	out, err := s.warren(t, "--json", "layer", "create", "--from-dir", dir, "--name", name)
	if err != nil {
		t.Fatalf("cli: %v\n%s", err, out)
	}
	var cli api.Layer
	must(json.Unmarshal([]byte(out), &cli))
	py := func(version string) string {
		t.Helper()
		script := fmt.Sprintf(`import json, warren
c = warren.Client(%q, %q)
l = c.create_layer(%q, directory=%q%s)
print(json.dumps({"version": l.version, "digest": l.digest}))`, s.URL, s.Token, name, dir, version)
		cmd := exec.Command("python3", "-c", script)
		cmd.Env = append(os.Environ(), "PYTHONPATH=../../sdk/python")
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("python create_layer(%s): %v\n%s", version, err, b)
		}
		return strings.TrimSpace(string(b))
	}
	want := fmt.Sprintf(`{"version": 1, "digest": "%s"}`, cli.Digest)
	if got := py(", version=1"); got != want {
		t.Fatalf("python with version=1: %s, want %s", got, want)
	}
	if got := py(""); got != want {
		t.Fatalf("python without a version: %s, want %s", got, want)
	}
	out, err = s.warren(t, "--json", "layer", "create", "--from-dir", dir, "--name", name)
	must(err)
	var again api.Layer
	must(json.Unmarshal([]byte(out), &again))
	if again.Version != 1 || again.Digest != cli.Digest {
		t.Fatalf("cli again: %+v, want version 1 %s", again, cli.Digest)
	}
	// Changed content is a new version.
	must(os.WriteFile(filepath.Join(dir, "calc.py"), []byte("def add(a, b):\n    return b + a\n"), 0o644))
	out, err = s.warren(t, "--json", "layer", "create", "--from-dir", dir, "--name", name)
	must(err)
	var changed api.Layer
	must(json.Unmarshal([]byte(out), &changed))
	if changed.Version != 2 || changed.Digest == cli.Digest {
		t.Fatalf("changed content: %+v", changed)
	}
}

// TestExecSaysWhatKilledIt: a command the OOM killer ended says so
// (oom_killed, killed_by "oom"), and so do a timeout, a plain signal and a
// fork refused by the pids limit.
func TestExecSaysWhatKilledIt(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{MemoryMB: 64, Pids: 24})
	run := func(req api.ExecRequest) *api.ExecResult {
		t.Helper()
		r, err := s.C.Exec(ctx, sb.ID, req)
		if err != nil {
			t.Fatalf("exec %q: %v", req.Cmd, err)
		}
		return r
	}
	if r := run(api.ExecRequest{Cmd: "true"}); r.OOMKilled || r.KilledBy != "" || r.PidsLimited {
		t.Fatalf("true: %+v", r)
	}
	r := run(api.ExecRequest{Cmd: "dd if=/dev/zero of=/dev/null bs=256M count=1"})
	if r.ExitCode != 137 || !r.OOMKilled || r.KilledBy != api.KilledByOOM {
		t.Fatalf("over the memory limit: %+v, want oom_killed and killed_by oom", r)
	}
	if r := run(api.ExecRequest{Cmd: "sleep 5", Timeout: 0.3}); !r.TimedOut || r.OOMKilled || r.KilledBy != api.KilledByTimeout {
		t.Fatalf("timeout: %+v", r)
	}
	if r := run(api.ExecRequest{Cmd: "kill -9 $$"}); r.Signal != "SIGKILL" || r.OOMKilled || r.KilledBy != api.KilledBySignal {
		t.Fatalf("kill -9: %+v", r)
	}
	r = run(api.ExecRequest{Cmd: "i=0; while [ $i -lt 40 ]; do sleep 1 & i=$((i+1)); done; wait", Timeout: 20})
	if !r.PidsLimited || r.OOMKilled {
		t.Fatalf("over the pids limit: %+v, want pids_limited", r)
	}
	if r := run(api.ExecRequest{Cmd: "echo fine"}); r.PidsLimited || r.OOMKilled || r.KilledBy != "" {
		t.Fatalf("the next command: %+v", r)
	}
}

// TestFnCallBurstBesideSandboxes: a burst of FnCall judges beside live
// sandboxes all succeed, and creates succeed during and after it. With
// WARREN_BURST_TAR (a debian:12 root tarball) the judges are Python on
// debian:12, 200 at concurrency 64 beside 40 sandboxes (the figure of
// issue 14); otherwise shell judges on busybox, 60 at concurrency 16
// beside 10 sandboxes. p50 and throughput are logged.
func TestFnCallBurstBesideSandboxes(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	image, judges, conc, live := "busybox", 60, 16, 10
	task := api.FnCallRequest{Image: "busybox", CPU: 0.5, MemoryMB: 128,
		Cmd: `read a b; echo $((a + b))`}
	if tarball := os.Getenv("WARREN_BURST_TAR"); tarball != "" {
		cmd := exec.Command(bins.warren, "image", "import", tarball, "--name", "debian:12", "--data-dir", s.dataDir)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("import %s: %v\n%s", tarball, err, b)
		}
		image, judges, conc, live = "debian:12", 200, 64, 40
		task = api.FnCallRequest{Image: image, CPU: 0.5, MemoryMB: 256,
			Argv: []string{"python3", "-c", "import json,sys; a,b=map(int,sys.stdin.read().split()); print(json.dumps(a+b))"}}
	}
	for i := 0; i < live; i++ {
		s.create(t, api.CreateSandboxRequest{Image: image, CPU: 0.25, MemoryMB: 128})
	}
	var mu sync.Mutex
	var lat []time.Duration
	var failed []string
	sem := make(chan struct{}, conc)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := 0; i < judges; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-sem }()
			req := task
			req.Stdin = fmt.Sprintf("%d %d\n", i, 1000)
			t1 := time.Now()
			r, err := s.C.FnCall(ctx, req)
			d := time.Since(t1)
			if err == nil && strings.TrimSpace(r.Stdout) != strconv.Itoa(i+1000) {
				err = fmt.Errorf("judge %d answered %+v", i, r)
			}
			mu.Lock()
			defer mu.Unlock()
			lat = append(lat, d)
			if err != nil {
				failed = append(failed, err.Error())
			}
		}(i)
		if i == judges/2 {
			// A create in the middle of the burst.
			sb, err := s.C.Create(ctx, api.CreateSandboxRequest{Image: image, CPU: 1, MemoryMB: 128})
			if err != nil {
				t.Errorf("create during the burst: %v", err)
			} else {
				_, _ = s.C.Delete(ctx, sb.ID)
			}
		}
	}
	wg.Wait()
	took := time.Since(t0)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("%d %s judges at concurrency %d beside %d sandboxes: %v, %.0f tasks/s, p50 %v, p99 %v, %d failed",
		judges, image, conc, live, took.Round(time.Millisecond), float64(judges)/took.Seconds(),
		lat[len(lat)/2].Round(time.Millisecond), lat[len(lat)*99/100].Round(time.Millisecond), len(failed))
	if len(failed) > 0 {
		t.Errorf("%d judges failed: %s", len(failed), strings.Join(failed[:min(5, len(failed))], "; "))
	}
	// After the burst, sandboxes up to what the node has left without the
	// idle workers: 40 cores - live x 0.25 - 1 margin, in 1-core sandboxes.
	room := int(40-float64(live)*0.25) - 1
	for i := 0; i < room; i++ {
		if _, err := s.C.Create(ctx, api.CreateSandboxRequest{Image: image, CPU: 1, MemoryMB: 64}); err != nil {
			t.Fatalf("create %d of %d after the burst: %v", i+1, room, err)
		}
	}
}

// TestExecSaysDiskFull: a command that fails on the sandbox's full disk
// quota says so (disk_full).
func TestExecSaysDiskFull(t *testing.T) {
	s := sharedServer(t)
	if strings.Contains(s.logs.String(), "sandbox disk limits are not enforced") {
		t.Skip("SKIP: this machine has no quota-capable filesystem for sandbox disk limits")
	}
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{DiskMB: 16})
	r, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "dd if=/dev/zero of=/root/big bs=1M count=64"})
	if err != nil {
		t.Fatal(err)
	}
	if r.ExitCode == 0 || !r.DiskFull {
		t.Fatalf("writing past the disk limit: %+v, want a failure with disk_full", r)
	}
	if r, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "rm /root/big; sync; sleep 1; false"}); err != nil || r.DiskFull {
		t.Fatalf("a failure with room on the disk: %v %+v", err, r)
	}
}
