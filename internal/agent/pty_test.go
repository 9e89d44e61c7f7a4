package agent_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
)

// liveCall is an exec with live input in flight.
type liveCall struct {
	t    *testing.T
	a    *testAgent
	id   chan uint64
	mu   sync.Mutex
	out  bytes.Buffer
	res  agentproto.ExecResult
	errc chan error
	call uint64
}

func startLive(t *testing.T, a *testAgent, ctx context.Context, req *agentproto.ExecRequest) *liveCall {
	lc := &liveCall{t: t, a: a, id: make(chan uint64, 1), errc: make(chan error, 1)}
	go func() {
		lc.errc <- a.c.CallLive(ctx, agentproto.OpExec, req, &lc.res, func(r *agentproto.Response) error {
			lc.mu.Lock()
			lc.out.Write(r.Data)
			lc.mu.Unlock()
			return nil
		}, func(id uint64) { lc.id <- id })
	}()
	lc.call = <-lc.id
	return lc
}

func (lc *liveCall) input(in *agentproto.InputRequest) {
	lc.t.Helper()
	in.Call = lc.call
	if err := lc.a.c.Call(ctx(lc.t), agentproto.OpInput, in, nil, nil); err != nil {
		lc.t.Fatalf("input %+v: %v", in, err)
	}
}

