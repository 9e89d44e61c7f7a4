package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/confine/confinetest"
	"github.com/warrenhq/warren/internal/runtime"
)

var (
	ipcOnce sync.Once
	ipcBin  string
	ipcErr  error
)

// ipcHelper builds testdata/ipc (static) once.
func ipcHelper(t *testing.T) string {
	ipcOnce.Do(func() {
		ipcBin = filepath.Join(buildDir, "ipc")
		ipcErr = confinetest.GoStatic(".", "build", "-o", ipcBin, "./testdata/ipc")
	})
	if ipcErr != nil {
		t.Fatal(ipcErr)
	}
	return ipcBin
}

// installIPCHelper puts testdata/ipc in the sandbox's lower layer as
// /bin/ipc.
func installIPCHelper(t *testing.T, spec *runtime.Spec) {
	t.Helper()
	b, err := os.ReadFile(ipcHelper(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(spec.Lowers[0], "bin", "ipc"), b, 0o755); err != nil {
		t.Fatal(err)
	}
}

// recycleSpec is spec with a fresh writable layer (and root dir) for the
// next sandbox in the same container.
func (f *fixture) recycleSpec(t *testing.T, spec *runtime.Spec, name string) *runtime.Spec {
	t.Helper()
	dir := filepath.Join(f.base, name)
	next := *spec
	next.Upper, next.Work = filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	for _, d := range []string{next.Upper, next.Work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return &next
}

// recycle wipes the sandbox and reroots it into next.
func (f *fixture) recycle(ctx context.Context, inst *runtime.Instance, next *runtime.Spec) error {
	if err := f.rt.Wipe(ctx, inst); err != nil {
		return err
	}
	if err := f.rt.Reroot(ctx, inst, next); err != nil {
		return err
	}
	return f.rt.Resume(ctx, inst, next)
}

func sh(t *testing.T, c *agentproto.Client, script string) execOut {
	t.Helper()
	return runReq(t, c, &agentproto.ExecRequest{Cmd: script})
}

// Testrecycle: a recycled container keeps nothing of its previous sandbox
// (files, processes, sessions, IPC objects, /dev/shm) and works as a
// fresh one, several times over.
func TestRecycle(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "recycle")
	installIPCHelper(t, spec)
	spec.Env = map[string]string{"FIRST": "1"}
	inst := f.start(t, spec)
	ctx := context.Background()

	freshMounts := sh(t, inst.Agent, "wc -l < /proc/self/mountinfo").stdout
	freshPwd := sh(t, inst.Agent, "echo $PWD").stdout
	for round := 1; round <= 3; round++ {
		// Leave everything a sandbox can leave behind.
		o := sh(t, inst.Agent, `echo secret > /root/secret; echo x > /dev/shm/x; echo y > /tmp/y
cd /tmp; export LEFT=over; f() { :; }
ipc make`)
		if o.res.ExitCode != 0 || o.stdout != "made\n" {
			t.Fatalf("round %d: leave things: %+v", round, o)
		}
		bg := runReq(t, inst.Agent, &agentproto.ExecRequest{Cmd: "sleep 1000", Background: true})
		if bg.res.CommandID == "" {
			t.Fatalf("background: %+v", bg)
		}
		sh(t, inst.Agent, "setsid sleep 1000 >/dev/null 2>&1 &")

		next := f.recycleSpec(t, spec, "recycle-"+string(rune('0'+round)))
		next.Env = map[string]string{"ROUND": string(rune('0' + round))}
		// Another image: a layer of its own on top of the base.
		top := filepath.Join(f.base, "top-"+string(rune('0'+round)))
		if err := os.MkdirAll(top, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(top, "marker"), []byte{byte('0' + round)}, 0o644); err != nil {
			t.Fatal(err)
		}
		next.Lowers = []string{top, spec.Lowers[len(spec.Lowers)-1]}
		if round == 2 {
			// Rerooted twice (the first root did not suit the create),
			// and closed to requests until resumed.
			if err := f.rt.Wipe(ctx, inst); err != nil {
				t.Fatal(err)
			}
			if err := f.rt.Reroot(ctx, inst, f.recycleSpec(t, spec, "recycle-2-unused")); err != nil {
				t.Fatal(err)
			}
			var res agentproto.ExecResult
			err := inst.Agent.Call(ctx, agentproto.OpExec, &agentproto.ExecRequest{Argv: []string{"true"}}, &res, nil)
			if err == nil || !strings.Contains(err.Error(), "recycled") {
				t.Fatalf("exec between wipe and resume: %v", err)
			}
			err = f.rt.Reroot(ctx, inst, next)
			if err == nil {
				err = f.rt.Resume(ctx, inst, next)
			}
			if err != nil {
				t.Fatal(err)
			}
		} else if err := f.recycle(ctx, inst, next); err != nil {
			log, _ := os.ReadFile(filepath.Join(spec.StateDir, LogName))
			t.Fatalf("round %d: recycle: %v\nagent log:\n%s", round, err, log)
		}
		o = sh(t, inst.Agent, `ls -A /root /tmp /dev/shm; echo "pwd=$PWD left=$LEFT first=$FIRST round=$ROUND"
type f >/dev/null 2>&1 && echo f defined
ps -o args | grep -c '[s]leep 1000'
ipc count
hostname; cat /marker; echo`)
		want := "/dev/shm:\n\n/root:\n\n/tmp:\n" + "pwd=" + strings.TrimSpace(freshPwd) + " left= first= round=" + string(rune('0'+round)) + "\n0\nshm=0 msg=0 sem=0 mq=0\nbox-recycle\n" + string(rune('0'+round)) + "\n"
		if o.stdout != want || o.res.ExitCode != 0 {
			t.Fatalf("round %d: after recycling:\n%s\nwant:\n%s\n(stderr %q)", round, o.stdout, want, o.stderr)
		}
		if got := sh(t, inst.Agent, "wc -l < /proc/self/mountinfo").stdout; got != freshMounts {
			t.Errorf("round %d: %s mounts, a fresh sandbox has %s", round, got, freshMounts)
		}
		// The new root is writable, on the new upper layer (the mount
		// table names layers by descriptor, not by host path), and the
		// file API sees it.
		if o := sh(t, inst.Agent, "echo new > /root/new && cat /root/new"); o.stdout != "new\n" {
			t.Fatalf("round %d: write: %+v", round, o)
		}
		if _, err := os.Stat(filepath.Join(next.Upper, "root", "new")); err != nil {
			t.Errorf("round %d: root is not the new overlay: %v", round, err)
		}
		var fl agentproto.FileList
		if err := inst.Agent.Call(ctx, agentproto.OpFileList, &agentproto.PathRequest{Path: "/root"}, &fl, nil); err != nil || len(fl.Files) != 1 || fl.Files[0].Name != "new" {
			t.Fatalf("round %d: list /root: %+v %v", round, fl, err)
		}
		// The old writable layer is the host's to delete.
		if err := os.RemoveAll(spec.Upper); err != nil {
			t.Errorf("remove old upper: %v", err)
		}
		spec = next
	}
}

// TestRecycleRefused: a container whose agent was tampered with, or whose
// network namespace still holds connections, is not reused.
func TestRecycleRefused(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	const tampered = "scheduling attributes or limits were changed"
	for _, tc := range []struct{ name, script, why string }{
		{"renice", "renice -n 5 -p 1", tampered},
		{"affinity", "taskset -p 1 1", tampered},
		{"thread", "renice -n 3 -p $(ls /proc/1/task | tail -1)", tampered},
		{"oom", "echo 500 > /proc/1/oom_score_adj", tampered},
		{"rlimit", "ipc prlimit", tampered},
		{"timewait", "nc -l -p 7000 >/dev/null & sleep 0.2; echo hi | nc 127.0.0.1 7000; sleep 0.2", "sockets left in the network namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := f.spec(t, "refuse-"+tc.name)
			installIPCHelper(t, spec)
			inst := f.start(t, spec)
			if o := sh(t, inst.Agent, tc.script); o.res.ExitCode != 0 {
				if tc.name == "oom" && inst.Handle.IDBase != 0 && strings.Contains(o.stderr, "Permission denied") {
					// In a user namespace the agent's /proc files are
					// host root's (userns.go): nothing to detect.
					return
				}
				t.Fatalf("%s: %+v", tc.script, o)
			}
			err := f.recycle(ctx, inst, f.recycleSpec(t, spec, "refused-"+tc.name))
			if !errors.Is(err, runtime.ErrNotReusable) || !strings.Contains(err.Error(), tc.why) {
				t.Fatalf("recycle after %q: %v, want ErrNotReusable (%s)", tc.script, err, tc.why)
			}
		})
	}
}

