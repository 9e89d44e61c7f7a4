package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/confine/confinetest"
	"github.com/warrenhq/warren/internal/runtime"
)

var (
	budgetOnce sync.Once
	budgetBin  string
	budgetErr  error
)

// installBudget puts testdata/budget (static) in the sandbox's lower
// layer as /bin/budget.
func installBudget(t *testing.T, spec *runtime.Spec) {
	t.Helper()
	budgetOnce.Do(func() {
		budgetBin = filepath.Join(buildDir, "budget")
		budgetErr = confinetest.GoStatic(".", "build", "-o", budgetBin, "./testdata/budget")
	})
	if budgetErr != nil {
		t.Fatal(budgetErr)
	}
	b, err := os.ReadFile(budgetBin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(spec.Lowers[0], "bin", "budget"), b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestUsernsIdentity: a sandbox's root is its own range of host ids; the
// shared layer shows as root's inside and stays unmodified, what the
// sandbox writes belongs to its range, and two sandboxes get two ranges.
func TestUsernsIdentity(t *testing.T) {
	f := newFixture(t)
	specA, specB := f.spec(t, "sb-ida"), f.spec(t, "sb-idb")
	a, b := f.start(t, specA), f.start(t, specB)
	base := a.Handle.IDBase
	if base == 0 || b.Handle.IDBase == 0 || base == b.Handle.IDBase {
		t.Fatalf("id bases %d and %d, want two different ranges", base, b.Handle.IDBase)
	}
	if got, want := strings.Fields(run(t, a.Agent, "cat", "/proc/self/uid_map").stdout), []string{"0", strconv.Itoa(int(base)), "65536"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("uid_map %v, want %v", got, want)
	}
	if st := hostUID(t, a.Handle.Pid); st != int(base) {
		t.Errorf("agent's host uid %d, want %d", st, base)
	}
	o := sh(t, a.Agent, `id -u; stat -c '%u:%g' / /bin/busybox; touch /new && mkdir /d && chown 1000:1000 /d && echo done`)
	if got := strings.Fields(o.stdout); strings.Join(got, " ") != "0 0:0 0:0 done" {
		t.Errorf("inside: %q (stderr %q), want 0, 0:0 twice and done", o.stdout, o.stderr)
	}
	for name, want := range map[string]int{"new": int(base), "d": int(base) + 1000} {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(specA.Upper, name), &st); err != nil {
			t.Fatal(err)
		}
		if int(st.Uid) != want || int(st.Gid) != want {
			t.Errorf("upper/%s owned by %d:%d on the host, want %d", name, st.Uid, st.Gid, want)
		}
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(specA.Lowers[0], "bin", "busybox"), &st); err != nil || st.Uid != 0 {
		t.Errorf("the shared layer changed: %+v %v", st, err)
	}
	// The range is free again once the sandbox is gone.
	inUse := f.rt.ids.inUse()
	a.Agent.Close()
	if err := f.rt.Destroy(context.Background(), a.Handle); err != nil {
		t.Fatal(err)
	}
	if got := f.rt.ids.inUse(); got != inUse-1 {
		t.Errorf("%d ranges in use after Destroy, want %d", got, inUse-1)
	}
}

// hostUID is the real uid of pid as the host sees it.
func hostUID(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			n, _ := strconv.Atoi(strings.Fields(rest)[0])
			return n
		}
	}
	t.Fatal("no Uid line")
	return -1
}

