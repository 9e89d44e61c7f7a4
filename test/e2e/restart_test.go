package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

func agentPid(t *testing.T, s *server, id string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.dataDir, "edge", "sandboxes", id+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Handle struct {
			Pid int `json:"pid"`
		} `json:"handle"`
	}
	if err := json.Unmarshal(b, &rec); err != nil || rec.Handle.Pid == 0 {
		t.Fatalf("record of %s: %s %v", id, b, err)
	}
	return rec.Handle.Pid
}

func TestRestartAdoptsLiveSandboxes(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	alive := s.create(t, api.CreateSandboxRequest{})
	doomed := s.create(t, api.CreateSandboxRequest{})
	s.sh(t, alive.ID, "cd /tmp && export KEEP=yes && echo state > /tmp/state")
	bg, err := s.C.Exec(ctx, alive.ID, api.ExecRequest{Cmd: "sleep 1; echo bg-done", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	doomedPid := agentPid(t, s, doomed.ID)

	s.kill9()
	// While warren is down, one sandbox dies.
	if err := syscall.Kill(doomedPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	s.start()

	got, err := s.C.Get(ctx, alive.ID)
	if err != nil || got.State != api.StateRunning {
		t.Fatalf("live sandbox not adopted: %+v %v\n%s", got, err, tail(s.logs.String(), 30))
	}
	r := s.sh(t, alive.ID, "cat /tmp/state; pwd; echo $KEEP")
	if r.Stdout != "state\n/tmp\nyes\n" {
		t.Fatalf("adopted sandbox lost state: %q", r.Stdout)
	}
	c, err := s.C.Command(ctx, alive.ID, bg.CommandID, true)
	if err != nil || c.Stdout != "bg-done\n" {
		t.Fatalf("background command across restart: %+v %v", c, err)
	}
	got, err = s.C.Get(ctx, doomed.ID)
	if err != nil || got.State != api.StateFailed {
		t.Fatalf("dead sandbox: %+v %v", got, err)
	}
	if m, _ := filepath.Glob("/sys/fs/cgroup/memory/warren/*/" + doomed.ID); len(m) > 0 {
		t.Fatalf("dead sandbox's cgroup was not removed")
	}
	s.stop()
	assertNoLeaks(t, s)
}
