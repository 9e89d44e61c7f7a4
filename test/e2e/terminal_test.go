package e2e

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// screen collects a terminal's output.
type screen struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *screen) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *screen) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor waits until the output after from holds want; it returns where
// want ends.
func (s *screen) waitFor(t *testing.T, want string, from int) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out := s.String()
		if i := strings.Index(out[min(from, len(out)):], want); i >= 0 {
			return from + i + len(want)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q on the screen: %q", want, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func openTerm(t *testing.T, c *warren.Client, id string, opt warren.TerminalOptions) (*warren.Terminal, *screen) {
	t.Helper()
	scr := &screen{}
	opt.Stdout = scr
	if opt.NoTTY && opt.Stderr == nil {
		opt.Stderr = io.Discard
	}
	term, err := c.Terminal(context.Background(), id, opt)
	if err != nil {
		t.Fatalf("terminal: %v", err)
	}
	t.Cleanup(func() { term.Close() })
	return term, scr
}

// sessionCount counts the processes of session sid in the sandbox.
func sessionCount(sid string) string {
	return "cat /proc/[0-9]*/stat 2>/dev/null | awk '$6 == " + sid + "' | wc -l"
}

func waitExit(t *testing.T, term *warren.Terminal) *api.ExecResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := term.Wait(ctx)
	if err != nil {
		t.Fatalf("wait: %v", err)
	}
	return res
}

