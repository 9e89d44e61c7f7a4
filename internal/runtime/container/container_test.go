package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/confine/confinetest"
	"github.com/warrenhq/warren/internal/runtime"
)

// The tests run the real warren-agent (cmd/warren-agent, built once with
// CGO_ENABLED=0), or the binary named by WARREN_TEST_AGENT.

var (
	agentBin string
	buildDir string // binaries the tests build, removed at the end
)

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "container-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		buildDir = dir
		if p := os.Getenv("WARREN_TEST_AGENT"); p != "" {
			agentBin = p
			return m.Run()
		}
		agentBin = filepath.Join(dir, "warren-agent")
		if err := confinetest.GoStatic("../../..", "build", "-o", agentBin, "./cmd/warren-agent"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// fixture is one runtime with its own cgroup parent, removed at the end.
type fixture struct {
	t      *testing.T
	rt     *Runtime
	parent string
	base   string
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root")
	}
	if _, err := os.Stat(confinetest.BusyboxPath); err != nil {
		t.Skip("SKIP: " + confinetest.ErrNoBusybox.Error())
	}
	parent := fmt.Sprintf("warren-test-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("WARREN_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	rt, err := New(Config{AgentPath: agentBin, CgroupParent: parent, Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{rt: rt, parent: parent, base: t.TempDir()}
	t.Cleanup(func() {
		var class []string
		if rt.classed() {
			class = rt.cg.dirs(rt.classPath())
		}
		for _, d := range append(class, rt.cg.dirs(parent)...) {
			if err := os.Remove(d); err != nil {
				t.Errorf("remove cgroup parent: %v", err)
			}
		}
	})
	return f
}

func (f *fixture) spec(t testing.TB, id string) *runtime.Spec {
	t.Helper()
	dir := filepath.Join(f.base, id)
	l, err := confinetest.NewLayout(dir)
	if err != nil {
		t.Fatal(err)
	}
	return &runtime.Spec{
		ID: id, Hostname: "box-" + id, StateDir: filepath.Join(dir, "state"),
		RootDir: l.Root, Lowers: []string{l.Lower}, Upper: l.Upper, Work: l.Work,
		CPU: 0.5, MemoryMB: 64, Pids: 100,
	}
}

// start starts a sandbox and destroys it at the end of the test.
func (f *fixture) start(t testing.TB, spec *runtime.Spec) *runtime.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	inst, err := f.rt.Start(ctx, spec)
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(spec.StateDir, LogName))
		t.Fatalf("Start: %v\nagent log:\n%s", err, log)
	}
	t.Cleanup(func() {
		inst.Agent.Close()
		f.rt.Destroy(context.Background(), inst.Handle)
	})
	return inst
}

type execOut struct {
	stdout, stderr string
	res            agentproto.ExecResult
}

func run(t testing.TB, c *agentproto.Client, argv ...string) execOut {
	t.Helper()
	return runReq(t, c, &agentproto.ExecRequest{Argv: argv})
}

