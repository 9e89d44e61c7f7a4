package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/sys/unix"
)

// TestMain doubles as a helper process: with WARREN_TELEMETRY_HELPER=misbehave
// it installs a seccomp filter that refuses uname, calls uname (refused),
// then sends pid 1 SIGURG, and exits. The test starts it as pid 1 of a new
// pid namespace: the signal is its own (Go's runtime takes SIGURG).
func TestMain(m *testing.M) {
	switch os.Getenv("WARREN_TELEMETRY_HELPER") {
	case "misbehave":
		os.Exit(misbehave())
	case "flood":
		os.Exit(flood())
	}
	os.Exit(m.Run())
}

// flood sends itself (pid 1 of its namespace) WARREN_TELEMETRY_N ignored
// SIGWINCHs as fast as it can: one signal record each.
func flood() int {
	n, _ := strconv.Atoi(os.Getenv("WARREN_TELEMETRY_N"))
	signal.Ignore(unix.SIGWINCH)
	for range n {
		if err := unix.Kill(1, unix.SIGWINCH); err != nil {
			fmt.Fprintln(os.Stderr, "kill:", err)
			return 2
		}
	}
	return 0
}

func misbehave() int {
	f := seccomp.Filter{NoNewPrivs: true, Flag: seccomp.FilterFlagTSync, Policy: seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls:      []seccomp.SyscallGroup{{Action: seccomp.ActionErrno, Names: []string{"uname"}}},
	}}
	if err := seccomp.LoadFilter(f); err != nil {
		fmt.Fprintln(os.Stderr, "seccomp:", err)
		return 2
	}
	var u unix.Utsname
	if err := unix.Uname(&u); !errors.Is(err, unix.EPERM) {
		fmt.Fprintln(os.Stderr, "uname not refused:", err)
		return 3
	}
	if err := unix.Kill(1, unix.SIGURG); err != nil {
		fmt.Fprintln(os.Stderr, "kill(1, SIGURG):", err)
		return 4
	}
	return 0
}

// v2Root is where the cgroup v2 hierarchy is mounted, "" when nowhere.
func v2Root() string {
	for _, d := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var st syscall.Statfs_t
		if syscall.Statfs(d, &st) == nil && st.Type == 0x63677270 { // CGROUP2_SUPER_MAGIC
			return d
		}
	}
	return ""
}