// TestTerminal drives programs through GET /v1/sandboxes/{id}/pty: a full-
// screen editor, a resize the program sees, exit codes, the sandbox's
// shell, live stdin without a terminal, a client that goes away, and bad
// input.
func TestTerminal(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{CPU: 0.5, MemoryMB: 128})

	t.Run("vi", func(t *testing.T) {
		term, scr := openTerm(t, s.C, sb.ID, warren.TerminalOptions{Argv: []string{"vi", "/tmp/note.txt"}, Cols: 80, Rows: 24})
		// vi paints its screen: the empty lines' tildes and the file's name
		// on the status line, with cursor movements.
		at := scr.waitFor(t, "/tmp/note.txt", 0)
		out := scr.String()
		if !strings.Contains(out, "~") || !strings.Contains(out, "\x1b[") {
			t.Fatalf("no vi screen: %q", out)
		}
		if _, err := term.Write([]byte("ihello from a terminal")); err != nil {
			t.Fatal(err)
		}
		scr.waitFor(t, "hello from a terminal", at)
		// Escape alone (vi reads a key sequence that starts with it as one
		// key), then the command.
		if _, err := term.Write([]byte("\x1b")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(300 * time.Millisecond)
		if _, err := term.Write([]byte(":wq\r")); err != nil {
			t.Fatal(err)
		}
		if res := waitExit(t, term); res.ExitCode != 0 {
			t.Fatalf("vi: %+v\n%q", res, scr.String())
		}
		if r := s.sh(t, sb.ID, "cat /tmp/note.txt"); r.Stdout != "hello from a terminal\n" {
			t.Fatalf("the file vi wrote: %q", r.Stdout)
		}
	})

	t.Run("resize", func(t *testing.T) {
		term, scr := openTerm(t, s.C, sb.ID, warren.TerminalOptions{
			Cmd: `stty size; read x; stty size; exit 3`, Cols: 100, Rows: 30})
		at := scr.waitFor(t, "30 100", 0)
		if err := term.Resize(ctx, 132, 43); err != nil {
			t.Fatal(err)
		}
		if _, err := term.Write([]byte("\r")); err != nil {
			t.Fatal(err)
		}
		scr.waitFor(t, "43 132", at)
		if res := waitExit(t, term); res.ExitCode != 3 {
			t.Fatalf("exit code: %+v", res)
		}
	})

	t.Run("shell", func(t *testing.T) {
		// No command: the sandbox's shell, on a terminal.
		term, scr := openTerm(t, s.C, sb.ID, warren.TerminalOptions{})
		if _, err := term.Write([]byte("tty; echo $((6*7))x\r")); err != nil {
			t.Fatal(err)
		}
		at := scr.waitFor(t, "/dev/pts/", 0)
		scr.waitFor(t, "42x", at)
		if _, err := term.Write([]byte("exit 5\r")); err != nil {
			t.Fatal(err)
		}
		if res := waitExit(t, term); res.ExitCode != 5 {
			t.Fatalf("exit code: %+v", res)
		}
	})

	t.Run("user", func(t *testing.T) {
		// As the user asked (or the sandbox's), who owns the terminal, in
		// the directory asked, with TERM set.
		term, scr := openTerm(t, s.C, sb.ID, warren.TerminalOptions{
			Cmd: `echo "u=$(id -u) term=$TERM cwd=$(pwd)"; stat -c 'owner=%u' "$(tty)"`, User: "nobody", Cwd: "/tmp"})
		at := scr.waitFor(t, "u=65534 term=xterm cwd=/tmp", 0)
		scr.waitFor(t, "owner=65534", at)
		if res := waitExit(t, term); res.ExitCode != 0 {
			t.Fatalf("exit: %+v", res)
		}
	})

	t.Run("stdin", func(t *testing.T) {
		var stderr screen
		term, scr := openTerm(t, s.C, sb.ID, warren.TerminalOptions{
			Argv: []string{"sh", "-c", "cat; echo done >&2; exit 4"}, NoTTY: true, Stderr: &stderr})
		if _, err := term.Write([]byte("line one\n")); err != nil {
			t.Fatal(err)
		}
		scr.waitFor(t, "line one\n", 0)
		if _, err := term.Write([]byte("line two\n")); err != nil {
			t.Fatal(err)
		}
		if err := term.CloseInput(ctx); err != nil {
			t.Fatal(err)
		}
		res := waitExit(t, term)
		if res.ExitCode != 4 || scr.String() != "line one\nline two\n" || stderr.String() != "done\n" {
			t.Fatalf("live stdin: %+v stdout %q stderr %q", res, scr.String(), stderr.String())
		}
	})

	t.Run("big input", func(t *testing.T) {
		// More than one WebSocket message and one input frame hold.
		term, scr := openTerm(t, s.C, sb.ID, warren.TerminalOptions{Argv: []string{"wc", "-c"}, NoTTY: true})
		if _, err := term.Write(bytes.Repeat([]byte("0123456789abcdef"), 3<<16)); err != nil {
			t.Fatal(err)
		}
		if err := term.CloseInput(ctx); err != nil {
			t.Fatal(err)
		}
		if res := waitExit(t, term); res.ExitCode != 0 || strings.TrimSpace(scr.String()) != "3145728" {
			t.Fatalf("3 MiB of input: %+v %q", res, scr.String())
		}
	})

	t.Run("pause", func(t *testing.T) {
		// Input to a paused sandbox's terminal resumes it, as any operation.
		term, scr := openTerm(t, s.C, sb.ID, warren.TerminalOptions{Cmd: "cat"})
		if _, err := term.Write([]byte("before\r")); err != nil {
			t.Fatal(err)
		}
		at := scr.waitFor(t, "before\r\n", 0)
		if v, err := s.C.Pause(ctx, sb.ID); err != nil || v.State != api.StatePaused {
			t.Fatalf("pause: %+v %v", v, err)
		}
		if _, err := term.Write([]byte("after\r")); err != nil {
			t.Fatal(err)
		}
		scr.waitFor(t, "after\r\n", at)
		if v, err := s.C.Get(ctx, sb.ID); err != nil || v.State != api.StateRunning {
			t.Fatalf("after typing: %+v %v", v, err)
		}
	})

	t.Run("signal", func(t *testing.T) {
		for _, noTTY := range []bool{false, true} {
			term, scr := openTerm(t, s.C, sb.ID, warren.TerminalOptions{Cmd: "echo up; exec sleep 1000", NoTTY: noTTY})
			scr.waitFor(t, "up", 0)
			if err := term.Signal(ctx, 15); err != nil {
				t.Fatal(err)
			}
			if res := waitExit(t, term); res.ExitCode != 143 || res.Signal != "SIGTERM" {
				t.Fatalf("tty=%v: SIGTERM: %+v", !noTTY, res)
			}
		}
	})

	t.Run("flow control", func(t *testing.T) {
		// A client that does not read stops the program at its terminal:
		// its writes stall (wchar stands still) until the client reads.
		// (always_on: at the idle CPU budget the program would be too slow
		// to fill the buffers on the way.)
		sb := s.create(t, api.CreateSandboxRequest{CPU: 0.5, MemoryMB: 64, AlwaysOn: true})
		// (dd writes 4 KiB blocks; busybox yes on a terminal
		// writes a line, 2 bytes, per call, and took ~27 s to fill them.)
		term, err := s.C.Terminal(ctx, sb.ID, warren.TerminalOptions{Cmd: "echo $$ > /tmp/yes.pid; exec dd if=/dev/zero bs=4096 2>/dev/null"})
		if err != nil {
			t.Fatal(err)
		}
		defer term.Close()
		var pid string
		for deadline := time.Now().Add(10 * time.Second); pid == ""; time.Sleep(20 * time.Millisecond) {
			pid = strings.TrimSpace(s.sh(t, sb.ID, "cat /tmp/yes.pid 2>/dev/null").Stdout)
			if time.Now().After(deadline) {
				t.Fatal("no pid")
			}
		}
		wchar := func() int64 {
			r := s.sh(t, sb.ID, "awk '/^wchar/ {print $2}' /proc/"+pid+"/io")
			n, err := strconv.ParseInt(strings.TrimSpace(r.Stdout), 10, 64)
			if err != nil {
				t.Fatalf("wchar of %s: %+v", pid, r)
			}
			return n
		}
		var w0, w1 int64
		began := time.Now()
		// The buffers on the way hold a few MiB; a loaded -race run
		// fills them slowly.
		for deadline := time.Now().Add(150 * time.Second); ; {
			w0 = wchar()
			time.Sleep(time.Second)
			if w1 = wchar(); w1 == w0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the program's output never stalled: %d then %d bytes", w0, w1)
			}
		}
		t.Logf("stalled after %d bytes written while the client did not read (%v)", w1, time.Since(began))
		if w1 > 256<<20 {
			t.Errorf("%d bytes were taken before the stall: the buffers are not bounded", w1)
		}
		buf := make([]byte, 1<<20)
		for read := 0; read < 8<<20; { // more than the buffers on the way hold
			n, err := term.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			read += n
		}
		if w2 := wchar(); w2 <= w1 {
			t.Errorf("reading did not let the program go on: %d then %d", w1, w2)
		}
		t.Logf("read 8 MiB (%v)", time.Since(began))
	})

	t.Run("disconnect", func(t *testing.T) {
		term, scr := openTerm(t, s.C, sb.ID, warren.TerminalOptions{Cmd: "echo $$ > /tmp/term.pid; sleep 1000 & echo ready; wait"})
		scr.waitFor(t, "ready", 0)
		pid := strings.TrimSpace(s.sh(t, sb.ID, "cat /tmp/term.pid").Stdout)
		if _, err := strconv.Atoi(pid); err != nil {
			t.Fatalf("pid %q", pid)
		}
		if r := s.sh(t, sb.ID, sessionCount(pid)); strings.TrimSpace(r.Stdout) != "2" {
			t.Fatalf("the terminal's session: %q", r.Stdout)
		}
		term.Close()
		gone := time.Now()
		for {
			r := s.sh(t, sb.ID, sessionCount(pid))
			if strings.TrimSpace(r.Stdout) == "0" {
				t.Logf("the session was gone %v after the client left", time.Since(gone))
				break
			}
			if time.Since(gone) > time.Second {
				t.Fatalf("the terminal's session still runs 1s after its client left: %q", r.Stdout)
			}
			time.Sleep(20 * time.Millisecond)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		for _, q := range []string{"cols=0", "rows=100000", "cols=x", "tty=maybe", "env=NOEQUALS", "timeout=-1", "cmd=a%00b", "tty=false"} {
			code, body := s.rawRequest(t, "GET", "/v1/sandboxes/"+sb.ID+"/pty?"+q, "", nil, nil)
			if code != 400 && code != 422 {
				t.Errorf("%s: %d %s", q, code, body)
			}
		}
		_, err := s.C.Terminal(ctx, sb.ID, warren.TerminalOptions{Cols: 0, Rows: 99999})
		if warren.StatusOf(err)/100 != 4 {
			t.Errorf("huge rows through the SDK: %v", err)
		}
		// Not a WebSocket: a clear 400.
		if code, body := s.rawRequest(t, "GET", "/v1/sandboxes/"+sb.ID+"/pty", "", nil, nil); code != 400 || !strings.Contains(body, "WebSocket") {
			t.Errorf("a plain GET: %d %s", code, body)
		}
		// Another project's sandbox is not found.
		if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: "term-other"}); err != nil {
			t.Fatal(err)
		}
		tk, err := s.C.CreateToken(ctx, api.CreateTokenRequest{Principal: "term-other", Project: "term-other", Role: api.RoleAdmin})
		if err != nil {
			t.Fatal(err)
		}
		other := warren.New(s.URL, tk.Secret)
		if _, err := other.Terminal(ctx, sb.ID, warren.TerminalOptions{Cmd: "id"}); warren.StatusOf(err) != 404 {
			t.Errorf("another project's sandbox: %v", err)
		}
		// A bad control message closes the terminal (and its command).
		term, _ := openTerm(t, s.C, sb.ID, warren.TerminalOptions{Cmd: "sleep 1000"})
		if err := term.Resize(ctx, 0, 10); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if _, err := term.Wait(wctx); err == nil || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("a resize to 0 columns: %v", err)
		}
	})
}

