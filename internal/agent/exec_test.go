package agent_test

import (
	"fmt"
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

func TestExecBasics(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	r := a.mustExec(agentproto.ExecRequest{Cmd: "echo hello; echo err >&2; exit 3"})
	if r.stdout.String() != "hello\n" || r.stderr.String() != "err\n" || r.ExitCode != 3 || r.Signal != "" {
		t.Fatalf("got %q %q %+v", r.stdout.String(), r.stderr.String(), r.ExecResult)
	}
	r = a.mustExec(agentproto.ExecRequest{Argv: []string{"echo", "a  b", "$HOME"}})
	if r.stdout.String() != "a  b $HOME\n" || r.ExitCode != 0 {
		t.Fatalf("argv: %q %+v", r.stdout.String(), r.ExecResult)
	}
	r = a.mustExec(agentproto.ExecRequest{Argv: []string{"/bin/sh", "-c", "kill -TERM $$"}})
	if r.ExitCode != 143 || r.Signal != "SIGTERM" {
		t.Fatalf("signal: %+v", r.ExecResult)
	}
	r = a.mustExec(agentproto.ExecRequest{Cmd: "kill -KILL $$"})
	if r.ExitCode != 137 || r.Signal != "SIGKILL" {
		t.Fatalf("cmd signal: %+v", r.ExecResult)
	}
	// Without the exit trap's report the status is the reaped one.
	for cmd, want := range map[string]int{"trap - EXIT; exit 5": 5, "exec sh -c 'exit 6'": 6, "trap 'echo bye' EXIT; exit 9": 9} {
		r = a.mustExec(agentproto.ExecRequest{Cmd: cmd})
		if r.ExitCode != want {
			t.Fatalf("%s: %+v", cmd, r.ExecResult)
		}
	}
	r = a.mustExec(agentproto.ExecRequest{Cmd: "if then"})
	if r.ExitCode != 2 || !strings.Contains(r.stderr.String(), "then") {
		t.Fatalf("syntax error: %+v %q", r.ExecResult, r.stderr.String())
	}
	if r.Duration <= 0 {
		t.Fatalf("no duration: %+v", r.ExecResult)
	}
	_, err := a.exec(agentproto.ExecRequest{Argv: []string{"no-such-program-xyz"}})
	wantCode(t, err, agentproto.ErrNotFound)
	_, err = a.exec(agentproto.ExecRequest{Cmd: "true", Argv: []string{"true"}})
	wantCode(t, err, agentproto.ErrInvalid)
	_, err = a.exec(agentproto.ExecRequest{})
	wantCode(t, err, agentproto.ErrInvalid)
	_, err = a.exec(agentproto.ExecRequest{Cmd: "true", Cwd: "/no/such/dir"})
	wantCode(t, err, agentproto.ErrNotFound)

	// Second setup is refused; ping works.
	err = a.c.Call(ctx(t), agentproto.OpSetup, &agentproto.SetupConfig{Unconfined: true}, nil, nil)
	wantCode(t, err, agentproto.ErrInvalid)
	if err := a.c.Call(ctx(t), agentproto.OpPing, nil, nil, nil); err != nil {
		t.Fatal(err)
	}
}

// TestSetupNetOnlyInVM: a network interface in setup is a VM's (the agent
// in the guest configures it); a container's agent refuses it, and a
// setup without it then succeeds.
func TestSetupNetOnlyInVM(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{Net: &agentproto.VMNet{Address: "10.213.0.3/31", Gateway: "10.213.0.2", MAC: "02:77:00:00:00:01"}})
	a.mustExec(agentproto.ExecRequest{Cmd: "true"})
}

