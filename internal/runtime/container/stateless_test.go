package container

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
)

// TestStatelessReset runs tasks and resets in a loop: each reset must be
// quick and leave nothing behind.
func TestStatelessReset(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "stateless")
	spec.Stateless = []string{"/tmp", "/work"}
	inst := f.start(t, spec)
	for i := 0; i < 100; i++ {
		o := run(t, inst.Agent, "sh", "-c", "echo x > /tmp/f; sleep 100 & echo hi")
		if o.stdout != "hi\n" {
			t.Fatalf("task %d: %+v", i, o)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		t0 := time.Now()
		var rr agentproto.ResetResult
		err := inst.Agent.Call(ctx, agentproto.OpReset, nil, &rr, nil)
		cancel()
		if err != nil {
			syscall.Kill(inst.Handle.Pid, syscall.SIGQUIT)
			time.Sleep(500 * time.Millisecond)
			log, _ := os.ReadFile(filepath.Join(spec.StateDir, LogName))
			t.Fatalf("reset %d after %v: %v\nagent log:\n%s", i, time.Since(t0), err, log)
		}
		if d := time.Since(t0); d > time.Second {
			t.Errorf("reset %d took %v", i, d)
		}
		if o := run(t, inst.Agent, "sh", "-c", "ls -A /tmp; ps -o args | grep -c '[s]leep 100'"); o.stdout != "0\n" {
			t.Fatalf("after reset %d: %q", i, o.stdout)
		}
	}
	if o := run(t, inst.Agent, "sh", "-c", "echo x > /etc/x"); o.res.ExitCode == 0 {
		t.Fatal("the root is writable")
	}
}

func TestStatelessResetConcurrent(t *testing.T) {
	if os.Getenv("WARREN_TEST_STRESS") == "" {
		t.Skip("SKIP: set WARREN_TEST_STRESS=1")
	}
	f := newFixture(t)
	done := make(chan error, 12)
	for w := 0; w < 12; w++ {
		spec := f.spec(t, "stateless"+string(rune('a'+w)))
		spec.Stateless = []string{"/tmp", "/work"}
		spec.CPU = 0.3
		inst := f.start(t, spec)
		go func() {
			for i := 0; i < 40; i++ {
				ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
				var res agentproto.ExecResult
				err := inst.Agent.Call(ctx, agentproto.OpExec, &agentproto.ExecRequest{Cmd: "echo hi"}, &res, nil)
				if err == nil {
					var rr agentproto.ResetResult
					err = inst.Agent.Call(ctx, agentproto.OpReset, nil, &rr, nil)
				}
				cancel()
				if err != nil {
					syscall.Kill(inst.Handle.Pid, syscall.SIGQUIT)
					time.Sleep(500 * time.Millisecond)
					log, _ := os.ReadFile(filepath.Join(spec.StateDir, LogName))
					done <- fmt.Errorf("iteration %d: %v\nagent log:\n%s", i, err, log)
					return
				}
			}
			done <- nil
		}()
	}
	for w := 0; w < 12; w++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// TestStatelessZygote: shell commands of a stateless sandbox run in
// subshells of one zygote shell, which survives resets. No task may reach
// into it or leave anything in it for the next task.
func TestStatelessZygote(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "zygote")
	spec.Stateless = []string{"/tmp", "/work"}
	inst := f.start(t, spec)
	reset := func() {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		defer cancel()
		var rr agentproto.ResetResult
		if err := inst.Agent.Call(ctx, agentproto.OpReset, nil, &rr, nil); err != nil {
			t.Fatalf("reset: %v", err)
		}
	}
	sh := func(cmd string) execOut {
		t.Helper()
		return runReq(t, inst.Agent, &agentproto.ExecRequest{Cmd: cmd, Cwd: "/work"})
	}
	// $$ is the zygote's pid in its subshells.
	zygote := func() string {
		t.Helper()
		o := sh("echo $$")
		if o.res.ExitCode != 0 || o.stdout == "" {
			t.Fatalf("echo $$: %+v", o)
		}
		return o.stdout
	}
	first := zygote()
	reset()
	if again := zygote(); again != first {
		t.Fatalf("the zygote was not kept over a reset: %s then %s", first, again)
	}
	reset()

	// Shell state dies with the subshell.
	o := sh("export LEAK=1; cd /tmp; umask 077; f() { echo leak; }; alias ls=false; set -e; trap 'echo trap' EXIT; echo ok")
	if o.stdout != "ok\ntrap\n" || o.res.ExitCode != 0 {
		t.Fatalf("state task: %+v", o)
	}
	o = sh(`echo "[$LEAK] $(pwd) $(umask)"; type f >/dev/null 2>&1 && echo f; false; echo after`)
	if o.stdout != "[] /work 0022\nafter\n" {
		t.Fatalf("state leaked into the next command: %q", o.stdout)
	}
	// Exit codes, syntax errors, exit and return.
	for cmd, want := range map[string]int{"exit 3": 3, "return 4": 4, "(exit 5)": 5, "if then": 2, "false": 1} {
		if o := sh(cmd); o.res.ExitCode != want {
			t.Errorf("%q: exit %d, want %d (%+v)", cmd, o.res.ExitCode, want, o)
		}
	}
	if z := zygote(); z != first {
		t.Fatalf("commands replaced the zygote: %s then %s", first, z)
	}

	// Not dumpable: its memory, descriptors and environment are closed to
	// the tasks (same uid, no CAP_SYS_PTRACE).
	for _, p := range []string{"environ", "mem", "fd/3"} {
		if o := sh("cat /proc/$$/" + p + " >/dev/null"); o.res.ExitCode == 0 {
			t.Errorf("a task read the zygote's /proc/<pid>/%s", p)
		}
	}
	if o := sh("echo x >/proc/$$/fd/4"); o.res.ExitCode == 0 {
		t.Error("a task wrote into the zygote's report pipe")
	}

	// What a task, or a daemon it left, changes in the zygote gets it
	// replaced at the reset; a stopped zygote is continued.
	const later = "z=$$; (sleep 0.05; %s) >/dev/null 2>&1 &"
	for _, c := range []struct {
		cmd  string
		same bool
	}{
		{"renice -n 7 -p $$", false},
		{"taskset -p 1 $$", false},
		{"ionice -c 3 -p $$", false},
		{"echo 500 >/proc/$$/oom_score_adj", false},
		{"kill -9 $$", false},
		{fmt.Sprintf(later, "renice -n 5 -p $z"), false},
		{fmt.Sprintf(later, "kill -STOP $z"), true},
		{fmt.Sprintf(later, "kill -TERM $z"), false},
	} {
		t.Run(c.cmd, func(t *testing.T) {
			before := zygote()
			reset()
			sh(c.cmd)
			time.Sleep(200 * time.Millisecond) // the daemon's turn
			reset()
			after := zygote()
			if c.same != (after == before) {
				t.Fatalf("zygote %s then %s after %q", before, after, c.cmd)
			}
			o := sh("cat /proc/self/stat; cat /proc/self/oom_score_adj; taskset -p $$; ionice -p $$")
			if o.res.ExitCode != 0 {
				t.Fatalf("%+v", o)
			}
			lines := strings.Split(o.stdout, "\n")
			if len(lines) < 4 || lines[1] != "0" || strings.Contains(lines[3], "idle") || strings.HasSuffix(lines[2], "mask: 1") && runtime.NumCPU() > 1 {
				t.Fatalf("the change reached the next task: %s", o.stdout)
			}
			if f := strings.Fields(o.stdout[strings.LastIndexByte(o.stdout[:strings.IndexByte(o.stdout, '\n')], ')')+1:]); len(f) < 17 || f[16] != "0" {
				t.Fatalf("nice reached the next task: %s", o.stdout)
			}
		})
	}
	// A timed-out task ends with its zygote; the next one gets a new one.
	before := zygote()
	o = runReq(t, inst.Agent, &agentproto.ExecRequest{Cmd: "sleep 10", Timeout: 300 * time.Millisecond})
	if !o.res.TimedOut {
		t.Fatalf("sleep 10 with a 300 ms timeout: %+v", o)
	}
	reset()
	if after := zygote(); after == before {
		t.Fatal("the zygote of a timed-out task was kept")
	}
}