// TestUsernsBudgets: one sandbox that uses up its POSIX message queue
// and pipe budgets leaves another's intact (issue 13: with sandboxes as
// host root, B's mq_open failed with EMFILE and its pipes shrank).
func TestUsernsBudgets(t *testing.T) {
	f := newFixture(t)
	specA, specB := f.spec(t, "sb-buda"), f.spec(t, "sb-budb")
	installBudget(t, specA)
	installBudget(t, specB)
	a, b := f.start(t, specA), f.start(t, specB)

	o := run(t, a.Agent, "/bin/budget", "mq-fill")
	if !strings.HasPrefix(o.stdout, "filled ") || strings.HasPrefix(o.stdout, "filled 0 ") {
		t.Fatalf("A: mq-fill: %q %q", o.stdout, o.stderr)
	}
	if o := run(t, b.Agent, "/bin/budget", "mq-one"); o.res.ExitCode != 0 {
		t.Errorf("B: mq_open after A used up its queues: %q %q", o.stdout, o.stderr)
	}

	sh(t, a.Agent, "/bin/budget pipe-hold /tmp/held </dev/null >/dev/null 2>&1 &")
	deadline := time.Now().Add(20 * time.Second)
	for {
		o := sh(t, a.Agent, "cat /tmp/held 2>/dev/null")
		if strings.HasPrefix(o.stdout, "held ") {
			t.Logf("A: %s", strings.TrimSpace(o.stdout))
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("A: pipe-hold did not report")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if o := run(t, a.Agent, "/bin/budget", "pipe-one"); !strings.Contains(o.stdout, "grow operation not permitted") {
		t.Errorf("A: pipe past its budget: %q, want refused growth", o.stdout)
	}
	if o := run(t, b.Agent, "/bin/budget", "pipe-one"); strings.TrimSpace(o.stdout) != "size 65536 grow <nil>" {
		t.Errorf("B: pipe while A holds its budget: %q %q, want size 65536 grow <nil>", o.stdout, o.stderr)
	}
}

// TestUsernsNproc: RLIMIT_NPROC (ulimit -u) holds inside a sandbox and
// counts the sandbox's own tasks only: A at its limit leaves B able to
// fork. As host root (issue 13), the limit did not apply at all (the
// kernel exempts host root) and counted every task of host root.
func TestUsernsNproc(t *testing.T) {
	f := newFixture(t)
	specA, specB := f.spec(t, "sb-npra"), f.spec(t, "sb-nprb")
	specA.Pids, specB.Pids = 500, 500
	a, b := f.start(t, specA), f.start(t, specB)
	own := len(tasksOf(t, f, specA.ID))
	limit := own + 30
	// The shell gives up at the first fork the limit refuses.
	sh(t, a.Agent, fmt.Sprintf(`ulimit -u %d; i=0; while [ $i -lt 100 ]; do sleep 60 & i=$((i+1)); done 2>/dev/null`, limit))
	if n := len(tasksOf(t, f, specA.ID)); n > limit+5 {
		t.Errorf("A has %d tasks under ulimit -u %d (%d before): the limit did not hold", n, limit, own)
	}
	if o := sh(t, a.Agent, "echo alive"); strings.TrimSpace(o.stdout) != "alive" {
		t.Errorf("A's agent after the limit: %q %q", o.stdout, o.stderr)
	}
	if o := sh(t, b.Agent, "/bin/true && echo forked"); strings.TrimSpace(o.stdout) != "forked" {
		t.Errorf("B: fork while A is at its limit: %q %q", o.stdout, o.stderr)
	}
}

// tasksOf lists the tasks (threads) of the sandbox's pids cgroup.
func tasksOf(t *testing.T, f *fixture, id string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", f.parent, id, "tasks"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

// TestUsernsRecycle: a recycled container keeps its user namespace and id
// range; its new root (and /dev, /dev/shm, which the edge mounts then) is
// the sandbox's root's, and what the next sandbox writes is owned by the
// range.
func TestUsernsRecycle(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "sb-usrec")
	inst := f.start(t, spec)
	base := inst.Handle.IDBase
	uidMap := run(t, inst.Agent, "cat", "/proc/self/uid_map").stdout
	next := f.recycleSpec(t, spec, "sb-usrec-2")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := f.recycle(ctx, inst, next); err != nil {
		t.Fatal(err)
	}
	if got := run(t, inst.Agent, "cat", "/proc/self/uid_map").stdout; got != uidMap {
		t.Errorf("uid_map after recycling %q, want %q", got, uidMap)
	}
	o := sh(t, inst.Agent, `stat -c '%u:%g' / /dev /dev/shm /bin/busybox; touch /after && echo x > /dev/shm/y && echo done`)
	if got := strings.Fields(o.stdout); strings.Join(got, " ") != "0:0 0:0 0:0 0:0 done" {
		t.Errorf("after recycling: %q %q", o.stdout, o.stderr)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(next.Upper, "after"), &st); err != nil || st.Uid != base {
		t.Errorf("upper/after: uid %d (%v), want %d", st.Uid, err, base)
	}
}

// TestUsernsLeftovers: after a restart of the edge, the range of a
// sandbox that survived is found from the kernel (its agent's uid_map)
// and held until the sandbox is destroyed.
func TestUsernsLeftovers(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "sb-usleft")
	inst := f.start(t, spec)
	inst.Agent.Close() // the edge "crashed"

	rt2, err := New(Config{AgentPath: agentBin, CgroupParent: f.parent})
	if err != nil {
		t.Fatal(err)
	}
	defer rt2.ids.close()
	left, err := rt2.Leftovers(context.Background())
	if err != nil || len(left) != 1 {
		t.Fatalf("Leftovers = %+v, %v", left, err)
	}
	if left[0].IDBase != inst.Handle.IDBase {
		t.Fatalf("leftover's id base %d, want %d", left[0].IDBase, inst.Handle.IDBase)
	}
	if err := rt2.ids.reserve(inst.Handle.IDBase, "sb-other"); err == nil {
		t.Error("the leftover's range was given to another sandbox")
	}
	left[0].Socket = inst.Handle.Socket
	if err := rt2.Destroy(context.Background(), left[0]); err != nil {
		t.Fatal(err)
	}
	if n := rt2.ids.inUse(); n != 0 {
		t.Errorf("%d ranges in use after Destroy, want 0", n)
	}
}

// BenchmarkCreateExecStop measures create → first exec (true) → stop of a
// sandbox with a user namespace against the same as host root.
func BenchmarkCreateExecStop(b *testing.B) {
	for _, mode := range []struct {
		name     string
		hostRoot bool
	}{{"userns", false}, {"host-root", true}} {
		b.Run(mode.name, func(b *testing.B) {
			f := newFixture(b)
			rt, err := New(Config{AgentPath: agentBin, CgroupParent: f.parent, HostRoot: mode.hostRoot,
				Logger: f.rt.log})
			if err != nil {
				b.Fatal(err)
			}
			f.rt = rt
			ctx := context.Background()
			var total time.Duration
			for i := 0; i < b.N; i++ {
				spec := f.spec(b, fmt.Sprintf("sb-ces-%d", i))
				b.StartTimer()
				t0 := time.Now()
				inst, err := f.rt.Start(ctx, spec)
				if err != nil {
					b.Fatal(err)
				}
				if o := run(b, inst.Agent, "/bin/true"); o.res.ExitCode != 0 {
					b.Fatalf("true: %+v", o)
				}
				inst.Agent.Close()
				if err := f.rt.Destroy(ctx, inst.Handle); err != nil {
					b.Fatal(err)
				}
				total += time.Since(t0)
				b.StopTimer()
			}
			b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "ms/op-wall")
			if rt.ids != nil {
				rt.ids.close()
			}
		})
	}
}

