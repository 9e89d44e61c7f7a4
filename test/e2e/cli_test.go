package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

// cli runs the warren binary against s and returns its stdout, stderr and
// exit code.
func (s *server) cli(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(bins.warren, append([]string{"--url", s.URL, "--token", s.Token}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), errb.String(), 0
	case errors.As(err, &ee):
		return out.String(), errb.String(), ee.ExitCode()
	}
	t.Fatalf("warren %v: %v", args, err)
	return "", "", -1
}

// cliOK runs the warren binary and fails the test unless it succeeds.
func (s *server) cliOK(t *testing.T, args ...string) string {
	t.Helper()
	out, errs, code := s.cli(t, args...)
	if code != 0 {
		t.Fatalf("warren %v: exit %d\nstdout: %s\nstderr: %s\nserver log:\n%s", args, code, out, errs, tail(s.logs.String(), 20))
	}
	return out
}

func lines(s string) []string { return strings.Fields(s) }

// TestCLIVerbs drives every client verb of the CLI against a real server
// and checks what it did through the Go SDK.
func TestCLIVerbs(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	state := func(id string) string {
		sb, err := s.C.Get(ctx, id)
		if err != nil {
			t.Fatalf("get %s: %v", id, err)
		}
		return sb.State
	}

	// create --layer (a protected toolkit) --env --label; run --trusted.
	dir := t.TempDir()
	os.MkdirAll(dir+"/bin", 0o755)
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("SKIP: no /bin/busybox for the toolkit layer")
	}
	os.WriteFile(dir+"/bin/busybox", bb, 0o755)
	os.Symlink("busybox", dir+"/bin/sh")
	os.WriteFile(dir+"/bin/grade", []byte("#!/opt/tk/bin/sh\necho graded\n"), 0o755)
	s.cliOK(t, "layer", "create", "--from-dir", dir, "--name", "toolkit/cli")
	a := strings.TrimSpace(s.cliOK(t, "create", "--image", "busybox", "--label", "job=cli", "--env", "GREETING=hi",
		"--layer", "toolkit/cli:/opt/tk:protected", "--memory", "128m"))
	if out := s.cliOK(t, "run", a, "echo $GREETING; ls /opt/tk/bin/grade"); out != "hi\n/opt/tk/bin/grade\n" {
		t.Fatalf("run: %q", out)
	}
	if out := s.cliOK(t, "run", "--trusted", a, "grade"); out != "graded\n" {
		t.Fatalf("run --trusted: %q", out)
	}
	b := strings.TrimSpace(s.cliOK(t, "create", "--image", "busybox", "--label", "job=cli", "--memory", "128m"))
	s.cliOK(t, "run", b, "echo state > /work.txt")

	// pause / resume by label, then by id.
	if got := lines(s.cliOK(t, "pause", "-l", "job=cli")); len(got) != 2 {
		t.Fatalf("pause -l: %v", got)
	}
	if state(a) != api.StatePaused || state(b) != api.StatePaused {
		t.Fatalf("after pause -l: %s %s", state(a), state(b))
	}
	if got := lines(s.cliOK(t, "ls", "--state", "paused", "-l", "job=cli")); len(got) < 2*8 {
		t.Fatalf("ls --state paused: %v", got)
	}
	if got := lines(s.cliOK(t, "resume", "-l", "job=cli")); len(got) != 2 {
		t.Fatalf("resume -l: %v", got)
	}
	if state(a) != api.StateRunning || state(b) != api.StateRunning {
		t.Fatalf("after resume -l: %s %s", state(a), state(b))
	}
	s.cliOK(t, "pause", b)
	if state(b) != api.StatePaused {
		t.Fatal("pause ID did not pause")
	}
	s.cliOK(t, "resume", "--no-prefetch", b)
	if state(b) != api.StateRunning {
		t.Fatal("resume ID did not resume")
	}
	if _, errs, code := s.cli(t, "pause", "sb-e2e-nosuch"); code != 1 || !strings.Contains(errs, "not_found") {
		t.Fatalf("pause of an unknown sandbox: %d %q", code, errs)
	}

	// fork ID N: N sandboxes with the source's files.
	kids := lines(s.cliOK(t, "fork", b, "2"))
	if len(kids) != 2 {
		t.Fatalf("fork: %v", kids)
	}
	for _, k := range kids {
		if out := s.cliOK(t, "run", k, "cat /work.txt"); out != "state\n" {
			t.Fatalf("fork %s: %q", k, out)
		}
	}
	s.cliOK(t, append([]string{"rm"}, kids...)...)

	// fncall: output and exit code are the task's.
	if out := s.cliOK(t, "fncall", "--", "echo", "judged"); out != "judged\n" {
		t.Fatalf("fncall: %q", out)
	}
	if out, _, code := s.cli(t, "fncall", "echo no >&2; exit 3"); code != 3 || out != "" {
		t.Fatalf("fncall exit: %d %q", code, out)
	}

	// pool create / ls / rm.
	if out := s.cliOK(t, "pool", "create", "clip", "--image", "busybox", "--size", "1", "--memory", "64m"); out != "clip\n" {
		t.Fatalf("pool create: %q", out)
	}
	if out := s.cliOK(t, "pool", "ls"); !strings.Contains(out, "clip") || !strings.Contains(out, "64M") {
		t.Fatalf("pool ls:\n%s", out)
	}
	s.cliOK(t, "pool", "rm", "clip")
	if pools, err := s.C.Pools(ctx); err != nil || len(pools) != 0 {
		t.Fatalf("after pool rm: %+v %v", pools, err)
	}

	// ls shows live sandboxes; --all also the stopped ones; rm -l.
	s.cliOK(t, "rm", b)
	if out := s.cliOK(t, "ls", "-l", "job=cli"); !strings.Contains(out, a) || strings.Contains(out, b) {
		t.Fatalf("ls:\n%s", out)
	}
	if out := s.cliOK(t, "ls", "--all", "-l", "job=cli"); !strings.Contains(out, a) || !strings.Contains(out, b) {
		t.Fatalf("ls --all:\n%s", out)
	}
	if out := s.cliOK(t, "rm", "-l", "job=cli"); out != a+"\n" {
		t.Fatalf("rm -l: %q", out)
	}
	if state(a) != api.StateStopped {
		t.Fatalf("rm -l left %s %s", a, state(a))
	}

	// create --trajectory records the run.
	c := strings.TrimSpace(s.cliOK(t, "create", "--image", "busybox", "--trajectory", "cli/t", "--memory", "64m"))
	s.cliOK(t, "run", c, "echo one")
	if out := s.cliOK(t, "traj", "show", "cli/t"); !strings.Contains(out, "echo one") {
		t.Fatalf("traj show:\n%s", out)
	}
	s.cliOK(t, "rm", c)
}