func runReq(t testing.TB, c *agentproto.Client, req *agentproto.ExecRequest) execOut {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	var o execOut
	err := c.Call(ctx, agentproto.OpExec, req, &o.res, func(r *agentproto.Response) error {
		if r.Stream == agentproto.StreamStderr {
			errb.Write(r.Data)
		} else {
			out.Write(r.Data)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("exec %+v: %v", req, err)
	}
	o.stdout, o.stderr = out.String(), errb.String()
	return o
}

func readTrim(t testing.TB, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestStartAttachDestroy(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "sb-life")
	inst := f.start(t, spec)
	h := inst.Handle
	ctx := context.Background()

	// Cgroups exist with the limits and hold the agent.
	for _, c := range v1Controllers {
		dir := filepath.Join("/sys/fs/cgroup", c, f.parent, spec.ID)
		procs := readTrim(t, filepath.Join(dir, "cgroup.procs"))
		if !strings.Contains("\n"+procs+"\n", "\n"+strconv.Itoa(h.Pid)+"\n") {
			t.Errorf("%s: agent %d not in cgroup.procs %q", c, h.Pid, procs)
		}
	}
	// The sandbox's processes get the limits in the box; the sandbox's
	// cgroup, which holds the agent too, those and the agent's reserve.
	for file, want := range map[string]string{
		"cpu/cpu.cfs_quota_us":             "50000",
		"cpu/cpu.cfs_period_us":            "100000",
		"memory/memory.limit_in_bytes":     strconv.Itoa((64 + agentReserveMB) << 20),
		"memory/box/memory.limit_in_bytes": strconv.Itoa(64 << 20),
		"pids/pids.max":                    strconv.Itoa(100 + agentReservePids),
		"pids/box/pids.max":                "100",
		"freezer/freezer.state":            "THAWED",
	} {
		ctrl, name, _ := strings.Cut(file, "/")
		if got := readTrim(t, filepath.Join("/sys/fs/cgroup", ctrl, f.parent, spec.ID, name)); got != want {
			t.Errorf("%s = %q, want %q", file, got, want)
		}
	}
	// No thread of this process stayed in the sandbox's cgroups.
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		b, _ := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "cgroup"))
		if strings.Contains(string(b), f.parent) {
			t.Errorf("edge thread %s left in %s", task.Name(), b)
		}
	}

	if !namespacePid1(h.Pid) {
		t.Errorf("agent %d is not PID 1 of its pid namespace", h.Pid)
	}
	if fi, err := os.Stat(h.Socket); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket %s: %v %v", h.Socket, fi, err)
	}
	if o := run(t, inst.Agent, "/bin/cat", "/proc/self/cgroup"); o.res.ExitCode != 0 {
		t.Errorf("cat /proc/self/cgroup: %+v", o)
	} else {
		for _, line := range strings.Split(strings.TrimSpace(o.stdout), "\n") {
			// v1 controllers with a box: sandbox processes are in the
			// box; the v2 line: in the trust split's work.
			box := slices.ContainsFunc(boxControllers, func(c string) bool { return strings.Contains(line, ":"+c+":") })
			switch {
			case box && strings.HasSuffix(line, ":/"+boxName):
			case !box && (strings.HasSuffix(line, ":/") || line == "0::/"+agentproto.CgroupWork):
			default:
				t.Errorf("cgroup namespace not rooted at the sandbox: %q", line)
			}
		}
	}
	if o := run(t, inst.Agent, "/bin/hostname"); strings.TrimSpace(o.stdout) != spec.Hostname {
		t.Errorf("hostname %q, want %q", o.stdout, spec.Hostname)
	}

	// The memory limit is enforced: a 128 MiB buffer in a 64 MiB sandbox
	// gets its process OOM-killed, and the agent survives.
	o := run(t, inst.Agent, "/bin/dd", "if=/dev/zero", "of=/dev/null", "bs=128M", "count=1")
	if o.res.ExitCode == 0 && o.res.Signal == "" {
		t.Errorf("128 MiB allocation survived a 64 MiB limit: %+v", o)
	}
	if oc := readTrim(t, filepath.Join("/sys/fs/cgroup/memory", f.parent, spec.ID, boxName, "memory.oom_control")); !strings.Contains(oc, "oom_kill 1") {
		t.Errorf("no OOM kill recorded in the sandbox's memory cgroup: %q (exec %+v)", oc, o)
	}

	// Attach after dropping the client.
	inst.Agent.Close()
	inst2, err := f.rt.Attach(ctx, h)
	if err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if o := run(t, inst2.Agent, "/bin/echo", "again"); o.stdout != "again\n" {
		t.Errorf("exec after attach: %+v", o)
	}
	inst2.Agent.Close()

	// Destroy leaves nothing behind, twice.
	for i := 0; i < 2; i++ {
		if err := f.rt.Destroy(ctx, h); err != nil {
			t.Fatalf("Destroy #%d: %v", i+1, err)
		}
	}
	assertGone(t, f, h, spec)
	if _, err := f.rt.Attach(ctx, h); !errors.Is(err, runtime.ErrGone) {
		t.Errorf("Attach after Destroy: %v, want ErrGone", err)
	}
}

func assertGone(t *testing.T, f *fixture, h runtime.Handle, spec *runtime.Spec) {
	t.Helper()
	if dirs := f.rt.cg.dirs(h.Cgroup); len(dirs) != 0 {
		t.Errorf("cgroups left: %v", dirs)
	}
	if _, err := os.Stat(fmt.Sprintf("/proc/%d", h.Pid)); err == nil && sameProcess(h.Pid, h.PidStart) {
		t.Errorf("agent %d still alive", h.Pid)
	}
	if _, err := os.Stat(h.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left: %v", err)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), spec.RootDir) {
		t.Errorf("mount left on the host under %s", spec.RootDir)
	}
}

