package agent_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
)

// A call the edge withdraws (OpCancel, sent when its context ends) kills
// the command's process group at once, children included, and the agent
// serves on.
func TestCancelKillsCommand(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	pidf := filepath.Join(t.TempDir(), "pid")
	for _, cmd := range []agentproto.ExecRequest{
		{Cmd: "sleep 600 & echo $! > " + pidf + "; sleep 600"},
		{Argv: []string{"/bin/sh", "-c", "sleep 600 & echo $! > " + pidf + "; sleep 600"}},
	} {
		os.Remove(pidf)
		cctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- a.c.Call(cctx, agentproto.OpExec, &cmd, nil, nil) }()
		var pid int
		deadline := time.Now().Add(5 * time.Second)
		for pid == 0 {
			if b, err := os.ReadFile(pidf); err == nil && strings.HasSuffix(string(b), "\n") {
				pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			}
			if time.Now().After(deadline) {
				t.Fatal("the command did not start")
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		if err := <-errc; err != context.Canceled {
			t.Fatalf("call: %v", err)
		}
		gone := time.Now()
		for syscall.Kill(pid, 0) == nil {
			if time.Since(gone) > time.Second {
				syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("%v: its child %d still runs 1s after the cancel", cmd, pid)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if r := a.mustExec(agentproto.ExecRequest{Cmd: "echo on"}); r.stdout.String() != "on\n" {
			t.Fatalf("after the cancel: %q", r.stdout.String())
		}
	}
}