// TestTerminalTypingKeepsCPU: a terminal with typing counts as an
// operation (issue 21): the sandbox has its full CPU while someone types,
// and falls back to its idle budget a few seconds after the typing stops.
func TestTerminalTypingKeepsCPU(t *testing.T) {
	s := sharedServer(t)
	idle := 0.02
	sb := s.create(t, api.CreateSandboxRequest{CPU: 1, IdleCPU: &idle, Priority: api.PriorityLatency})
	pid := agentPid(t, s, sb.ID)
	spin(t, s, sb.ID)
	term, scr := openTerm(t, s.C, sb.ID, warren.TerminalOptions{Cmd: "cat > /dev/null"})
	_ = scr
	time.Sleep(6 * time.Second) // the start's activity passes
	if r := cpuRateOf(t, pid, 2*time.Second); r > 0.04 {
		t.Errorf("an open terminal without typing: %.3f cores, want the 0.02 idle budget", r)
	}
	stop := make(chan struct{})
	typed := make(chan struct{})
	go func() {
		defer close(typed)
		for {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
				if _, err := term.Write([]byte("x")); err != nil {
					return
				}
			}
		}
	}()
	time.Sleep(500 * time.Millisecond)
	typing := cpuRateOf(t, pid, 3*time.Second)
	close(stop)
	<-typed
	t.Logf("while typing: %.3f cores", typing)
	if typing < 0.1 {
		t.Errorf("while someone types the sandbox uses %.3f cores: it did not get its CPU", typing)
	}
	time.Sleep(6 * time.Second)
	if r := cpuRateOf(t, pid, 2*time.Second); r > 0.04 {
		t.Errorf("after the typing stopped: %.3f cores, want the idle budget", r)
	}
}