func TestExecStdinEnvCwd(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{Env: map[string]string{"BASE": "b1"}})
	r := a.mustExec(agentproto.ExecRequest{Cmd: "tr a-z A-Z", Stdin: []byte("abc")})
	if r.stdout.String() != "ABC" {
		t.Fatalf("stdin cmd: %q", r.stdout.String())
	}
	big := strings.Repeat("x", 1<<20)
	r = a.mustExec(agentproto.ExecRequest{Argv: []string{"wc", "-c"}, Stdin: []byte(big)})
	if strings.TrimSpace(r.stdout.String()) != strconv.Itoa(len(big)) {
		t.Fatalf("stdin argv: %q", r.stdout.String())
	}
	// No stdin: reads see EOF at once.
	r = a.mustExec(agentproto.ExecRequest{Cmd: "cat; echo done", Timeout: 5 * time.Second})
	if r.stdout.String() != "done\n" {
		t.Fatalf("no stdin: %q", r.stdout.String())
	}
	// A command that ignores a large stdin still finishes.
	r = a.mustExec(agentproto.ExecRequest{Cmd: "true", Stdin: []byte(big)})
	if r.ExitCode != 0 {
		t.Fatalf("ignored stdin: %+v", r.ExecResult)
	}
	out := a.sh(`echo "$BASE $FOO $HOME"`)
	if out != "b1  /root\n" {
		t.Fatalf("base env: %q", out)
	}
	r = a.mustExec(agentproto.ExecRequest{Cmd: `echo "$BASE $FOO"`, Env: map[string]string{"FOO": "x y", "BASE": "over"}})
	if r.stdout.String() != "over x y\n" {
		t.Fatalf("request env: %q", r.stdout.String())
	}
	r = a.mustExec(agentproto.ExecRequest{Argv: []string{"printenv", "FOO"}, Env: map[string]string{"FOO": "argv"}})
	if r.stdout.String() != "argv\n" {
		t.Fatalf("argv env: %q", r.stdout.String())
	}
	// Request env does not stick to the session.
	if out := a.sh(`echo "${FOO-unset} $BASE"`); out != "unset b1\n" {
		t.Fatalf("request env persisted: %q", out)
	}
	dir := t.TempDir()
	r = a.mustExec(agentproto.ExecRequest{Cmd: "pwd", Cwd: dir})
	if r.stdout.String() != dir+"\n" {
		t.Fatalf("cwd: %q", r.stdout.String())
	}
	r = a.mustExec(agentproto.ExecRequest{Argv: []string{"pwd"}, Cwd: dir})
	if r.stdout.String() != dir+"\n" {
		t.Fatalf("argv cwd: %q", r.stdout.String())
	}
	_, err := a.exec(agentproto.ExecRequest{Cmd: "true", Env: map[string]string{"A=B": "x"}})
	wantCode(t, err, agentproto.ErrInvalid)
}