// TestRecycleBusy: a wipe while commands run kills them and their
// requests end; nothing starts afterwards.
func TestRecycleBusy(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "busy")
	inst := f.start(t, spec)
	ctx := context.Background()
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			var res agentproto.ExecResult
			_ = inst.Agent.Call(cctx, agentproto.OpExec, &agentproto.ExecRequest{Cmd: "sleep 30", Session: string(rune('a' + i))}, &res, func(*agentproto.Response) error { return nil })
		}(i)
	}
	time.Sleep(300 * time.Millisecond)
	t0 := time.Now()
	if err := f.recycle(ctx, inst, f.recycleSpec(t, spec, "busy-next")); err != nil {
		t.Fatalf("recycle: %v", err)
	}
	wg.Wait()
	if d := time.Since(t0); d > 10*time.Second {
		t.Errorf("commands ended %v after the wipe", d)
	}
	if o := sh(t, inst.Agent, "ps -o args | grep -c '[s]leep 30'"); o.stdout != "0\n" {
		t.Errorf("sleeps survive: %+v", o)
	}
}

func TestBusySockets(t *testing.T) {
	const quiet = "sockets: used 8\nTCP: inuse 0 orphan 3 tw 0 alloc 1 mem 160\nUDP: inuse 0 mem 0\nRAW: inuse 0\nFRAG: inuse 0 memory 0\n"
	if b := busySockets(quiet); b != "" {
		t.Errorf("quiet: %q", b)
	}
	if b := busySockets(strings.Replace(quiet, "tw 0", "tw 2", 1)); b != "TCP tw 2" {
		t.Errorf("time-wait: %q", b)
	}
	if b := busySockets("TCP6: inuse 1\nUDP6: inuse 4\n"); b != "TCP6 inuse 1, UDP6 inuse 4" {
		t.Errorf("v6: %q", b)
	}
}