// TestCLIShell: `warren shell` on a local terminal (as over SSH) puts it in
// raw mode, follows its window size (SIGWINCH), and exits with the remote
// exit code; with stdin a pipe it feeds the program and ends its input.
func TestCLIShell(t *testing.T) {
	s := sharedServer(t)
	sb := s.create(t, api.CreateSandboxRequest{CPU: 0.5, MemoryMB: 128})

	// On a terminal.
	cmd := exec.Command(bins.warren, "--url", s.URL, "--token", s.Token, "shell", sb.ID, "--",
		"sh", "-c", "stty size; read x; echo got:$x; stty size; exit 7")
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Cols: 100, Rows: 30})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	scr := &screen{}
	go func() { _, _ = io.Copy(scr, ptmx) }() // ends when ptmx closes
	at := scr.waitFor(t, "30 100", 0)
	// Raw mode: the local terminal no longer echoes or cooks; the remote
	// one does.
	if err := pty.Setsize(ptmx, &pty.Winsize{Cols: 120, Rows: 40}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the resize travels before the line
	if _, err := ptmx.Write([]byte("typed\r")); err != nil {
		t.Fatal(err)
	}
	at = scr.waitFor(t, "got:typed", at)
	scr.waitFor(t, "40 120", at)
	werr := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(werr, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("warren shell: %v, want exit code 7; screen %q", werr, scr.String())
	}

	// Stdin a pipe: no terminal on either side, stderr apart; its end is
	// the program's end of input. (Before, the remote had a terminal and
	// both streams came on stdout.)
	c2 := exec.Command(bins.warren, "--url", s.URL, "--token", s.Token, "shell", sb.ID, "test -t 0 || echo no-tty; echo to-stderr >&2; cat; exit 9")
	c2.Stdin = strings.NewReader("piped line\n")
	var out, errOut bytes.Buffer
	c2.Stdout, c2.Stderr = &out, &errOut
	werr = c2.Run()
	if !errors.As(werr, &ee) || ee.ExitCode() != 9 || out.String() != "no-tty\npiped line\n" || errOut.String() != "to-stderr\n" {
		t.Fatalf("warren shell with a pipe: %v stdout %q stderr %q", werr, out.String(), errOut.String())
	}
	// The sandbox's own shell with stdin at its end at once (/dev/null):
	// it reads no command and exits, every time (a ^D on a terminal could
	// reach the shell before its line editor and be lost: the docs test
	// hung on it).
	for i := 0; i < 5; i++ {
		c3 := exec.Command(bins.warren, "--url", s.URL, "--token", s.Token, "shell", sb.ID)
		c3.WaitDelay = 5 * time.Second
		done := make(chan error, 1)
		if err := c3.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { done <- c3.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("warren shell < /dev/null: %v", err)
			}
		case <-time.After(20 * time.Second):
			_ = c3.Process.Kill()
			t.Fatalf("warren shell < /dev/null did not end (try %d)", i)
		}
	}
}