func TestLeftoversAndOrphanDestroy(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "sb-orphan")
	inst := f.start(t, spec)
	inst.Agent.Close() // the edge "crashed"

	// An empty cgroup, as left by a start that died half-way.
	half := filepath.Join("/sys/fs/cgroup/pids", f.parent, "sb-half")
	if err := os.Mkdir(half, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(half) })

	rt2, err := New(Config{AgentPath: agentBin, CgroupParent: f.parent})
	if err != nil {
		t.Fatal(err)
	}
	left, err := rt2.Leftovers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]runtime.Handle{}
	for _, h := range left {
		found[h.ID] = h
	}
	orphan, ok := found["sb-orphan"]
	if !ok || orphan.Pid != inst.Handle.Pid || orphan.PidStart != inst.Handle.PidStart {
		t.Fatalf("Leftovers = %+v, want sb-orphan with pid %d", left, inst.Handle.Pid)
	}
	if h, ok := found["sb-half"]; !ok || h.Pid != 0 {
		t.Fatalf("Leftovers = %+v, want sb-half without pid", left)
	}
	for _, h := range left {
		if err := rt2.Destroy(context.Background(), h); err != nil {
			t.Fatalf("Destroy %s: %v", h.ID, err)
		}
	}
	orphan.Socket = inst.Handle.Socket
	os.Remove(orphan.Socket) // Leftovers cannot know it
	assertGone(t, f, orphan, spec)
	if _, err := os.Stat(half); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("half-made cgroup left: %v", err)
	}
	if left, _ := rt2.Leftovers(context.Background()); len(left) != 0 {
		t.Errorf("Leftovers after Destroy: %+v", left)
	}
}

func TestFreezeThaw(t *testing.T) {
	f := newFixture(t)
	inst := f.start(t, f.spec(t, "sb-freeze"))
	ctx := context.Background()
	if err := f.rt.Freeze(ctx, inst.Handle); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join("/sys/fs/cgroup/freezer", inst.Handle.Cgroup, "freezer.state")
	if got := readTrim(t, state); got != "FROZEN" {
		t.Errorf("freezer.state %q", got)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := inst.Agent.Call(short, agentproto.OpPing, nil, nil, nil)
	cancel()
	if err == nil {
		t.Errorf("a frozen agent answered")
	}
	if err := f.rt.Thaw(ctx, inst.Handle); err != nil {
		t.Fatal(err)
	}
	if err := inst.Agent.Call(ctx, agentproto.OpPing, nil, nil, nil); err != nil {
		t.Errorf("ping after thaw: %v", err)
	}
	if err := f.rt.Freeze(ctx, runtime.Handle{ID: "sb-none", Cgroup: f.parent + "/sb-none"}); !errors.Is(err, runtime.ErrGone) {
		t.Errorf("Freeze of a missing sandbox: %v", err)
	}
}

// TestDestroyPausedIsQuick: destroying a frozen (paused) sandbox must not
// wait for its frozen PID 1 to die: frozen tasks never handle SIGKILL.
func TestDestroyPausedIsQuick(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "sb-pausedkill")
	inst := f.start(t, spec)
	ctx := context.Background()
	if err := f.rt.Freeze(ctx, inst.Handle); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.rt.Reclaim(ctx, inst.Handle); err != nil {
		t.Fatal(err)
	}
	inst.Agent.Close()
	t0 := time.Now()
	if err := f.rt.Destroy(ctx, inst.Handle); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(t0); took > 2*time.Second {
		t.Errorf("Destroy of a paused sandbox took %v", took)
	}
	assertGone(t, f, inst.Handle, spec)
}

func TestFailedStartCleansUp(t *testing.T) {
	f := newFixture(t)
	rt, err := New(Config{AgentPath: "/bin/true", CgroupParent: f.parent, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	spec := f.spec(t, "sb-fail")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rt.Start(ctx, spec); err == nil {
		t.Fatal("Start with an agent that exits succeeded")
	}
	h := runtime.Handle{ID: spec.ID, Cgroup: f.parent + "/" + spec.ID, Socket: filepath.Join(spec.StateDir, SocketName)}
	assertGone(t, f, h, spec)
}

func BenchmarkStart(b *testing.B) {
	f := newFixture(b)
	ctx := context.Background()
	var total time.Duration
	for i := 0; i < b.N; i++ {
		spec := f.spec(b, fmt.Sprintf("sb-bench-%d", i))
		b.StartTimer()
		t0 := time.Now()
		inst, err := f.rt.Start(ctx, spec)
		d := time.Since(t0)
		b.StopTimer()
		if err != nil {
			b.Fatal(err)
		}
		total += d
		inst.Agent.Close()
		if err := f.rt.Destroy(ctx, inst.Handle); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "ms/start")
}
