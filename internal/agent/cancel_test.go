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

// A call whose consumer stalls (a slow client of a download) holds back
// only itself: the sandbox's other calls on the same connection go on, and
// the stalled one gets every byte once its consumer reads again.
func TestSlowConsumerStallsOnlyItsCall(t *testing.T) {
	const size = 64 << 20
	a := startAgent(t, agentproto.SetupConfig{}, func(root string) {
		if err := os.WriteFile(filepath.Join(root, "big"), make([]byte, size), 0o644); err != nil {
			t.Fatal(err)
		}
	})
	stall := make(chan struct{})
	var got int
	errc := make(chan error, 1)
	go func() {
		errc <- a.c.Call(context.Background(), agentproto.OpFileRead, &agentproto.PathRequest{Path: "/big"}, nil, func(r *agentproto.Response) error {
			if got == 0 {
				<-stall
			}
			got += len(r.Data)
			return nil
		})
	}()
	time.Sleep(500 * time.Millisecond) // the read has filled what it may
	done := make(chan struct{})
	go func() {
		defer close(done)
		if r := a.mustExec(agentproto.ExecRequest{Cmd: "echo on"}); r.stdout.String() != "on\n" {
			t.Errorf("exec beside the stalled read: %q", r.stdout.String())
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		close(stall)
		t.Fatal("an exec waited for another call's stalled consumer")
	}
	close(stall)
	if err := <-errc; err != nil || got != size {
		t.Fatalf("the stalled read: %d of %d bytes, %v", got, size, err)
	}
}
