package container

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/confine/confinetest"
	"github.com/warrenhq/warren/internal/runtime"
)

// Trusted commands out of the sandbox's reach (issue 13, item 3): while a
// trusted command runs, nothing the sandbox started can read, write,
// signal, trace or impersonate it or its streams.

var (
	injOnce sync.Once
	injBin  string
	injErr  error
)

// installInjector puts testdata/injector (built static once) in the
// sandbox's lower layer as /bin/injector.
func installInjector(t testing.TB, spec *runtime.Spec) {
	t.Helper()
	injOnce.Do(func() {
		injBin = filepath.Join(buildDir, "injector")
		injErr = confinetest.GoStatic(".", "build", "-o", injBin, "./testdata/injector")
	})
	if injErr != nil {
		t.Fatal(injErr)
	}
	b, err := os.ReadFile(injBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(spec.Lowers[0], "bin", "injector"), b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// withToolkit attaches a protected toolkit (a busybox of its own) at
// /opt/toolkit, as trusted exec needs.
func withToolkit(t testing.TB, spec *runtime.Spec) {
	t.Helper()
	dir := filepath.Join(filepath.Dir(spec.StateDir), "toolkit")
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(confinetest.BusyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{"sh", "sleep", "env", "cat", "echo"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", l)); err != nil {
			t.Fatal(err)
		}
	}
	// Private to root, as a layer made from a t.TempDir is: the trusted
	// process must still start from it.
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	spec.Binds = append(spec.Binds, agentproto.Bind{Source: dir, Target: "/opt/toolkit", Protected: true})
}

// trustedSandbox starts a sandbox with a toolkit and the injector.
func trustedSandbox(t *testing.T, f *fixture, id string) (*runtime.Instance, *runtime.Spec) {
	t.Helper()
	spec := f.spec(t, id)
	spec.Pids = 200
	withToolkit(t, spec)
	installInjector(t, spec)
	return f.start(t, spec), spec
}

// startBackground starts an ordinary (untrusted) background command.
func startBackground(t *testing.T, c *agentproto.Client, cmd string) {
	t.Helper()
	o := runReq(t, c, &agentproto.ExecRequest{Cmd: cmd, Background: true})
	if o.res.CommandID == "" {
		t.Fatalf("background %q: %+v", cmd, o)
	}
}

// upperFile reads a file the sandbox wrote (from its writable layer).
func upperFile(spec *runtime.Spec, p string) string {
	b, _ := os.ReadFile(filepath.Join(spec.Upper, p))
	return string(b)
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// successes are the log lines of attacks that worked.
func successes(log string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[1] == "ok" {
			out = append(out, l)
		}
	}
	return out
}

const graderReport = "3/10 tests passed\n"

// assertClean checks a trusted command's result: its own output only, not
// killed.
func assertClean(t *testing.T, o execOut) {
	t.Helper()
	if o.stdout != graderReport || o.res.ExitCode != 0 || o.res.Signal != "" {
		t.Errorf("trusted command tampered with: stdout %q stderr %q result %+v", clip(o.stdout), clip(o.stderr), o.res)
	}
}

// clip shortens a long output for a message.
func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// ticks reads the injector's scan counter.
func ticks(spec *runtime.Spec) int {
	n, _ := strconv.Atoi(upperFile(spec, "tmp/inj.tick"))
	return n
}

// TestTrustedInjector is the attack of issue 13: a daemon left by the agent
// polls /proc/*/cmdline for the trusted command, writes a forged report
// into its /proc/<pid>/fd/1, writes into its /proc/<pid>/mem, reads its
// environment and kills it. None of it may reach the trusted command.
func TestTrustedInjector(t *testing.T) {
	f := newFixture(t)
	inst, spec := trustedSandbox(t, f, "sb-inject")
	c := inst.Agent
	startBackground(t, c, "injector -kill GRADER-4711 /tmp/inj.log /tmp/inj.tick")
	waitFor(t, "the injector's first scan", func() bool { return strings.Contains(upperFile(spec, "tmp/inj.log"), "ready") })

	o := runReq(t, c, &agentproto.ExecRequest{Cmd: ": GRADER-4711; sleep 0.5; echo '3/10 tests passed'", Trusted: true})
	assertClean(t, o)
	if ok := successes(upperFile(spec, "tmp/inj.log")); len(ok) > 0 {
		t.Errorf("attacks on the trusted command succeeded: %q", ok[:min(len(ok), 12)])
	}
	// The sandbox runs on afterwards: the injector scans again.
	n := ticks(spec)
	waitFor(t, "the injector to run after the trusted command", func() bool { return ticks(spec) > n+2 })
}

// TestTrustedForgedReport: a daemon writes a forged report into every pipe
// (fd 0-2 of every process it can open) and every FIFO it finds, over and
// over. The trusted command's stdio are fresh pipes only the agent holds,
// and the daemon is frozen meanwhile: its report never shows.
func TestTrustedForgedReport(t *testing.T) {
	f := newFixture(t)
	inst, spec := trustedSandbox(t, f, "sb-forge")
	c := inst.Agent
	runReq(t, c, &agentproto.ExecRequest{Cmd: "mkfifo /tmp/report /dev/shm/report"})
	startBackground(t, c, "injector -spray NOMATCH /tmp/inj.log /tmp/inj.tick")
	waitFor(t, "the sprayer's first scan", func() bool { return strings.Contains(upperFile(spec, "tmp/inj.log"), "ready") })

	for i := 0; i < 3; i++ {
		o := runReq(t, c, &agentproto.ExecRequest{Cmd: "sleep 0.3; echo '3/10 tests passed'", Trusted: true})
		assertClean(t, o)
		n := ticks(spec)
		waitFor(t, "the sprayer to run between trusted commands", func() bool { return ticks(spec) > n+2 })
	}
}

// TestTrustedRacingDaemon: a daemon keeps starting injectors (each scans
// once, attacks what it finds and exits), so one may be starting just as
// the grader does. The freeze is in place before the trusted process
// exists, and a process forked while the freeze is under way is frozen
// too.
func TestTrustedRacingDaemon(t *testing.T) {
	f := newFixture(t)
	inst, spec := trustedSandbox(t, f, "sb-race")
	c := inst.Agent
	inj := "injector -once -kill GRADER-4711 /tmp/inj.log /tmp/inj.tick"
	startBackground(t, c, "while :; do "+inj+" & "+inj+"; done")
	waitFor(t, "the racing injectors", func() bool { return strings.Contains(upperFile(spec, "tmp/inj.log"), "ready") })

	for i := 0; i < 3; i++ {
		o := runReq(t, c, &agentproto.ExecRequest{Cmd: ": GRADER-4711; sleep 0.3; echo '3/10 tests passed'", Trusted: true})
		assertClean(t, o)
	}
	if ok := successes(upperFile(spec, "tmp/inj.log")); len(ok) > 0 {
		t.Errorf("attacks on the trusted command succeeded: %q", ok[:min(len(ok), 12)])
	}
	n := ticks(spec)
	waitFor(t, "the racing injectors to run after the trusted commands", func() bool { return ticks(spec) != n })
}

// TestTrustedEnvClean: loader and shell start-up variables reach no trusted
// command, whether the sandbox's environment or a session export set them;
// the request's own env still does.
func TestTrustedEnvClean(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "sb-env")
	withToolkit(t, spec)
	spec.Env = map[string]string{"LD_PRELOAD": "/tmp/evil.so", "ENV": "/tmp/evil.sh", "BASH_ENV": "/tmp/evil.sh", "KEEP": "yes"}
	inst := f.start(t, spec)
	c := inst.Agent
	runReq(t, c, &agentproto.ExecRequest{Cmd: "export LD_AUDIT=/tmp/evil.so PYTHONPATH=/tmp/evil"})
	if o := runReq(t, c, &agentproto.ExecRequest{Cmd: "echo $LD_PRELOAD $LD_AUDIT"}); o.stdout != "/tmp/evil.so /tmp/evil.so\n" {
		t.Fatalf("the ordinary session: %q", o.stdout)
	}
	o := runReq(t, c, &agentproto.ExecRequest{Argv: []string{"env"}, Trusted: true, Env: map[string]string{"LD_LIBRARY_PATH": "/opt/toolkit/lib"}})
	env := "\n" + o.stdout
	for _, bad := range []string{"LD_PRELOAD=", "LD_AUDIT=", "ENV=", "BASH_ENV=", "PYTHONPATH="} {
		if strings.Contains(env, "\n"+bad) {
			t.Errorf("trusted command's environment has %s:\n%s", bad, o.stdout)
		}
	}
	for _, good := range []string{"KEEP=yes", "LD_LIBRARY_PATH=/opt/toolkit/lib", "PATH=/opt/toolkit/bin:"} {
		if !strings.Contains(env, "\n"+good) {
			t.Errorf("trusted command's environment lacks %s:\n%s", good, o.stdout)
		}
	}
}

// workFrozen reports whether the sandbox's work cgroup is frozen.
func workFrozen(t *testing.T, f *fixture, h runtime.Handle) bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.rt.cg.unified(h.Cgroup), agentproto.CgroupWork, "cgroup.events"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains(string(b), "frozen 1")
}