// open loads the collector or skips where the machine truly cannot.
func open(t *testing.T, opts ...Options) *Collector {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if os.Geteuid() != 0 {
		t.Skip("SKIP: loading BPF programs needs root")
	}
	c, err := Open(nil, o)
	if err != nil {
		if _, serr := os.Stat("/sys/kernel/btf/vmlinux"); serr != nil {
			t.Skipf("SKIP: kernel has no BTF: %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// cgroup makes a cgroup v2 directory (removed at the end of the test).
func cgroup(t *testing.T, parent, name string) string {
	t.Helper()
	d := filepath.Join(parent, name)
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 50 {
			if err := os.Remove(d); err == nil || os.IsNotExist(err) {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("cgroup %s not removed", d)
	})
	return d
}

// runIn runs argv with its first instruction in cgroup dir.
func runIn(t *testing.T, dir string, argv ...string) {
	t.Helper()
	runInNS(t, dir, 0, argv...)
}

// runInNS is runIn in new namespaces (clone flags).
func runInNS(t *testing.T, dir string, flags uintptr, argv ...string) {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd()), Cloneflags: flags}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v: %s", argv, err, out)
	}
}

// TestExecsOfRegisteredCgroups: the execs of a registered cgroup (and of
// its child) are recorded with argv and the step set then; those of an
// unregistered cgroup are not.
func TestExecsOfRegisteredCgroups(t *testing.T) {
	root := v2Root()
	if root == "" {
		t.Skip("SKIP: no cgroup v2 hierarchy mounted")
	}
	c := open(t)
	base := cgroup(t, root, "warren-telemetry-test-"+strings.ReplaceAll(t.Name(), "/", "-"))
	sbA := cgroup(t, base, "a")
	workA := cgroup(t, sbA, "work")
	deep := cgroup(t, workA, "deep")
	other := cgroup(t, base, "b")

	var mu sync.Mutex
	var got []Record
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Run(ctx, func(r Record) {
			mu.Lock()
			got = append(got, r)
			mu.Unlock()
		})
	}()
	defer func() { cancel(); <-done }()

	if err := c.Add(7, sbA, workA); err != nil {
		t.Fatal(err)
	}
	c.SetStep(7, 3)
	runIn(t, workA, "/bin/sh", "-c", "/bin/true marker-one two; ls / >/dev/null")
	runIn(t, other, "/bin/true", "marker-other")
	c.SetStep(7, 0)
	runIn(t, deep, "/bin/true", "marker-deep")
	runIn(t, sbA, "/bin/true", "marker-parent")
	runInNS(t, workA, syscall.CLONE_NEWPID, "/bin/true", "marker-pidns")
	c.Remove(7)
	runIn(t, workA, "/bin/true", "marker-removed")

	want := map[string]int64{"marker-one": 3, "marker-deep": 0, "marker-parent": 0, "marker-pidns": 0}
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		recs := slices.Clone(got)
		mu.Unlock()
		seen := map[string]Record{}
		for _, r := range recs {
			if len(r.Argv) > 1 {
				seen[r.Argv[1]] = r
			}
		}
		ok := true
		for m := range want {
			if _, found := seen[m]; !found {
				ok = false
			}
		}
		var ls bool
		for _, r := range recs {
			if filepath.Base(r.Path) == "ls" && r.Step == 3 && slices.Equal(r.Argv, []string{"ls", "/"}) {
				ls = true
			}
		}
		if ok && ls {
			for m, step := range want {
				r := seen[m]
				if r.Cookie != 7 || r.Step != step || r.Kind != KindExec || r.Pid <= 0 || r.HostPid <= 0 {
					t.Errorf("%s: %+v, want cookie 7, step %d", m, r, step)
				}
				// Pids are the process's namespace's: the host's for the
				// test's own processes, 1 for the first of a new one.
				if m == "marker-pidns" && (r.Pid != 1 || r.HostPid == 1 || r.Ppid != 0) {
					t.Errorf("%s: pid %d (host %d), parent %d, want 1 in its namespace and parent 0 (outside it)", m, r.Pid, r.HostPid, r.Ppid)
				}
				if m != "marker-pidns" && (r.Pid != r.HostPid || r.Ppid <= 0) {
					t.Errorf("%s: %+v, want cookie 7, step %d", m, r, step)
				}
			}
			if r := seen["marker-one"]; r.Path != "/bin/true" || !slices.Equal(r.Argv, []string{"/bin/true", "marker-one", "two"}) {
				t.Errorf("exec of true: %+v", r)
			}
			for _, m := range []string{"marker-other", "marker-removed"} {
				if r, found := seen[m]; found {
					t.Errorf("recorded an exec outside the registered cgroups: %+v", r)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("records after 10s: %+v", recs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestArgvCap: an argv longer than ArgvCap is cut and marked so.
func TestArgvCap(t *testing.T) {
	root := v2Root()
	if root == "" {
		t.Skip("SKIP: no cgroup v2 hierarchy mounted")
	}
	c := open(t)
	d := cgroup(t, root, "warren-telemetry-test-argvcap")
	if err := c.Add(9, d); err != nil {
		t.Fatal(err)
	}
	recs := make(chan Record, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx, func(r Record) { recs <- r }) }()
	defer func() { cancel(); <-done }()
	long := strings.Repeat("x", 3000)
	runIn(t, d, "/bin/true", long)
	select {
	case r := <-recs:
		if !r.ArgvTruncated || len(strings.Join(r.Argv, "\x00")) > ArgvCap {
			t.Errorf("argv of %d bytes not cut at %d: truncated=%v, kept %d", len(long), ArgvCap, r.ArgvTruncated, len(strings.Join(r.Argv, "\x00")))
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no record")
	}
}

// BenchmarkExecTrue measures fork+exec+wait of /bin/true in a cgroup
// registered with the collector ("on") and with no programs loaded
// ("off"), reporting the p50 of each run. docs/BENCHMARKS.md records it:
//
//	go test -run '^$' -bench BenchmarkExecTrue -benchtime 2000x ./internal/telemetry/
func BenchmarkExecTrue(b *testing.B) {
	root := v2Root()
	if root == "" || os.Geteuid() != 0 {
		b.Skip("SKIP: needs root and a cgroup v2 hierarchy")
	}
	d := filepath.Join(root, "warren-telemetry-bench")
	if err := os.Mkdir(d, 0o755); err != nil {
		b.Fatal(err)
	}
	defer os.Remove(d)
	f, err := os.Open(d)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	run := func(b *testing.B) {
		lats := make([]time.Duration, 0, b.N)
		for b.Loop() {
			t0 := time.Now()
			cmd := exec.Command("/bin/true")
			cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd())}
			if err := cmd.Run(); err != nil {
				b.Fatal(err)
			}
			lats = append(lats, time.Since(t0))
		}
		slices.Sort(lats)
		b.ReportMetric(float64(lats[len(lats)/2].Microseconds()), "p50-µs")
	}
	b.Run("off", run)
	b.Run("on", func(b *testing.B) {
		c, err := Open(nil, Options{})
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if err := c.Add(1, d); err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		n := 0
		done := make(chan struct{})
		go func() { defer close(done); _ = c.Run(ctx, func(Record) { n++ }) }()
		run(b)
		cancel()
		<-done
		if n == 0 {
			b.Fatal("no exec recorded")
		}
	})
}

// TestRefusalsAndSignals: a syscall seccomp refuses and a signal aimed at
// pid 1, from a registered cgroup, are recorded; nothing is from others.
func TestRefusalsAndSignals(t *testing.T) {
	root := v2Root()
	if root == "" {
		t.Skip("SKIP: no cgroup v2 hierarchy mounted")
	}
	c := open(t, Options{Refusals: true})
	if len(c.links) < 3 {
		t.Fatalf("%d of 3 programs attached: refusals and signals are not recorded on this kernel", len(c.links))
	}
	d := cgroup(t, root, "warren-telemetry-test-refusals")
	if err := c.Add(11, d); err != nil {
		t.Fatal(err)
	}
	c.SetStep(11, 4)
	recs := make(chan Record, 64)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx, func(r Record) { recs <- r }) }()
	defer func() { cancel(); <-done }()

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(d)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), "WARREN_TELEMETRY_HELPER=misbehave")
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd()), Cloneflags: syscall.CLONE_NEWPID}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("helper: %v: %s", err, out)
	}
	var refused, signal bool
	deadline := time.After(10 * time.Second)
	for !refused || !signal {
		select {
		case r := <-recs:
			if r.Cookie != 11 || r.Step != 4 {
				t.Errorf("record %+v: want cookie 11, step 4", r)
			}
			switch r.Kind {
			case KindRefused:
				if r.Syscall == "uname" && r.Pid == 1 && r.HostPid == cmd.Process.Pid {
					refused = true
				}
			case KindSignal:
				// The helper handles SIGURG (Go's runtime does): delivered.
				if r.Target == 1 && r.Signal == int(unix.SIGURG) && r.HostPid == cmd.Process.Pid && r.Outcome == "delivered" {
					signal = true
				}
			}
		case <-deadline:
			t.Fatalf("after 10s: refused uname recorded %v, signal to pid 1 recorded %v", refused, signal)
		}
	}
}

