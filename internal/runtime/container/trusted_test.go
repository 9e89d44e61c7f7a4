package container

import (
	"os"
	"path/filepath"
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
		t.Errorf("trusted command tampered with: stdout %q stderr %q result %+v", o.stdout, o.stderr, o.res)
	}
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
		t.Errorf("attacks on the trusted command succeeded: %q", ok)
	}
	// The sandbox runs on afterwards: the injector scans again.
	n := ticks(spec)
	waitFor(t, "the injector to run after the trusted command", func() bool { return ticks(spec) > n+2 })
}