// assertThawed checks that the sandbox runs again: work is not frozen and
// the injector started by trustedSandbox's caller scans on.
func assertThawed(t *testing.T, f *fixture, inst *runtime.Instance, spec *runtime.Spec, what string) {
	t.Helper()
	waitFor(t, what+": work thawed", func() bool { return !workFrozen(t, f, inst.Handle) })
	n := ticks(spec)
	waitFor(t, what+": the sandbox runs on", func() bool { return ticks(spec) > n+2 })
}

// TestTrustedThawsAfterwards: the sandbox is frozen exactly while a trusted
// command runs, and thawed whatever way it ends: success, failure, timeout,
// the edge's connection gone. What the command left behind is killed.
func TestTrustedThawsAfterwards(t *testing.T) {
	f := newFixture(t)
	inst, spec := trustedSandbox(t, f, "sb-thaw")
	startBackground(t, inst.Agent, "injector NOMATCH /tmp/inj.log /tmp/inj.tick")
	waitFor(t, "the injector", func() bool { return ticks(spec) > 0 })

	// Frozen while it runs.
	done := make(chan execOut, 1)
	go func() {
		done <- runReq(t, inst.Agent, &agentproto.ExecRequest{Cmd: "sleep 1; echo graded > /tmp/graded; echo '3/10 tests passed'", Trusted: true})
	}()
	waitFor(t, "work frozen during the trusted command", func() bool { return workFrozen(t, f, inst.Handle) })
	n := ticks(spec)
	time.Sleep(300 * time.Millisecond)
	if m := ticks(spec); m != n {
		t.Errorf("the injector scanned %d times while frozen", m-n)
	}
	// An ordinary command asked for meanwhile starts after it.
	if o := run(t, inst.Agent, "cat", "/tmp/graded"); o.stdout != "graded\n" {
		t.Errorf("ordinary command during a trusted one: %+v", o)
	}
	assertClean(t, <-done)
	assertThawed(t, f, inst, spec, "after success")

	if o := runReq(t, inst.Agent, &agentproto.ExecRequest{Cmd: "exit 3", Trusted: true}); o.res.ExitCode != 3 {
		t.Errorf("failing trusted command: %+v", o.res)
	}
	assertThawed(t, f, inst, spec, "after failure")

	o := runReq(t, inst.Agent, &agentproto.ExecRequest{Cmd: "sleep 10", Trusted: true, Timeout: 300 * time.Millisecond})
	if !o.res.TimedOut {
		t.Errorf("trusted command did not time out: %+v", o.res)
	}
	assertThawed(t, f, inst, spec, "after a timeout")

	// A daemon the trusted command leaves is killed: nothing but the
	// agent stays beside work.
	o = runReq(t, inst.Agent, &agentproto.ExecRequest{Cmd: "sleep 100 >/dev/null 2>&1 & echo started", Trusted: true})
	if o.stdout != "started\n" {
		t.Errorf("trusted daemon: %+v", o)
	}
	if procs := readTrim(t, filepath.Join(f.rt.cg.unified(inst.Handle.Cgroup), "cgroup.procs")); procs != strconv.Itoa(inst.Handle.Pid) {
		t.Errorf("beside the agent after a trusted command: %q (agent %d)", procs, inst.Handle.Pid)
	}
	assertThawed(t, f, inst, spec, "after a daemon")

	// The edge's connection goes (a new one replaces it) mid-command.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		req := &agentproto.ExecRequest{Cmd: "sleep 0.5", Trusted: true}
		_ = inst.Agent.Call(ctx, agentproto.OpExec, req, &agentproto.ExecResult{}, nil)
	}()
	waitFor(t, "work frozen again", func() bool { return workFrozen(t, f, inst.Handle) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	inst2, err := f.rt.Attach(ctx, inst.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer inst2.Agent.Close()
	assertThawed(t, f, inst2, spec, "after the connection went")
	if o := run(t, inst2.Agent, "echo", "hi"); o.stdout != "hi\n" {
		t.Errorf("exec after the connection went: %+v", o)
	}
}

// TestTrustedFrozenDeletable: a sandbox deleted while a trusted command
// holds it frozen goes entirely.
func TestTrustedFrozenDeletable(t *testing.T) {
	f := newFixture(t)
	inst, spec := trustedSandbox(t, f, "sb-del")
	startBackground(t, inst.Agent, "injector NOMATCH /tmp/inj.log /tmp/inj.tick")
	if o := runReq(t, inst.Agent, &agentproto.ExecRequest{Cmd: "sleep 60", Trusted: true, Background: true}); o.res.CommandID == "" {
		t.Fatalf("background trusted command: %+v", o)
	}
	waitFor(t, "work frozen", func() bool { return workFrozen(t, f, inst.Handle) })
	t0 := time.Now()
	if err := f.rt.Destroy(context.Background(), inst.Handle); err != nil {
		t.Fatalf("Destroy of a frozen sandbox: %v", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Errorf("Destroy took %v", d)
	}
	assertGone(t, f, inst.Handle, spec)
}

// BenchmarkTrustedExec measures the cost of isolating a trusted command:
// exec round trips (agent protocol, no HTTP) of argv `true`, ordinary and
// trusted (the sandbox frozen around it), in an idle sandbox and in one
// with 20 sleeping processes and a busy loop. Reports p50 and p99.
//
//	go test -run '^$' -bench TrustedExec -benchtime 300x ./internal/runtime/container/
func BenchmarkTrustedExec(b *testing.B) {
	f := newFixture(b)
	spec := f.spec(b, "sb-bench-trusted")
	spec.CPU = 0 // unlimited: the figures are the isolation's, not a quota's
	spec.Pids = 200
	withToolkit(b, spec)
	inst := f.start(b, spec)
	c := inst.Agent
	measure := func(b *testing.B, req *agentproto.ExecRequest) {
		for range 20 { // warm up
			runReq(b, c, req)
		}
		ds := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			o := runReq(b, c, req)
			ds = append(ds, time.Since(t0))
			if o.res.ExitCode != 0 {
				b.Fatalf("%+v", o)
			}
		}
		b.StopTimer()
		slices.Sort(ds)
		b.ReportMetric(float64(ds[len(ds)/2].Microseconds())/1000, "ms-p50")
		b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds())/1000, "ms-p99")
	}
	plain := &agentproto.ExecRequest{Argv: []string{"true"}}
	trusted := &agentproto.ExecRequest{Argv: []string{"true"}, Trusted: true}
	b.Run("idle/plain", func(b *testing.B) { measure(b, plain) })
	b.Run("idle/trusted", func(b *testing.B) { measure(b, trusted) })
	o := runReq(b, c, &agentproto.ExecRequest{Cmd: "for i in $(seq 20); do sleep 1000 & done; while :; do :; done", Background: true})
	if o.res.CommandID == "" {
		b.Fatalf("busy sandbox: %+v", o)
	}
	b.Run("busy/plain", func(b *testing.B) { measure(b, plain) })
	b.Run("busy/trusted", func(b *testing.B) { measure(b, trusted) })
}

