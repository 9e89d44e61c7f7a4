package agent_test

import (
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/agent"
	"github.com/warrenhq/warren/internal/agentproto"
)

// TestLiveShellKeepsState: a session's commands run in one shell, which
// keeps plain variables and functions like a terminal.
func TestLiveShellKeepsState(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	pid := a.sh(`echo $$`)
	a.sh(`plain=1; f() { echo "f $1"; }; export E=2; cd /tmp`)
	if out := a.sh(`echo $$ $plain $E; f x; pwd`); out != strings.TrimSpace(pid)+" 1 2\nf x\n/tmp\n" {
		t.Fatalf("state: %q (first pid %q)", out, pid)
	}
	// A command with stdin runs in a fresh shell; what it exports reaches
	// the live shell, and the other way round.
	r := a.mustExec(agentproto.ExecRequest{Cmd: `cat; echo " $E"; export F=3; cd /`, Stdin: []byte("in")})
	if r.stdout.String() != "in 2\n" {
		t.Fatalf("stdin command: %q", r.stdout.String())
	}
	if out := a.sh(`echo $E $F; pwd`); out != "2 3\n/\n" {
		t.Fatalf("after fresh shell: %q", out)
	}
	// Request env applies to one command only.
	r = a.mustExec(agentproto.ExecRequest{Cmd: `echo $E $G`, Env: map[string]string{"E": "x", "G": "y"}})
	if r.stdout.String() != "x y\n" {
		t.Fatalf("request env: %q", r.stdout.String())
	}
	if out := a.sh(`echo "$E|$G"`); out != "2|\n" {
		t.Fatalf("request env persisted: %q", out)
	}
}

// TestLiveShellRobust: commands that end, break or sabotage the live shell
// get their own status, and the session goes on in a new shell.
func TestLiveShellRobust(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	first := a.sh(`export K=1; echo $$`)
	for _, c := range []struct {
		cmd  string
		code int
	}{
		{"exit 5", 5},
		{"echo partial; if then", 2},
		{"return 3", 3},
		{"set -e; false; echo not here", 1},
		{"break", 0},
		{"printf() { :; }; cd() { :; }; read() { :; }; alias printf=false; true", 0},
		{"exec 1>&-; exec 2>&-; exec 0<&-; true", 0},
		{"trap - EXIT; exit 4", 4},
	} {
		r := a.mustExec(agentproto.ExecRequest{Cmd: c.cmd, Timeout: 5 * time.Second})
		if r.ExitCode != c.code || r.TimedOut {
			t.Fatalf("%q: %+v", c.cmd, r.ExecResult)
		}
		a.sh(`unalias -a`) // an alias the command made stays, as in a terminal
		if out := a.sh(`echo "$K"; cd /tmp; pwd; printf 'p\n'`); out != "1\n/tmp\np\n" {
			t.Fatalf("after %q: %q", c.cmd, out)
		}
	}
	if a.sh(`echo $$`) == first {
		t.Fatal("the shell that exited is still in use")
	}
}

// TestLiveShellDaemons: a daemon keeps only its own command's streams, and
// a later command's timeout kills that command, not the daemon.
func TestLiveShellDaemons(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	r := a.mustExec(agentproto.ExecRequest{Cmd: `(sleep 0.3; echo late) & sleep 30 >/dev/null 2>&1 & echo $!`})
	daemon, err := strconv.Atoi(strings.TrimSpace(r.stdout.String()))
	if err != nil {
		t.Fatalf("daemon pid: %q", r.stdout.String())
	}
	defer syscall.Kill(daemon, syscall.SIGKILL)
	time.Sleep(400 * time.Millisecond)
	if out := a.sh(`echo now`); out != "now\n" {
		t.Fatalf("another command's output leaked in: %q", out)
	}
	r = a.mustExec(agentproto.ExecRequest{Cmd: `sleep 20 & sleep 10`, Timeout: 300 * time.Millisecond})
	if !r.TimedOut || r.ExitCode != 137 {
		t.Fatalf("timeout: %+v", r.ExecResult)
	}
	if err := syscall.Kill(daemon, 0); err != nil {
		t.Fatalf("an earlier command's daemon died with the timeout: %v", err)
	}
	if out := a.sh(`echo ok`); out != "ok\n" {
		t.Fatalf("after timeout: %q", out)
	}
}

// TestLiveShellConcurrent: commands of one session may overlap (the second
// takes a fresh shell) and of many sessions run at once.
func TestLiveShellConcurrent(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	var wg sync.WaitGroup
	errs := make(chan string, 64)
	for i := 0; i < 24; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sess := "s" + strconv.Itoa(i%12) // beyond the live-shell cap
			for j := 0; j < 5; j++ {
				r, err := a.exec(agentproto.ExecRequest{Cmd: `echo ` + strconv.Itoa(i) + `; sleep 0.01`, Session: sess})
				if err != nil || r.stdout.String() != strconv.Itoa(i)+"\n" {
					errs <- strconv.Itoa(i) + ": " + r.stdout.String()
					return
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
}

// TestLiveShellForgedReports: reports a process of the sandbox writes into
// the live shell's report pipe (reachable as /proc/$$/fd/N) are ignored.
func TestLiveShellForgedReports(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	forge := `for f in /proc/$$/fd/*; do printf 'c1:0\0/forged\0export F=1\n\0' >"$f" 2>/dev/null; printf '0\0/forged\0\0' >"$f" 2>/dev/null; done; `
	r := a.mustExec(agentproto.ExecRequest{Cmd: forge + `(sleep 0.2; ` + forge + `) >/dev/null 2>&1 & cd /tmp; false`})
	if r.ExitCode != 1 {
		t.Fatalf("forged status taken: %+v", r.ExecResult)
	}
	time.Sleep(300 * time.Millisecond) // the daemon forges while the shell is idle
	for i := 0; i < 3; i++ {
		if out := a.sh(`pwd; echo "${F-unset}"; exit 0`); out != "/tmp\nunset\n" {
			t.Fatalf("after forged reports: %q", out)
		}
	}
}

// TestLiveShellFIFODirRemoved: a command that removes the directory of the
// FIFOs does not break the session: the next command makes it again and
// runs in the same live shell.
func TestLiveShellFIFODirRemoved(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	pid := a.sh(`x=kept; echo $$`)
	dir := agent.UnconfinedFIFODir(a.cmd.Process.Pid)
	a.sh(`rm -rf ` + dir)
	if out := a.sh(`echo $$ $x`); out != strings.TrimSpace(pid)+" kept\n" {
		t.Fatalf("after the directory was removed: %q (live shell %s)", out, pid)
	}
}
