package agent_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/warrenhq/warren/internal/agent"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
)

var agentBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "warren-agent-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin = filepath.Join(dir, "warren-agent")
	// WARREN_AGENT_RACE=1 builds the agent with the race detector (cgo).
	args := []string{"build", "-o", agentBin}
	env := append(os.Environ(), "CGO_ENABLED=0")
	if os.Getenv("WARREN_AGENT_RACE") != "" {
		args = append(args, "-race")
		env = append(os.Environ(), "CGO_ENABLED=1")
	}
	build := exec.Command("go", append(args, "github.com/warrenhq/warren/cmd/warren-agent")...)
	build.Env = env
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build agent: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// testAgent is a real warren-agent process serving on a unix socket passed
// as fd 3, unconfined, with a temp dir as its file root.
type testAgent struct {
	t    testing.TB
	cmd  *exec.Cmd
	sock string
	root string
	log  string
	c    *agentproto.Client
}

// startAgent starts an agent; prepare (optional) fills the root before setup.
func startAgent(t testing.TB, cfg agentproto.SetupConfig, prepare ...func(root string)) *testAgent {
	t.Helper()
	dir := t.TempDir()
	a := &testAgent{t: t, sock: filepath.Join(dir, "agent.sock"), root: filepath.Join(dir, "root"), log: filepath.Join(dir, "agent.log")}
	if err := os.Mkdir(a.root, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: a.sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	lf, err := l.File()
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	logf, err := os.Create(a.log)
	if err != nil {
		t.Fatal(err)
	}
	a.cmd = exec.Command(agentBin)
	a.cmd.ExtraFiles = []*os.File{lf}
	a.cmd.Stderr = logf
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lf.Close()
	logf.Close()
	t.Cleanup(func() {
		if a.c != nil {
			a.c.Close()
		}
		killTree(a.cmd.Process.Pid)
		a.cmd.Wait()
		os.RemoveAll(agent.UnconfinedFIFODir(a.cmd.Process.Pid))
		if b, _ := os.ReadFile(a.log); bytes.Contains(b, []byte("DATA RACE")) {
			t.Errorf("the agent reported a data race")
		}
		if t.Failed() {
			b, _ := os.ReadFile(a.log)
			t.Logf("agent log:\n%s", b)
		}
	})
	for _, p := range prepare {
		p(a.root)
	}
	a.c = a.connect()
	cfg.Unconfined = true
	if cfg.RootDir == "" {
		cfg.RootDir = a.root
	}
	var res agentproto.SetupResult
	err = a.c.Call(ctx(t), agentproto.OpSetup, &cfg, &res, nil)
	if cfg.Net != nil {
		// A container's agent configures no interface: setup refuses.
		var ae *agentproto.Error
		if !errors.As(err, &ae) || ae.Code != agentproto.ErrInvalid {
			t.Fatalf("setup with a network in a container's agent: %v, want %s", err, agentproto.ErrInvalid)
		}
		cfg.Net = nil
		err = a.c.Call(ctx(t), agentproto.OpSetup, &cfg, &res, nil)
	}
	if err != nil {
		t.Fatalf("setup: %v", err)
	}
	if res.Pid != a.cmd.Process.Pid {
		t.Fatalf("setup pid %d, want %d", res.Pid, a.cmd.Process.Pid)
	}
	return a
}

func (a *testAgent) connect() *agentproto.Client {
	a.t.Helper()
	conn, err := net.Dial("unix", a.sock)
	if err != nil {
		a.t.Fatal(err)
	}
	return agentproto.NewClient(conn)
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// execResult is a finished exec with its output.
type execResult struct {
	agentproto.ExecResult
	stdout, stderr bytes.Buffer
}

func (a *testAgent) exec(req agentproto.ExecRequest) (*execResult, error) {
	return execOn(a.t, a.c, req)
}

func execOn(t testing.TB, c *agentproto.Client, req agentproto.ExecRequest) (*execResult, error) {
	r := &execResult{}
	var mu sync.Mutex
	err := c.Call(ctx(t), agentproto.OpExec, &req, &r.ExecResult, func(resp *agentproto.Response) error {
		mu.Lock()
		defer mu.Unlock()
		if len(resp.Data) > agentproto.ChunkSize {
			return fmt.Errorf("chunk of %d bytes", len(resp.Data))
		}
		switch resp.Stream {
		case agentproto.StreamStdout:
			r.stdout.Write(resp.Data)
		case agentproto.StreamStderr:
			r.stderr.Write(resp.Data)
		default:
			return fmt.Errorf("unexpected stream %q", resp.Stream)
		}
		return nil
	})
	return r, err
}

func (a *testAgent) mustExec(req agentproto.ExecRequest) *execResult {
	a.t.Helper()
	r, err := a.exec(req)
	if err != nil {
		a.t.Fatalf("exec %q %q: %v", req.Cmd, req.Argv, err)
	}
	return r
}

// sh runs cmd in the default session and returns its stdout; it fails the
// test on a non-zero exit.
func (a *testAgent) sh(cmd string) string {
	a.t.Helper()
	r := a.mustExec(agentproto.ExecRequest{Cmd: cmd})
	if r.ExitCode != 0 {
		a.t.Fatalf("%q: exit %d, stderr %q", cmd, r.ExitCode, r.stderr.String())
	}
	return r.stdout.String()
}

// killTree kills pid's descendants, then pid.
func killTree(pid int) {
	for i := 0; i < 50; i++ {
		kids := descendants(pid)
		if len(kids) == 0 {
			break
		}
		for _, k := range kids {
			syscall.Kill(k, syscall.SIGKILL)
		}
		time.Sleep(10 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
}

type procInfo struct {
	pid, ppid int
	state     string
}

func procs() []procInfo {
	ents, _ := os.ReadDir("/proc")
	var out []procInfo
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		out = append(out, procInfo{pid: pid, ppid: ppid, state: f[0]})
	}
	return out
}

func descendants(pid int) []int {
	ps := procs()
	set := map[int]bool{pid: true}
	for changed := true; changed; {
		changed = false
		for _, p := range ps {
			if set[p.ppid] && !set[p.pid] {
				set[p.pid] = true
				changed = true
			}
		}
	}
	delete(set, pid)
	var out []int
	for p := range set {
		out = append(out, p)
	}
	return out
}

func vmRSSKB(t testing.TB, pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			n, _ := strconv.Atoi(strings.Fields(l)[1])
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	if !agentproto.IsCode(err, code) {
		t.Fatalf("got error %v, want code %s", err, code)
	}
}