// TestCLILogsStats: `warren logs` shows a sandbox's recent commands with
// how each ended; `warren stats` what it uses. Both are its owner's only.
func TestCLILogsStats(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{MemoryMB: 128})
	s.cliOK(t, "run", sb.ID, "echo hi")
	s.cli(t, "run", sb.ID, "exit 3")
	s.cli(t, "run", "--timeout", "0.2", sb.ID, "sleep 5")
	s.cliOK(t, "run", sb.ID, "--", "sh", "-c", "i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done; head -c 16000000 /dev/zero > /tmp/fill")
	s.cliOK(t, "run", "-d", sb.ID, "sleep 30")
	h, err := s.C.Commands(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 5 || h[0].Cmd != "echo hi" || *h[0].ExitCode != 0 || *h[1].ExitCode != 3 || !h[2].TimedOut ||
		h[3].Argv[0] != "sh" || h[4].CommandID == "" || h[4].ExitCode != nil || h[0].StartedAt.IsZero() {
		t.Fatalf("history: %+v", h)
	}
	out := s.cliOK(t, "logs", sb.ID)
	if rows := strings.Split(strings.TrimSpace(out), "\n"); len(rows) != 6 || !strings.Contains(rows[2], "3 ") || !strings.Contains(rows[3], "timeout") {
		t.Fatalf("warren logs:\n%s", out)
	}
	st, err := s.C.Stats(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.ID != sb.ID || st.State != api.StateRunning || st.CPUSeconds <= 0 || st.MemoryBytes < 16<<20 || st.MemoryLimitMB != 128 || st.Commands != 5 {
		t.Fatalf("stats: %+v", st)
	}
	if out := s.cliOK(t, "stats", sb.ID); !strings.Contains(out, sb.ID) || !strings.Contains(out, "128M") {
		t.Fatalf("warren stats:\n%s", out)
	}
	// Another project's token sees neither.
	if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: "logs-other"}); err != nil {
		t.Fatal(err)
	}
	tok, err := s.C.CreateToken(ctx, api.CreateTokenRequest{Principal: "other", Project: "logs-other"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/commands", "/stats"} {
		if code, body := s.rawRequest(t, "GET", "/v1/sandboxes/"+sb.ID+p, tok.Secret, nil, nil); code != 404 || strings.Contains(body, "echo hi") {
			t.Fatalf("GET %s with another project's token: %d %s", p, code, body)
		}
	}
	if _, err := s.C.Stats(ctx, "sb-e2e-nosuch"); err == nil || !strings.Contains(err.Error(), "not_found") {
		t.Fatalf("stats of an unknown sandbox: %v", err)
	}
}

// TestStatsOfRecycledContainer: a sandbox in a recycled container reports
// its own CPU time, not the container's earlier sandboxes' (which is
// another tenant's business).
func TestStatsOfRecycledContainer(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	shape := api.CreateSandboxRequest{CPU: 1, MemoryMB: 64}
	a := s.create(t, shape)
	s.sh(t, a.ID, "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done")
	st, err := s.C.Stats(ctx, a.ID)
	if err != nil || st.CPUSeconds < 0.3 {
		t.Fatalf("the busy sandbox: %+v %v", st, err)
	}
	burned := st.CPUSeconds
	if _, err := s.C.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Kept == 1 && r.Waiting == 1 })
	b := s.create(t, shape)
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Reused == 1 })
	s.sh(t, b.ID, "true")
	st, err = s.C.Stats(ctx, b.ID)
	if err != nil || st.CPUSeconds >= burned/2 || st.Commands != 1 {
		t.Fatalf("the recycled container's new sandbox reports %+v (%v); its predecessor burned %.2fs", st, err, burned)
	}
	if h, _ := s.C.Commands(ctx, b.ID); len(h) != 1 || h[0].Cmd != "true" {
		t.Fatalf("the new sandbox's history holds its predecessor's: %+v", h)
	}
}