// waitFor waits until the output holds want (after from bytes).
func (lc *liveCall) waitFor(want string, from int) int {
	lc.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		lc.mu.Lock()
		s := lc.out.String()
		lc.mu.Unlock()
		if i := strings.Index(s[min(from, len(s)):], want); i >= 0 {
			return from + i + len(want)
		}
		if time.Now().After(deadline) {
			lc.t.Fatalf("no %q in the output: %q", want, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (lc *liveCall) wait() error {
	select {
	case err := <-lc.errc:
		return err
	case <-time.After(20 * time.Second):
		lc.t.Fatal("the command did not end")
		return nil
	}
}

// A command on a terminal: it sees a terminal of the size asked, its
// input, a resize (SIGWINCH and the new size), and its exit code comes
// back.
func TestPTYExec(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	lc := startLive(t, a, ctx(t), &agentproto.ExecRequest{
		Cmd: `test -t 0 && echo tty-yes; stty size; read x; echo "got:$x"; stty size; exit 3`,
		PTY: &agentproto.WinSize{Cols: 100, Rows: 30},
	})
	at := lc.waitFor("tty-yes", 0)
	at = lc.waitFor("30 100", at)
	lc.input(&agentproto.InputRequest{Resize: &agentproto.WinSize{Cols: 120, Rows: 40}})
	lc.input(&agentproto.InputRequest{Data: []byte("hello\r")})
	at = lc.waitFor("got:hello", at)
	lc.waitFor("40 120", at)
	if err := lc.wait(); err != nil {
		t.Fatal(err)
	}
	if lc.res.ExitCode != 3 {
		t.Fatalf("exit code %d, want 3", lc.res.ExitCode)
	}
	// The resize signals the terminal's foreground process group.
	w := startLive(t, a, ctx(t), &agentproto.ExecRequest{
		Cmd: `trap 'echo winched; exit 0' WINCH; echo armed; while :; do sleep 0.05; done`,
		PTY: &agentproto.WinSize{Cols: 80, Rows: 24},
	})
	w.waitFor("armed", 0)
	w.input(&agentproto.InputRequest{Resize: &agentproto.WinSize{Cols: 81, Rows: 25}})
	w.waitFor("winched", 0)
	if err := w.wait(); err != nil || w.res.ExitCode != 0 {
		t.Fatalf("SIGWINCH: %v %+v", err, w.res)
	}
	// Its input is gone with it.
	err := a.c.Call(ctx(t), agentproto.OpInput, &agentproto.InputRequest{Call: lc.call, Data: []byte("x")}, nil, nil)
	if !agentproto.IsCode(err, agentproto.ErrNotFound) {
		t.Fatalf("input after the end: %v", err)
	}
}

// A terminal of no size or a huge one is refused.
func TestPTYBadSize(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	for _, ws := range []agentproto.WinSize{{Cols: 0, Rows: 24}, {Cols: 80, Rows: 60000}} {
		err := a.c.Call(ctx(t), agentproto.OpExec, &agentproto.ExecRequest{Cmd: "true", PTY: &ws}, nil, nil)
		if !agentproto.IsCode(err, agentproto.ErrInvalid) {
			t.Fatalf("size %+v: %v", ws, err)
		}
	}
}

// Live stdin without a terminal: a command reads what comes, and ends at
// the EOF.
func TestLiveStdin(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	lc := startLive(t, a, ctx(t), &agentproto.ExecRequest{Argv: []string{"sh", "-c", "while read l; do echo \"<$l>\"; done; exit 7"}, LiveStdin: true, Stdin: []byte("first\n")})
	at := lc.waitFor("<first>", 0)
	lc.input(&agentproto.InputRequest{Data: []byte("second\n")})
	lc.waitFor("<second>", at)
	lc.input(&agentproto.InputRequest{EOF: true})
	if err := lc.wait(); err != nil {
		t.Fatal(err)
	}
	if lc.res.ExitCode != 7 {
		t.Fatalf("exit code %d, want 7", lc.res.ExitCode)
	}
}

// A terminal whose caller goes away takes its whole session with it,
// jobs in process groups of their own included, within a second.
func TestPTYCancelKillsSession(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	pidf := filepath.Join(t.TempDir(), "pid")
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lc := startLive(t, a, cctx, &agentproto.ExecRequest{
		Cmd: "set -m; sleep 600 & echo $! > " + pidf + "; echo started; sleep 600",
		PTY: &agentproto.WinSize{Cols: 80, Rows: 24},
	})
	lc.waitFor("started", 0)
	b, err := os.ReadFile(pidf)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pg, _ := syscall.Getpgid(pid); pg != pid {
		t.Fatalf("the job is in process group %d, not its own", pg)
	}
	cancel()
	if err := lc.wait(); err != context.Canceled {
		t.Fatalf("call: %v", err)
	}
	gone := time.Now()
	for syscall.Kill(pid, 0) == nil {
		if time.Since(gone) > time.Second {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the job %d still runs 1s after the cancel", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A command that never reads the stdin it was given is still killed when
// its caller goes away (the stdin is written beside the call, not before
// it can be withdrawn), with and without a terminal.
func TestLiveStdinUnreadCancels(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	big := bytes.Repeat([]byte("x"), 4<<20)
	pidf := filepath.Join(t.TempDir(), "pid")
	cmd := "echo $$ > " + pidf + "; exec sleep 1000"
	for _, req := range []agentproto.ExecRequest{
		{Cmd: cmd, LiveStdin: true, Stdin: big},
		{Cmd: cmd, PTY: &agentproto.WinSize{Cols: 80, Rows: 24}, Stdin: big},
	} {
		os.Remove(pidf)
		cctx, cancel := context.WithCancel(context.Background())
		lc := startLive(t, a, cctx, &req)
		var pid int
		for deadline := time.Now().Add(10 * time.Second); pid == 0; time.Sleep(10 * time.Millisecond) {
			if b, err := os.ReadFile(pidf); err == nil && strings.HasSuffix(string(b), "\n") {
				pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			}
			if time.Now().After(deadline) {
				t.Fatal("the command did not start")
			}
		}
		cancel()
		if err := lc.wait(); err != context.Canceled {
			t.Fatalf("pty=%v: %v", req.PTY != nil, err)
		}
		gone := time.Now()
		for syscall.Kill(pid, 0) == nil {
			if time.Since(gone) > time.Second {
				syscall.Kill(pid, syscall.SIGKILL)
				t.Fatalf("pty=%v: the command outlived its withdrawn call by 1s", req.PTY != nil)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
