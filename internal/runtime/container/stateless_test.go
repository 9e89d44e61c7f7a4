package container

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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
