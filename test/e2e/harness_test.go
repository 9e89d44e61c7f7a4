// Package e2e runs the real warren binary and drives it over HTTP. These
// tests need root (namespaces, cgroups, mounts).
package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

var bins struct {
	dir, warren, agent, probe string
}

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		if os.Getenv("WARREN_REQUIRE_ROOT") != "" { // make test: a run that tests nothing must not pass
			fmt.Println("FAIL: e2e tests need root (WARREN_REQUIRE_ROOT is set)")
			os.Exit(1)
		}
		fmt.Println("SKIP: e2e tests need root")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "wtest-bin-")
	if err != nil {
		panic(err)
	}
	bins.dir = dir
	bins.warren = filepath.Join(dir, "warren")
	bins.agent = filepath.Join(dir, "warren-agent")
	bins.probe = filepath.Join(dir, "probe")
	for out, pkg := range map[string]string{bins.warren: "../../cmd/warren", bins.agent: "../../cmd/warren-agent", bins.probe: "./probe"} {
		cmd := exec.Command("go", "build", "-o", out, pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out == bins.warren && os.Getenv("WARREN_E2E_RACE") != "" {
			// The server under the race detector (cgo); the agent stays
			// static. Each server's log is checked for race reports.
			cmd = exec.Command("go", "build", "-race", "-o", out, pkg)
			cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		}
		if b, err := cmd.CombinedOutput(); err != nil {
			fmt.Printf("build %s: %v\n%s", pkg, err, b)
			os.Exit(1)
		}
	}
	code := m.Run()
	// A run of a subset (-run) may skip TestZZSharedServerStopsClean: stop
	// the shared server here, or it would die on its closed log pipe when
	// this process exits, halfway through stopping its sandboxes.
	for _, stop := range sharedStops {
		stop()
	}
	// The tests of the parallel phase checked their own servers; what none
	// of them could check alone is checked here, for every server.
	if leaks := waitNoLeaks(startedDirs(), true); len(leaks) > 0 {
		fmt.Printf("FAIL: leaks after every test ended:\n%s\n", strings.Join(leaks, "\n"))
		if code == 0 {
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// startedDataDirs are the data dirs of every server this process started;
// the leak checks look for what they may have left. parallelRunning counts
// the tests of the parallel phase (parallel) that have not ended. startedMu
// guards both.
var (
	startedMu       sync.Mutex
	startedDataDirs = map[string]bool{}
	parallelRunning int
)

// noteStarted records the data dir of a server about to start.
func noteStarted(dataDir string) {
	startedMu.Lock()
	defer startedMu.Unlock()
	startedDataDirs[dataDir] = true
}

// startedDirs is a copy of startedDataDirs.
func startedDirs() map[string]bool {
	startedMu.Lock()
	defer startedMu.Unlock()
	return maps.Clone(startedDataDirs)
}

// inParallelPhase reports whether the tests of the parallel phase have
// begun (the sequential ones, the shared server's among them, have ended).
func inParallelPhase() bool {
	startedMu.Lock()
	defer startedMu.Unlock()
	return parallelRunning > 0
}

// othersRunning reports whether a test of the parallel phase other than
// the caller may be running; the host-wide checks (agent processes) then
// cannot tell whose a process is.
func othersRunning() bool {
	startedMu.Lock()
	defer startedMu.Unlock()
	return parallelRunning > 1
}

// parallel makes t one of the tests that run together, -parallel at a
// time, after every sequential test of the package has ended (Go's
// t.Parallel). Only tests that neither share a server nor depend on the
// host being otherwise quiet belong there: no test of the shared server,
// of networks (one address pool per host), of CPU or memory pressure, of
// timing figures, or of host-wide counts (loop devices). A parallel test
// checks the leaks of its own servers; the host-wide checks run once all
// have ended (TestMain).
func parallel(t *testing.T) {
	t.Parallel()
	startedMu.Lock()
	parallelRunning++
	startedMu.Unlock()
	t.Cleanup(func() { // registered first, so it runs after the test's other cleanups
		startedMu.Lock()
		parallelRunning--
		startedMu.Unlock()
	})
}

// server is one running `warren serve`.
type server struct {
	t       *testing.T
	dataDir string
	listen  string
	URL     string
	Token   string
	C       *warren.Client
	cmd     *exec.Cmd
	args    []string // extra flags of warren serve
	logs    *syncBuffer
	done    chan struct{}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startServer starts warren serve on a fresh data dir; it is stopped (SIGTERM)
// when the test ends.
func startServer(t *testing.T, args ...string) *server {
	t.Helper()
	dataDir, err := os.MkdirTemp("", "wtest-data-")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, dataDir: dataDir, listen: freePort(t), args: args}
	t.Cleanup(func() {
		s.stop()
		os.RemoveAll(dataDir)
	})
	s.start()
	return s
}

func (s *server) start() {
	t := s.t
	t.Helper()
	s.logs = &syncBuffer{}
	s.cmd = exec.Command(bins.warren, append([]string{"serve", "--data-dir", s.dataDir, "--listen", s.listen, "--agent", bins.agent, "--node", "e2e"}, s.args...)...)
	s.cmd.Stdout = s.logs
	s.cmd.Stderr = s.logs
	// If this test process dies, the server gets SIGTERM and cleans up.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	noteStarted(s.dataDir)
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.done = make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	s.URL = "http://" + s.listen
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-s.done:
			t.Fatalf("warren serve exited early:\n%s", s.logs.String())
		default:
		}
		resp, err := http.Get(s.URL + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("warren serve did not become healthy:\n%s", s.logs.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	tok, err := os.ReadFile(filepath.Join(s.dataDir, "admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	s.Token = strings.TrimSpace(string(tok))
	s.C = warren.New(s.URL, s.Token)
}

// stop sends SIGTERM and waits; the server stops every sandbox.
func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(90 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
		s.t.Errorf("warren serve did not stop on SIGTERM:\n%s", s.logs.String())
	}
	s.checkRaces()
}

// kill9 kills the whole server process without any cleanup.
func (s *server) kill9() {
	_ = s.cmd.Process.Kill()
	<-s.done
	s.checkRaces()
}

// checkRaces fails the test when the server (built with -race:
// WARREN_E2E_RACE) reported a data race.
func (s *server) checkRaces() {
	logs := s.logs.String()
	if i := strings.Index(logs, "WARNING: DATA RACE"); i >= 0 {
		report := strings.SplitN(logs[i:], "\n", 81)
		s.t.Errorf("warren serve reported a data race:\n%s", strings.Join(report[:min(len(report), 80)], "\n"))
	}
}

func (s *server) create(t *testing.T, req api.CreateSandboxRequest) *api.Sandbox {
	t.Helper()
	if req.Image == "" {
		req.Image = "busybox"
	}
	sb, err := s.C.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("create: %v\nserver log:\n%s", err, tail(s.logs.String(), 40))
	}
	t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), sb.ID) })
	return sb
}

func (s *server) sh(t *testing.T, id, cmd string) *api.ExecResult {
	t.Helper()
	r, err := s.C.Exec(context.Background(), id, api.ExecRequest{Cmd: cmd})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return r
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// rawRequest sends an HTTP request with the server's token (unless token is "-").
func (s *server) rawRequest(t *testing.T, method, path, token string, body []byte, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, s.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	switch token {
	case "":
		req.Header.Set("Authorization", "Bearer "+s.Token)
	case "-":
	default:
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}