// BenchmarkSyscall measures a cheap syscall (getppid) of a process outside
// every sandbox with the programs loaded ("on") and not ("off"): what the
// sys_exit hook costs the rest of the host.
//
//	go test -run '^$' -bench BenchmarkSyscall -count 3 ./internal/telemetry/
func BenchmarkSyscall(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("SKIP: needs root")
	}
	run := func(b *testing.B) {
		for b.Loop() {
			unix.Getppid()
		}
	}
	b.Run("off", run)
	for _, o := range []Options{{}, {Refusals: true}, {Files: true}} {
		b.Run(fmt.Sprintf("on-refusals-%v-files-%v", o.Refusals, o.Files), func(b *testing.B) {
			c, err := Open(nil, o)
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			run(b)
		})
	}
}

// BenchmarkRecordsPerSecond floods the collector from one registered
// cgroup (a process signalling its own pid 1, one record a signal, as
// fast as it can) and reports how many records a second the kernel made
// and how many of them the collector lost:
//
//	go test -run '^$' -bench BenchmarkRecordsPerSecond -benchtime 200000x ./internal/telemetry/
func BenchmarkRecordsPerSecond(b *testing.B) {
	root := v2Root()
	if root == "" || os.Geteuid() != 0 {
		b.Skip("SKIP: needs root and a cgroup v2 hierarchy")
	}
	d := filepath.Join(root, "warren-telemetry-bench-flood")
	if err := os.Mkdir(d, 0o755); err != nil {
		b.Fatal(err)
	}
	defer os.Remove(d)
	c, err := Open(nil, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	if err := c.Add(1, d); err != nil {
		b.Fatal(err)
	}
	var got atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx, func(r Record) { got.Add(1) }) }()
	f, err := os.Open(d)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	self, _ := os.Executable()
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), "WARREN_TELEMETRY_HELPER=flood", "WARREN_TELEMETRY_N="+strconv.Itoa(b.N))
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(f.Fd()), Cloneflags: syscall.CLONE_NEWPID}
	b.ResetTimer()
	t0 := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("flood: %v: %s", err, out)
	}
	took := time.Since(t0)
	b.StopTimer()
	time.Sleep(4 * DrainEvery)
	cancel()
	<-done
	lost := c.Lost()
	b.ReportMetric(float64(b.N)/took.Seconds(), "made/s")
	b.ReportMetric(float64(got.Load()), "delivered")
	b.ReportMetric(float64(lost), "lost")
}