// TestUsernsAgentProc: the sandbox's root cannot list the agent's
// descriptors (/proc/1/fd), read its environment or trace it, and
// open_by_handle_at is refused with EPERM (issue 13: both stayed open
// with sandboxes as host root).
func TestUsernsAgentProc(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "sb-agproc")
	installBudget(t, spec)
	inst := f.start(t, spec)
	o := sh(t, inst.Agent, `ls /proc/1/fd >/dev/null 2>&1 && echo fd-listed; ls /proc/1/task/*/fd >/dev/null 2>&1 && echo task-fd-listed; `+
		`cat /proc/1/environ >/dev/null 2>&1 && echo environ-read; cat /proc/1/comm; /bin/budget handle`)
	if got := strings.TrimSpace(o.stdout); got != "warren-agent\nopen_by_handle_at: operation not permitted" {
		t.Errorf("inside: %q (stderr %q), want only the agent's name and EPERM", got, o.stderr)
	}
}

// TestUsernsUnavailable: where the kernel cannot run sandboxes in user
// namespaces, the runtime refuses to start unless host root is allowed,
// and then says so (the node's view shows it) and runs them as host root.
func TestUsernsUnavailable(t *testing.T) {
	f := newFixture(t)
	probeUsernsFn = func(*idRanges) error { return errors.New("no idmapped mounts here") }
	defer func() { probeUsernsFn = probeUserns }()
	if _, err := New(Config{AgentPath: agentBin, CgroupParent: f.parent}); err == nil || !strings.Contains(err.Error(), "--allow-host-root") {
		t.Fatalf("New without AllowHostRoot: %v, want a refusal naming --allow-host-root", err)
	}
	rt, err := New(Config{AgentPath: agentBin, CgroupParent: f.parent, AllowHostRoot: true, Logger: f.rt.log})
	if err != nil {
		t.Fatal(err)
	}
	if mode, why := rt.Isolation(); mode != "host-root" || !strings.Contains(why, "no idmapped mounts here") {
		t.Errorf("Isolation() = %q, %q", mode, why)
	}
	f.rt = rt
	inst := f.start(t, f.spec(t, "sb-hostroot"))
	if inst.Handle.IDBase != 0 || hostUID(t, inst.Handle.Pid) != 0 {
		t.Errorf("id base %d, host uid %d: want host root", inst.Handle.IDBase, hostUID(t, inst.Handle.Pid))
	}
	if mode, _ := f.rt.Isolation(); mode != "host-root" {
		t.Error(mode)
	}
}