// TestStatelessExecResetAfter: an exec with ResetAfter answers first and
// resets after; the next request waits for the reset. Collect returns the
// output in the result, or in chunks past CollectMax.
func TestStatelessExecResetAfter(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "resetafter")
	spec.Stateless = []string{"/tmp", "/work"}
	inst := f.start(t, spec)
	call := func(cmd string) (agentproto.ExecResult, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var res agentproto.ExecResult
		chunked := 0
		err := inst.Agent.Call(ctx, agentproto.OpExec, &agentproto.ExecRequest{Cmd: cmd, Collect: true, ResetAfter: true}, &res,
			func(r *agentproto.Response) error { chunked += len(r.Data); return nil })
		if err != nil {
			t.Fatalf("%q: %v", cmd, err)
		}
		return res, chunked
	}
	for i := 0; i < 20; i++ {
		res, chunked := call("ls -A /tmp; ps -o args | grep -c '[s]leep 100'; echo x >/tmp/f; sleep 100 & echo err >&2")
		if string(res.Stdout) != "0\n" || string(res.Stderr) != "err\n" || chunked != 0 {
			t.Fatalf("task %d: stdout %q stderr %q, %d bytes in chunks", i, res.Stdout, res.Stderr, chunked)
		}
	}
	res, chunked := call(fmt.Sprintf("head -c %d /dev/zero", agentproto.CollectMax+1000))
	if got := len(res.Stdout) + chunked; got != agentproto.CollectMax+1000 || chunked == 0 {
		t.Fatalf("large output: %d bytes in the result and %d in chunks", len(res.Stdout), chunked)
	}
	// Not for a sandbox that is not stateless.
	spec2 := f.spec(t, "notstateless")
	inst2 := f.start(t, spec2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var r2 agentproto.ExecResult
	err := inst2.Agent.Call(ctx, agentproto.OpExec, &agentproto.ExecRequest{Cmd: "true", ResetAfter: true}, &r2, nil)
	var pe *agentproto.Error
	if !errors.As(err, &pe) || pe.Code != agentproto.ErrInvalid {
		t.Fatalf("reset_after on a sandbox that is not stateless: %v", err)
	}
}
