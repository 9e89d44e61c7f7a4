package container

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/hoststat/swaptest"
)

// policies maps every thread of every process in the sandbox's cgroup to
// its scheduling policy.
func policies(t *testing.T, f *fixture, cg string) map[int]uint32 {
	t.Helper()
	out := map[int]uint32{}
	for _, pid := range procsOf(f.rt.cg.dirs(cg)) {
		tasks, _ := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
		for _, e := range tasks {
			tid, _ := strconv.Atoi(e.Name())
			a, err := unix.SchedGetAttr(tid, 0)
			if err != nil {
				continue // exited meanwhile
			}
			out[tid] = a.Policy
		}
	}
	return out
}

func cgFile(t *testing.T, f *fixture, controller, cg, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(f.rt.cg.(*v1Driver).mountOf(controller), cg, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestPriorityClasses(t *testing.T) {
	f := newFixture(t)
	if _, ok := f.rt.cg.(*v1Driver); !ok {
		t.Skip("SKIP: the assertions read cgroup v1 files")
	}
	for _, tc := range []struct {
		prio   string
		policy uint32
		shares string
		idle   string
	}{
		{api.PriorityBestEffort, unix.SCHED_IDLE, "2", "1"},
		{api.PriorityLatency, unix.SCHED_NORMAL, "1024", "0"},
	} {
		t.Run(tc.prio, func(t *testing.T) {
			spec := f.spec(t, "prio-"+strings.ReplaceAll(tc.prio, "-", ""))
			spec.Priority = tc.prio
			inst := f.start(t, spec)
			// A command started later inherits the class too.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var res agentproto.ExecResult
			if err := inst.Agent.Call(ctx, agentproto.OpExec, &agentproto.ExecRequest{Argv: []string{"sleep", "30"}, Background: true}, &res, nil); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			pol := policies(t, f, inst.Handle.Cgroup)
			if len(pol) < 3 {
				t.Fatalf("only %d threads found in the sandbox", len(pol))
			}
			for tid, p := range pol {
				if p != tc.policy {
					t.Errorf("thread %d has policy %d, want %d", tid, p, tc.policy)
				}
			}
			// An idle group reads back the idle weight (3) as its shares.
			if got := cgFile(t, f, "cpu", inst.Handle.Cgroup, "cpu.shares"); got != tc.shares && !(tc.idle == "1" && got == "3") {
				t.Errorf("cpu.shares = %s, want %s", got, tc.shares)
			}
			if _, err := os.Stat("/sys/fs/cgroup/cpu/cpu.idle"); err == nil {
				if got := cgFile(t, f, "cpu", inst.Handle.Cgroup, "cpu.idle"); got != tc.idle {
					t.Errorf("cpu.idle = %s, want %s", got, tc.idle)
				}
			}
		})
	}
	// The edge's own threads are back to normal scheduling.
	self, err := unix.SchedGetAttr(0, 0)
	if err != nil || self.Policy != unix.SCHED_NORMAL {
		t.Errorf("test process policy %v, %v", self, err)
	}
}

func TestAnonRanges(t *testing.T) {
	maps := `00400000-00452000 r-xp 00000000 08:02 173521      /usr/bin/dbus-daemon
00e03000-00e24000 rw-p 00000000 00:00 0                                  [heap]
7f1c00000000-7f1c00021000 rw-p 00000000 00:00 0
7f1c00021000-7f1c04000000 ---p 00000000 00:00 0
7f1c1000a000-7f1c1000b000 rw-s 00000000 00:05 12345                      /dev/zero (deleted)
7f1c2000a000-7f1c2000b000 rw-p 00001000 08:02 17 /lib/libc.so
7ffd4a1f3000-7ffd4a214000 rw-p 00000000 00:00 0                          [stack]
7ffd4a2f9000-7ffd4a2fd000 r--p 00000000 00:00 0                          [vvar]
7ffd4a2fd000-7ffd4a2ff000 r-xp 00000000 00:00 0                          [vdso]
7f1c30000000-7f1c30001000 rw-p 00000000 00:00 0                          [anon:go]
garbage line
zz-yy rw-p 00000000 00:00 0
`
	got := anonRanges([]byte(maps))
	want := []remoteIovec{{0xe03000, 0x21000}, {0x7f1c00000000, 0x21000}, {0x7f1c00021000, 0x7f1c04000000 - 0x7f1c00021000}, {0x7ffd4a1f3000, 0x21000}, {0x7f1c30000000, 0x1000}}
	if len(got) != len(want) {
		t.Fatalf("got %d ranges %x, want %x", len(got), got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("range %d = %x, want %x", i, got[i], want[i])
		}
	}
}

func TestReclaimToSwap(t *testing.T) {
	f := newFixture(t)
	swaptest.Ensure(t, 1024)
	spec := f.spec(t, "reclaim")
	spec.MemoryMB = 128
	inst := f.start(t, spec)
	ctx := context.Background()
	// A shell holding ~48 MiB of anonymous memory.
	var res agentproto.ExecResult
	err := inst.Agent.Call(ctx, agentproto.OpExec, &agentproto.ExecRequest{
		Cmd: `x=$(head -c 50000000 /dev/zero | tr '\0' a); echo ready >/tmp/ready; sleep 600`, Background: true}, &res, nil)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for run(t, inst.Agent, "cat", "/tmp/ready").stdout != "ready\n" {
		if time.Now().After(deadline) {
			t.Fatal("the memory holder did not get ready")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := f.rt.Freeze(ctx, inst.Handle); err != nil {
		t.Fatal(err)
	}
	before, after, err := f.rt.Reclaim(ctx, inst.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("reclaim: %d MiB -> %d MiB", before>>20, after>>20)
	if before < 45<<20 || after > before-40<<20 {
		t.Errorf("reclaim %d -> %d bytes: want at least 40 MiB returned", before, after)
	}
	if err := f.rt.Restore(ctx, inst.Handle, spec.MemoryMB); err != nil {
		t.Fatal(err)
	}
	// Prefetch asks for the holder's swapped-out memory back before the
	// sandbox runs again, and the pages come back without a fault.
	na, err := f.rt.Prefetch(ctx, inst.Handle, false)
	if err != nil {
		t.Fatal(err)
	}
	n, err := f.rt.Prefetch(ctx, inst.Handle, true)
	if err != nil {
		t.Fatal(err)
	}
	if na <= 0 {
		t.Errorf("prefetch of the agent advised %d bytes", na)
	}
	if n < 48<<20 {
		t.Errorf("prefetch advised %d bytes, want the holder's ~48 MiB at least", n)
	}
	back := int64(0)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if back, err = f.rt.MemoryUsage(inst.Handle); err == nil && back >= after+40<<20 {
			break
		}
	}
	t.Logf("prefetch: advised %d MiB; usage %d MiB while still frozen", n>>20, back>>20)
	if back < after+40<<20 {
		t.Errorf("after prefetch the frozen sandbox holds %d bytes (reclaimed to %d): swapped memory not read back", back, after)
	}
	if err := f.rt.Thaw(ctx, inst.Handle); err != nil {
		t.Fatal(err)
	}
	// The memory comes back and the holder still works.
	if o := run(t, inst.Agent, "sh", "-c", "echo ok"); o.stdout != "ok\n" {
		t.Fatalf("after resume: %+v", o)
	}
	if got := cgFile(t, f, "memory", inst.Handle.Cgroup+"/"+boxName, "memory.limit_in_bytes"); got != strconv.FormatInt(128<<20, 10) {
		t.Errorf("limit after Restore = %s", got)
	}
	if got := cgFile(t, f, "memory", inst.Handle.Cgroup, "memory.limit_in_bytes"); got != strconv.FormatInt((128+agentReserveMB)<<20, 10) {
		t.Errorf("limit with the agent's reserve after Restore = %s", got)
	}
	// Reclaim's swappiness goes back to the parent's (the container may
	// serve other sandboxes later).
	if got, want := cgFile(t, f, "memory", inst.Handle.Cgroup, "memory.swappiness"), cgFile(t, f, "memory", f.parent, "memory.swappiness"); got != want {
		t.Errorf("swappiness after Restore = %s, want the parent's %s", got, want)
	}
	u, err := f.rt.Usage()
	if err != nil || u.MemoryBytes <= 0 || u.CPUSeconds <= 0 {
		t.Errorf("Usage = %+v, %v", u, err)
	}
}