// TestFileOps: with Options.Files, writes, renames, unlinks and chmods of
// a sandbox's processes are recorded with their paths; those of its
// agent's cgroup, and reads, are not.
func TestFileOps(t *testing.T) {
	root := v2Root()
	if root == "" {
		t.Skip("SKIP: no cgroup v2 hierarchy mounted")
	}
	c := open(t, Options{Files: true})
	if len(c.links) < 3 {
		t.Fatalf("%d of 3 programs attached", len(c.links))
	}
	agent := cgroup(t, root, "warren-telemetry-test-files")
	work := cgroup(t, agent, "work")
	if err := c.AddSandbox(13, agent, work); err != nil {
		t.Fatal(err)
	}
	recs := make(chan Record, 256)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx, func(r Record) { recs <- r }) }()
	defer func() { cancel(); <-done }()

	dir := t.TempDir()
	runIn(t, work, "/bin/sh", "-c", "cd "+dir+" && echo x > w1 && cat w1 >/dev/null && mv w1 w2 && chmod 600 w2 && rm w2")
	runIn(t, agent, "/bin/sh", "-c", "cd "+dir+" && echo x > agent-file && rm agent-file")
	want := map[string]Record{"write w1": {}, "rename w1": {}, "chmod w2": {}, "unlink w2": {}}
	deadline := time.After(10 * time.Second)
	for {
		select {
		case r := <-recs:
			if r.Kind != KindFile {
				continue
			}
			if strings.Contains(r.Path, "agent-file") != r.Beside {
				t.Errorf("a file operation in the agent's cgroup (by a process other than its pid 1) must be marked beside, and only those: %+v", r)
			}
			k := r.Op + " " + r.Path
			if _, ok := want[k]; ok {
				if want[k].Kind != "" {
					t.Errorf("%s recorded twice (a read recorded as a write?): %+v", k, r)
				}
				want[k] = r
			}
		case <-deadline:
			t.Fatalf("after 10s: %+v", want)
		}
		if want["write w1"].Kind != "" && want["rename w1"].Kind != "" && want["chmod w2"].Kind != "" && want["unlink w2"].Kind != "" {
			break
		}
	}
	if r := want["rename w1"]; r.To != "w2" || r.Cookie != 13 {
		t.Errorf("rename: %+v", r)
	}
	// Let the rest arrive, then look again.
	time.Sleep(3 * DrainEvery)
	for len(recs) > 0 {
		if r := <-recs; r.Kind == KindFile && strings.Contains(r.Path, "agent-file") != r.Beside {
			t.Errorf("beside: %+v", r)
		}
	}
}