func writeUsers(root string) {
	etc := filepath.Join(root, "etc")
	os.MkdirAll(etc, 0o755)
	os.WriteFile(filepath.Join(etc, "passwd"), []byte("root:x:0:0:root:/root:/bin/sh\nalice:x:1234:1234::/tmp:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(etc, "group"), []byte("root:x:0:\nalice:x:1234:\nwheel:x:10:alice,bob\n"), 0o644)
}

// TestDefaultUser: the setup user runs commands (through warm shells) and
// owns the files the agent writes.
func TestDefaultUser(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{User: "alice"}, writeUsers)
	for i := 0; i < 4; i++ {
		if out := a.sh(`id -u; echo "$HOME"; cd /; export N=` + strconv.Itoa(i)); out != "1234\n/tmp\n" {
			t.Fatalf("default user: %q", out)
		}
	}
	if out := a.sh(`pwd; echo $N`); out != "/\n3\n" {
		t.Fatalf("default user session: %q", out)
	}
	r := a.mustExec(agentproto.ExecRequest{Cmd: "id -u", User: "root"})
	if r.stdout.String() != "0\n" {
		t.Fatalf("root override: %q", r.stdout.String())
	}
	if err := a.call(agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/home/alice/f", Data: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(a.root, "home/alice/f"))
	if err != nil || st.Sys().(*syscall.Stat_t).Uid != 1234 {
		t.Fatalf("owner: %v %+v", err, st.Sys())
	}
}

func TestExecUser(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{}, writeUsers)
	r := a.mustExec(agentproto.ExecRequest{Cmd: `id -u; id -g; id -G; echo "$HOME $USER"; pwd`, User: "alice"})
	if r.stdout.String() != "1234\n1234\n1234 10\n/tmp alice\n/tmp\n" {
		t.Fatalf("user alice: %q %q", r.stdout.String(), r.stderr.String())
	}
	r = a.mustExec(agentproto.ExecRequest{Argv: []string{"id", "-u", "-g"}, User: "4321:55"})
	r2 := a.mustExec(agentproto.ExecRequest{Argv: []string{"id", "-g"}, User: "4321:55"})
	if r.ExitCode == 0 || strings.TrimSpace(r2.stdout.String()) != "55" {
		// `id -u -g` is an error; -g alone must be 55
		t.Fatalf("numeric user: %q %q", r.stdout.String(), r2.stdout.String())
	}
	_, err := a.exec(agentproto.ExecRequest{Cmd: "true", User: "nobody-here"})
	wantCode(t, err, agentproto.ErrNotFound)
}

func TestSessions(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	d1, d2 := t.TempDir(), t.TempDir()
	a.sh("cd " + d1 + " && export X=1 Z='a'\"'\"'b\"c\n$d \\\\ e'")
	if out := a.sh(`pwd; echo "$X"; printf '%s' "$Z"`); out != d1+"\n1\na'b\"c\n$d \\\\ e" {
		t.Fatalf("session state: %q", out)
	}
	// Another session is independent.
	r := a.mustExec(agentproto.ExecRequest{Cmd: `cd ` + d2 + `; echo "${X-unset}"`, Session: "other"})
	if r.stdout.String() != "unset\n" {
		t.Fatalf("other session: %q", r.stdout.String())
	}
	r = a.mustExec(agentproto.ExecRequest{Cmd: `pwd`, Session: "other"})
	if r.stdout.String() != d2+"\n" {
		t.Fatalf("other session cwd: %q", r.stdout.String())
	}
	// unset and exit codes persist state too; argv runs in the session.
	a.sh("unset X; export Y=2; false || true")
	if out := a.sh(`echo "${X-unset} $Y"`); out != "unset 2\n" {
		t.Fatalf("unset: %q", out)
	}
	r = a.mustExec(agentproto.ExecRequest{Cmd: "cd /; export W=1; exit 4"})
	if r.ExitCode != 4 {
		t.Fatalf("exit: %+v", r.ExecResult)
	}
	r = a.mustExec(agentproto.ExecRequest{Argv: []string{"sh", "-c", `pwd; echo "$W"`}})
	if r.stdout.String() != "/\n1\n" {
		t.Fatalf("argv in session: %q", r.stdout.String())
	}
	// Concurrent commands in many sessions.
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := fmt.Sprintf("s%d", i)
			dir := filepath.Join(d1, s)
			if err := os.Mkdir(dir, 0o755); err != nil {
				errs <- err
				return
			}
			if _, err := a.exec(agentproto.ExecRequest{Cmd: fmt.Sprintf("cd %s; export N=%d; sleep 0.1", dir, i), Session: s}); err != nil {
				errs <- err
				return
			}
			r, err := a.exec(agentproto.ExecRequest{Cmd: `echo "$(pwd) $N"`, Session: s})
			if err != nil {
				errs <- err
				return
			}
			if want := fmt.Sprintf("%s %d\n", dir, i); r.stdout.String() != want {
				errs <- fmt.Errorf("session %s: %q, want %q", s, r.stdout.String(), want)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestSessionsBash(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{Shell: "/bin/bash"})
	a.sh(`cd /tmp; export X=$'a\nb\'c' Y='q"$x\'`)
	if out := a.sh(`pwd; printf '%s|%s' "$X" "$Y"; echo; echo $BASH_VERSION | cut -c1`); out != "/tmp\na\nb'c|q\"$x\\\n5\n" {
		t.Fatalf("bash session: %q", out)
	}
}

func TestTimeoutKillsGroup(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	pidf := filepath.Join(t.TempDir(), "pid")
	start := time.Now()
	r := a.mustExec(agentproto.ExecRequest{Cmd: "sleep 30 & echo $! > " + pidf + "; sleep 30", Timeout: 300 * time.Millisecond})
	if !r.TimedOut || r.ExitCode != 137 || r.Signal != "SIGKILL" {
		t.Fatalf("timeout: %+v", r.ExecResult)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("timeout took %v", el)
	}
	b, err := os.ReadFile(pidf)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	deadline := time.Now().Add(2 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("background child %d survived the timeout", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Without a timeout, a background daemon survives the command.
	r = a.mustExec(agentproto.ExecRequest{Cmd: "sleep 30 > /dev/null 2>&1 & echo $! > " + pidf})
	b, _ = os.ReadFile(pidf)
	pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	if r.ExitCode != 0 || syscall.Kill(pid, 0) != nil {
		t.Fatalf("daemon did not survive: %+v", r.ExecResult)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	// A daemon that keeps stdout open does not hold the exec forever.
	start = time.Now()
	r = a.mustExec(agentproto.ExecRequest{Cmd: "sleep 30 & echo $! > " + pidf + "; echo hi"})
	if r.stdout.String() != "hi\n" || time.Since(start) > 2*time.Second {
		t.Fatalf("daemon with stdout: %q after %v", r.stdout.String(), time.Since(start))
	}
	b, _ = os.ReadFile(pidf)
	pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
	syscall.Kill(pid, syscall.SIGKILL)
}

func TestOutputCap(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	r := a.mustExec(agentproto.ExecRequest{Cmd: "yes | head -c 100000000; echo tail >&2", OutputCap: 1 << 20})
	if !r.Truncated || r.stdout.Len() != 1<<20 || r.stderr.String() != "tail\n" || r.ExitCode != 0 {
		t.Fatalf("cap: truncated=%v stdout=%d stderr=%q %+v", r.Truncated, r.stdout.Len(), r.stderr.String(), r.ExecResult)
	}
	// An endless producer under the default cap: memory stays bounded.
	var peak int
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
				peak = max(peak, vmRSSKB(t, a.cmd.Process.Pid))
			}
		}
	}()
	r = a.mustExec(agentproto.ExecRequest{Cmd: "yes", Timeout: 1500 * time.Millisecond})
	close(stop)
	<-done
	if !r.Truncated || !r.TimedOut || r.stdout.Len() != 16<<20 {
		t.Fatalf("yes: truncated=%v timedout=%v len=%d", r.Truncated, r.TimedOut, r.stdout.Len())
	}
	if peak > 64<<10 {
		t.Fatalf("agent RSS peaked at %d KiB", peak)
	}
	t.Logf("agent VmRSS peak while draining yes: %d KiB", peak)
}

func TestZombieReaping(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	pidf := filepath.Join(t.TempDir(), "pid")
	// The subshell exits at once; its child sleep is orphaned and
	// reparented to the agent (PID 1 in a sandbox; a subreaper here).
	a.sh("(sleep 0.3 >/dev/null 2>&1 & echo $! > " + pidf + ")")
	b, _ := os.ReadFile(pidf)
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	agentPid := a.cmd.Process.Pid
	var sawOrphan bool
	deadline := time.Now().Add(3 * time.Second)
	for {
		found := false
		for _, p := range procs() {
			if p.pid == pid {
				found = true
				if p.ppid == agentPid {
					sawOrphan = true
				}
				if p.state == "Z" && time.Now().After(deadline) {
					t.Fatalf("orphan %d stays a zombie", pid)
				}
			}
		}
		if !found {
			break
		}
		if time.Now().After(deadline.Add(time.Second)) {
			t.Fatalf("orphan %d still exists", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !sawOrphan {
		t.Fatalf("orphan %d was never reparented to the agent", pid)
	}
	for _, p := range procs() {
		if p.ppid == agentPid && p.state == "Z" {
			t.Fatalf("zombie child %d of the agent", p.pid)
		}
	}
}

func TestBackground(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	var res agentproto.ExecResult
	if err := a.c.Call(ctx(t), agentproto.OpExec, &agentproto.ExecRequest{Cmd: "echo start; sleep 0.3; echo end; echo e >&2; exit 5", Background: true}, &res, nil); err != nil {
		t.Fatal(err)
	}
	if res.CommandID == "" {
		t.Fatal("no command id")
	}
	var st agentproto.ProcStatus
	time.Sleep(50 * time.Millisecond)
	if err := a.c.Call(ctx(t), agentproto.OpProcGet, &agentproto.ProcRequest{CommandID: res.CommandID}, &st, nil); err != nil {
		t.Fatal(err)
	}
	if !st.Running || st.ExitCode != nil || string(st.Stdout) != "start\n" {
		t.Fatalf("running status: %+v", st)
	}
	// A second connection replaces the first; the command survives.
	c1 := a.c
	a.c = a.connect()
	select {
	case <-c1.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("old connection not closed")
	}
	st = agentproto.ProcStatus{}
	if err := a.c.Call(ctx(t), agentproto.OpProcGet, &agentproto.ProcRequest{CommandID: res.CommandID, Wait: true}, &st, nil); err != nil {
		t.Fatal(err)
	}
	if st.Running || st.ExitCode == nil || *st.ExitCode != 5 || string(st.Stdout) != "start\nend\n" || string(st.Stderr) != "e\n" || st.Duration < 250 {
		t.Fatalf("finished status: %+v", st)
	}
	// A finished command stays readable.
	st = agentproto.ProcStatus{}
	if err := a.c.Call(ctx(t), agentproto.OpProcGet, &agentproto.ProcRequest{CommandID: res.CommandID}, &st, nil); err != nil || string(st.Stdout) != "start\nend\n" {
		t.Fatalf("second read of a finished command: %+v %v", st, err)
	}
	err := a.c.Call(ctx(t), agentproto.OpProcGet, &agentproto.ProcRequest{CommandID: "cmd-unknown"}, &st, nil)
	wantCode(t, err, agentproto.ErrNotFound)

	for _, sig := range []int{0, 15} {
		if err := a.c.Call(ctx(t), agentproto.OpExec, &agentproto.ExecRequest{Argv: []string{"sleep", "30"}, Background: true}, &res, nil); err != nil {
			t.Fatal(err)
		}
		if err := a.c.Call(ctx(t), agentproto.OpProcKill, &agentproto.ProcRequest{CommandID: res.CommandID, Signal: sig}, nil, nil); err != nil {
			t.Fatal(err)
		}
		st = agentproto.ProcStatus{}
		if err := a.c.Call(ctx(t), agentproto.OpProcGet, &agentproto.ProcRequest{CommandID: res.CommandID, Wait: true}, &st, nil); err != nil {
			t.Fatal(err)
		}
		want := "SIGKILL"
		if sig == 15 {
			want = "SIGTERM"
		}
		if st.Signal != want || st.ExitCode == nil || *st.ExitCode <= 128 {
			t.Fatalf("killed status: %+v", st)
		}
	}
	err = a.c.Call(ctx(t), agentproto.OpProcKill, &agentproto.ProcRequest{CommandID: "cmd-nope"}, nil, nil)
	wantCode(t, err, agentproto.ErrNotFound)
}

func TestReconnectForeground(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	marker := filepath.Join(t.TempDir(), "m")
	errc := make(chan error, 1)
	go func() {
		_, err := a.exec(agentproto.ExecRequest{Cmd: "sleep 0.3; touch " + marker})
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	c2 := a.connect()
	defer c2.Close()
	if err := <-errc; err == nil {
		t.Fatal("exec on the replaced connection did not fail")
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		if _, err := os.Stat(marker); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("command did not survive the connection switch")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := execOn(t, c2, agentproto.ExecRequest{Cmd: "true"}); err != nil {
		t.Fatal(err)
	}
}