// TestTerminalTypingIsActivity: typing in a terminal restarts the idle
// timer; an open terminal nobody types in does not keep its sandbox.
func TestTerminalTypingIsActivity(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{CPU: 0.5, MemoryMB: 64, IdleTimeout: 2})
	term, scr := openTerm(t, s.C, sb.ID, warren.TerminalOptions{Cmd: "cat"})
	for i := 0; i < 12; i++ { // 4.8 s, more than twice the idle timeout
		if _, err := term.Write([]byte("k\r")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(400 * time.Millisecond)
	}
	if v, err := s.C.Get(ctx, sb.ID); err != nil || v.State != api.StateRunning {
		t.Fatalf("typed in every 0.4 s, a sandbox with a 2 s idle timeout: %+v %v (screen %q)", v, err, scr.String())
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		v, err := s.C.Get(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if v.State == api.StateStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("an open terminal nobody types in kept its sandbox: %s", v.State)
		}
		time.Sleep(200 * time.Millisecond)
	}
	// The terminal ended with its sandbox.
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := term.Wait(wctx); errors.Is(err, context.DeadlineExceeded) {
		t.Fatal("the terminal outlived its stopped sandbox")
	}
}

// checkTerminal opens a terminal in sandbox id (any tier): a tty, its
// size, a resize the program sees, input, and the exit code.
func checkTerminal(t *testing.T, c *warren.Client, id string) {
	t.Helper()
	term, scr := openTerm(t, c, id, warren.TerminalOptions{
		Cmd: `tty; stty size; read x; stty size; echo "got:$x"; exit 7`, Cols: 80, Rows: 24})
	at := scr.waitFor(t, "/dev/pts/", 0)
	at = scr.waitFor(t, "24 80", at)
	if err := term.Resize(context.Background(), 100, 30); err != nil {
		t.Fatal(err)
	}
	if _, err := term.Write([]byte("typed\r")); err != nil {
		t.Fatal(err)
	}
	at = scr.waitFor(t, "30 100", at)
	scr.waitFor(t, "got:typed", at)
	if res := waitExit(t, term); res.ExitCode != 7 {
		t.Fatalf("terminal exit: %+v\n%q", res, scr.String())
	}
}