// TestTrustedConcurrent: trusted commands of one sandbox run one at a
// time, each clean, and the sandbox is thawed after the last.
func TestTrustedConcurrent(t *testing.T) {
	f := newFixture(t)
	inst, spec := trustedSandbox(t, f, "sb-conc")
	startBackground(t, inst.Agent, "injector -kill GRADER-4711 /tmp/inj.log /tmp/inj.tick")
	waitFor(t, "the injector", func() bool { return strings.Contains(upperFile(spec, "tmp/inj.log"), "ready") })
	t0 := time.Now()
	var wg sync.WaitGroup
	outs := make([]execOut, 3)
	for i := range outs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = runReq(t, inst.Agent, &agentproto.ExecRequest{Cmd: ": GRADER-4711; sleep 0.3; echo '3/10 tests passed'", Trusted: true})
		}()
	}
	wg.Wait()
	if d := time.Since(t0); d < 900*time.Millisecond {
		t.Errorf("3 trusted commands of 0.3 s took %v: they overlapped", d)
	}
	for _, o := range outs {
		assertClean(t, o)
	}
	if ok := successes(upperFile(spec, "tmp/inj.log")); len(ok) > 0 {
		t.Errorf("attacks on the trusted commands succeeded: %q", ok)
	}
	assertThawed(t, f, inst, spec, "after concurrent trusted commands")
}

// noSplit is a cgroup driver of a host without a cgroup v2 hierarchy, as
// far as the agent is concerned: it gets no split.
type noSplit struct{ cgroupDriver }

func (noSplit) unified(string) string { return "" }

// TestTrustedRefusedWithoutSplit: an agent that cannot freeze its sandbox
// refuses trusted commands (never runs them unprotected); ordinary ones
// run.
func TestTrustedRefusedWithoutSplit(t *testing.T) {
	f := newFixture(t)
	f.rt.cg = noSplit{f.rt.cg}
	spec := f.spec(t, "sb-nosplit")
	withToolkit(t, spec)
	inst := f.start(t, spec)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := inst.Agent.Call(ctx, agentproto.OpExec, &agentproto.ExecRequest{Cmd: "true", Trusted: true}, &agentproto.ExecResult{}, nil)
	var ae *agentproto.Error
	if !errors.As(err, &ae) || ae.Code != agentproto.ErrInvalid || !strings.Contains(ae.Message, "cannot isolate") {
		t.Errorf("trusted exec without a split: %v", err)
	}
	if o := run(t, inst.Agent, "echo", "hi"); o.stdout != "hi\n" {
		t.Errorf("ordinary exec without a split: %+v", o)
	}
}