// BenchmarkRecycle: one wipe and reroot of a sandbox that ran one command.
func BenchmarkRecycle(b *testing.B) {
	f := newFixture(b)
	spec := f.spec(b, "bench-recycle")
	inst := f.start(b, spec)
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		run(b, inst.Agent, "true")
		dir := filepath.Join(f.base, fmt.Sprintf("bench-%d", i))
		next := *spec
		next.Upper, next.Work = filepath.Join(dir, "upper"), filepath.Join(dir, "work")
		for _, d := range []string{next.Upper, next.Work} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		if err := f.rt.Wipe(ctx, inst); err != nil {
			b.Fatal(err)
		}
		if err := f.rt.Reroot(ctx, inst, &next); err != nil {
			b.Fatal(err)
		}
		if err := f.rt.Resume(ctx, inst, &next); err != nil {
			b.Fatal(err)
		}
	}
}

// TestAgentLogBounded: signals a sandbox sends its agent as fast as it can
// do not grow the agent's log on the host.
func TestAgentLogBounded(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "siglog")
	inst := f.start(t, spec)
	o := sh(t, inst.Agent, `i=0; while [ $i -lt 20000 ]; do kill -TERM 1; kill -HUP 1; i=$((i+1)); done; echo sent`)
	if o.stdout != "sent\n" {
		t.Fatalf("%+v", o)
	}
	time.Sleep(100 * time.Millisecond)
	fi, err := os.Stat(filepath.Join(spec.StateDir, LogName))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > 4096 {
		t.Fatalf("agent log is %d bytes after 40,000 signals", fi.Size())
	}
}
