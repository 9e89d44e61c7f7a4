package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// nodeTelemetry reports whether the node's BPF telemetry is loaded.
func nodeTelemetry(t *testing.T, s *server) bool {
	t.Helper()
	code, body := s.rawRequest(t, "GET", "/v1/nodes", "", nil, nil)
	if code != 200 {
		t.Fatalf("nodes: %d %s", code, body)
	}
	var nl api.NodeList
	if err := json.Unmarshal([]byte(body), &nl); err != nil || len(nl.Nodes) == 0 {
		t.Fatalf("nodes: %v %s", err, body)
	}
	return nl.Nodes[0].Features.Telemetry
}

// execsOf waits until the audit of id at step holds an exec whose argv
// ends with marker, and returns the step's records.
func execsOf(t *testing.T, c *warren.Client, id string, step int64, marker string) []api.AuditRecord {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		al, err := c.Audit(context.Background(), id, warren.AuditQuery{Step: step, HasStep: true, Kind: api.AuditKindExec})
		if err != nil {
			t.Fatalf("audit of %s: %v", id, err)
		}
		if !al.Telemetry {
			t.Fatalf("audit of %s: telemetry false on a node that reports it on", id)
		}
		for _, r := range al.Records {
			if r.Step != step || r.Kind != api.AuditKindExec {
				t.Fatalf("audit ?step=%d&kind=exec answered %+v", step, r)
			}
			if n := len(r.Argv); n > 0 && r.Argv[n-1] == marker {
				return al.Records
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no exec ending with %q at step %d of %s: %+v", marker, step, id, al.Records)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAuditExecsPerStep: the kernel records what a trajectory sandbox's
// processes execute, each at the step that ran it; a neighbour's execs are
// not in its audit; a sibling project's token reads none of it.
func TestAuditExecsPerStep(t *testing.T) {
	parallel(t)
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		t.Skipf("SKIP: the kernel has no BTF (%v): the node runs without telemetry", err)
	}
	s := startServer(t)
	if !nodeTelemetry(t, s) {
		t.Fatalf("the node reports features.telemetry false on a kernel with BTF:\n%s", tail(s.logs.String(), 40))
	}
	ctx := context.Background()
	for _, p := range []string{"pa", "pb"} {
		if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: p}); err != nil {
			t.Fatal(err)
		}
	}
	secrets := map[string]string{}
	tok := func(project string) *warren.Client {
		tk, err := s.C.CreateToken(ctx, api.CreateTokenRequest{Principal: "u-" + project, Project: project, Role: api.RoleAdmin})
		if err != nil {
			t.Fatal(err)
		}
		secrets[project] = tk.Secret
		return warren.New(s.URL, tk.Secret)
	}
	ca, cb := tok("pa"), tok("pb")
	mk := func(c *warren.Client, req api.CreateSandboxRequest) *api.Sandbox {
		req.Image = "busybox"
		sb, err := c.Create(ctx, req)
		if err != nil {
			t.Fatalf("create: %v\n%s", err, tail(s.logs.String(), 40))
		}
		t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), sb.ID) })
		return sb
	}
	a := mk(ca, api.CreateSandboxRequest{Trajectory: "audit-run", Checkpoint: "none"})
	b := mk(cb, api.CreateSandboxRequest{})

	run := func(c *warren.Client, id, cmd string) *api.ExecResult {
		r, err := c.Exec(ctx, id, api.ExecRequest{Cmd: cmd})
		if err != nil || r.ExitCode != 0 {
			t.Errorf("exec %q: %+v %v", cmd, r, err)
			return &api.ExecResult{}
		}
		return r
	}
	// Busybox's shell runs its applets without an exec unless named by
	// path: /bin/ls is an execve, a bare ls is not.
	r1 := run(ca, a.ID, "/bin/echo step-one")
	// a's step 2 and b's script run at the same time.
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		run(cb, b.ID, "for i in 1 2 3 4 5 6 7 8; do /bin/true marker-b; done; /bin/echo marker-b")
	}()
	r2 := run(ca, a.ID, "sh -c 'for i in 1 2 3 4 5 6 7 8; do /bin/true step-two; done; /bin/ls / >/dev/null; /bin/echo marker-a'")
	wg.Wait()
	if r1.Step != 1 || r2.Step != 2 {
		t.Fatalf("steps: %d %d", r1.Step, r2.Step)
	}

	recs := execsOf(t, ca, a.ID, 2, "marker-a")
	var sawTrue, sawLs bool
	for _, r := range recs {
		if r.Pid <= 0 || r.Time.IsZero() || r.Path == "" {
			t.Errorf("incomplete record: %+v", r)
		}
		// Commands run as the sandbox's root: uid 0 in its user namespace,
		// whatever host id that is.
		if r.UID != 0 {
			t.Errorf("uid %d (host %d), want 0 as the sandbox sees it: %+v", r.UID, r.HostUID, r)
		}
		switch {
		case path.Base(r.Path) == "true" && slices.Equal(r.Argv, []string{"/bin/true", "step-two"}):
			sawTrue = true
		case path.Base(r.Path) == "ls" && slices.Equal(r.Argv, []string{"/bin/ls", "/"}):
			sawLs = true
		}
		if strings.Contains(strings.Join(r.Argv, " "), "marker-b") {
			t.Errorf("sandbox a's audit holds b's exec: %+v", r)
		}
	}
	if !sawTrue || !sawLs {
		t.Errorf("step 2 lacks the execs of true (%v) and ls (%v): %+v", sawTrue, sawLs, recs)
	}
	// Step 1's exec is at step 1, not 2.
	for _, r := range execsOf(t, ca, a.ID, 1, "step-one") {
		if strings.Contains(strings.Join(r.Argv, " "), "step-two") {
			t.Errorf("step 2's exec at step 1: %+v", r)
		}
	}
	// The neighbour's audit has its own execs (between steps: no
	// trajectory) and none of a's.
	for _, r := range execsOf(t, cb, b.ID, 0, "marker-b") {
		if strings.Contains(strings.Join(r.Argv, " "), "step-two") || strings.Contains(strings.Join(r.Argv, " "), "marker-a") {
			t.Errorf("sandbox b's audit holds a's exec: %+v", r)
		}
	}
	// The summary counts step 2's execs (at least 8 trues, ls, echo, sh).
	sum, err := ca.Audit(ctx, a.ID, warren.AuditQuery{Summary: true})
	if err != nil || len(sum.Records) != 0 {
		t.Fatalf("summary: %+v %v", sum, err)
	}
	var step2 int64
	for _, st := range sum.Summary {
		if st.Step == 2 {
			step2 = st.Counts[api.AuditKindExec]
		}
	}
	if step2 < 11 {
		t.Errorf("summary: %d execs at step 2, want ≥ 11: %+v", step2, sum.Summary)
	}
	// The trajectory's page carries each step's audit.
	page, err := ca.TrajectoryAudit(ctx, "audit-run", 0, 0)
	if err != nil || len(page.Steps) != 2 {
		t.Fatalf("trajectory with audit: %+v %v", page, err)
	}
	var inPage bool
	for _, r := range page.Steps[1].Audit {
		if r.Step != 2 {
			t.Errorf("step 2 of the page carries %+v", r)
		}
		inPage = inPage || slices.Equal(r.Argv, []string{"/bin/true", "step-two"})
	}
	if !inPage || len(page.Steps[0].Audit) == 0 {
		t.Errorf("page's audit: step 1 %+v, step 2 %+v", page.Steps[0].Audit, page.Steps[1].Audit)
	}
	if plain, err := ca.Trajectory(ctx, "audit-run", 0, 0); err != nil || len(plain.Steps[1].Audit) != 0 {
		t.Errorf("a page without ?audit=1 carries an audit: %+v %v", plain, err)
	}
	// A sibling project's token reads none of it.
	for _, p := range []string{"/v1/sandboxes/" + a.ID + "/audit", "/v1/sandboxes/" + a.ID + "/audit?step=2", "/v1/trajectories/audit-run?audit=1&project=pa"} {
		code, body := s.rawRequest(t, "GET", p, secrets["pb"], nil, nil)
		if code != 404 || strings.Contains(body, "step-two") {
			t.Errorf("GET %s with pb's token: %d %s", p, code, body)
		}
	}
	// What a background process executes after its operation answered is
	// between steps (0).
	bg, err := ca.Exec(ctx, a.ID, api.ExecRequest{Cmd: "sleep 0.3; /bin/echo between-steps", Background: true})
	if err != nil {
		t.Fatalf("background exec: %v", err)
	}
	for _, r := range execsOf(t, ca, a.ID, 0, "between-steps") {
		if r.Step != 0 {
			t.Errorf("between steps: %+v", r)
		}
	}
	if _, err := ca.Command(ctx, a.ID, bg.CommandID, true); err != nil {
		t.Fatalf("background command: %v", err)
	}
	// Bad input is a 400.
	if code, body := s.rawRequest(t, "GET", "/v1/sandboxes/"+a.ID+"/audit?step=x", "", nil, nil); code != 400 {
		t.Errorf("step=x: %d %s", code, body)
	}
}

// TestAuditWithoutTelemetry: a node without telemetry says so in its
// view, runs sandboxes, and answers their audit empty with telemetry false.
func TestAuditWithoutTelemetry(t *testing.T) {
	parallel(t)
	s := startServer(t, "--no-telemetry")
	if nodeTelemetry(t, s) {
		t.Fatal("features.telemetry true on a node started with --no-telemetry")
	}
	sb := s.create(t, api.CreateSandboxRequest{})
	if r := s.sh(t, sb.ID, "/bin/echo hi"); r.ExitCode != 0 || r.Stdout != "hi\n" {
		t.Fatalf("exec: %+v", r)
	}
	al, err := s.C.Audit(context.Background(), sb.ID, warren.AuditQuery{})
	if err != nil || al.Telemetry || len(al.Records) != 0 {
		t.Fatalf("audit: %+v %v", al, err)
	}
}

// TestAuditRefusalsAndSignals: on a node started with
// --telemetry-refusals, a mount the sandbox's seccomp filter refuses and a
// signal sent to its agent (PID 1) are in its audit at their step.
func TestAuditRefusalsAndSignals(t *testing.T) {
	parallel(t)
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		t.Skipf("SKIP: the kernel has no BTF (%v): the node runs without telemetry", err)
	}
	s := startServer(t, "--telemetry-refusals")
	if !nodeTelemetry(t, s) {
		t.Fatalf("features.telemetry false:\n%s", tail(s.logs.String(), 40))
	}
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{Trajectory: "audit-refusals", Checkpoint: "none"})
	s.sh(t, sb.ID, "/bin/echo warm-up")
	// SIGURG (23): the agent, a Go program, takes it harmlessly.
	r := s.sh(t, sb.ID, "kill -23 1; mount -t tmpfs none /mnt; /bin/echo done")
	if r.Step != 2 || !strings.Contains(r.Stdout, "done") {
		t.Fatalf("exec: %+v", r)
	}
	if _, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "/bin/echo alive"}); err != nil {
		t.Fatalf("the agent did not survive the signal: %v", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		al, err := s.C.Audit(ctx, sb.ID, warren.AuditQuery{Step: 2, HasStep: true})
		if err != nil {
			t.Fatal(err)
		}
		var mount, signal bool
		for _, rec := range al.Records {
			switch rec.Kind {
			case api.AuditKindRefused:
				mount = mount || rec.Syscall == "mount"
			case api.AuditKindSignal:
				signal = signal || (rec.Signal == 23 && rec.Target == 1 && rec.Pid > 1 && rec.Outcome != "")
			}
		}
		if mount && signal {
			only, err := s.C.Audit(ctx, sb.ID, warren.AuditQuery{Kind: api.AuditKindSignal})
			if err != nil {
				t.Fatal(err)
			}
			for _, rec := range only.Records {
				if rec.Kind != api.AuditKindSignal {
					t.Errorf("?kind=signal answered %+v", rec)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("step 2: refused mount %v, signal to PID 1 %v: %+v", mount, signal, al.Records)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAuditAfterRestart: a sandbox adopted by a restarted node (kill -9)
// is registered with the new node's telemetry: its execs are recorded.
func TestAuditAfterRestart(t *testing.T) {
	parallel(t)
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		t.Skipf("SKIP: the kernel has no BTF (%v): the node runs without telemetry", err)
	}
	s := startServer(t)
	sb := s.create(t, api.CreateSandboxRequest{Trajectory: "audit-restart", Checkpoint: "none"})
	s.sh(t, sb.ID, "/bin/echo before")
	s.kill9()
	s.start()
	r, err := s.C.Exec(context.Background(), sb.ID, api.ExecRequest{Cmd: "sh -c '/bin/echo after-restart'"})
	if err != nil || r.Step != 2 {
		t.Fatalf("exec after restart: %+v %v\n%s", r, err, tail(s.logs.String(), 30))
	}
	execsOf(t, s.C, sb.ID, 2, "after-restart")
}

// TestAuditFiles: on a node started with --telemetry-files, what a
// sandbox's command writes, renames, chmods and unlinks is in its audit at
// its step; the agent's own file work (its session scripts) is not.
func TestAuditFiles(t *testing.T) {
	parallel(t)
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		t.Skipf("SKIP: the kernel has no BTF (%v): the node runs without telemetry", err)
	}
	s := startServer(t, "--telemetry-files")
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{Trajectory: "audit-files", Checkpoint: "none"})
	s.sh(t, sb.ID, "/bin/echo warm-up")
	r := s.sh(t, sb.ID, "echo x > /etc/planted; mv /etc/planted /etc/planted2; chmod 700 /etc/planted2; rm /etc/planted2; cat /etc/hostname >/dev/null")
	if r.Step != 2 || r.ExitCode != 0 {
		t.Fatalf("exec: %+v", r)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		al, err := s.C.Audit(ctx, sb.ID, warren.AuditQuery{Kind: api.AuditKindFile})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, rec := range al.Records {
			if rec.Kind != api.AuditKindFile {
				t.Fatalf("?kind=file answered %+v", rec)
			}
			if strings.HasPrefix(rec.Path, "/dev/.warren") {
				t.Fatalf("the agent's own file work is in the audit: %+v", rec)
			}
			if rec.Path == "/etc/hostname" {
				t.Fatalf("a read is in the audit: %+v", rec)
			}
			if rec.Step == 2 {
				seen[rec.Op+" "+rec.Path+" "+rec.To] = true
			}
		}
		if seen["write /etc/planted "] && seen["rename /etc/planted /etc/planted2"] && seen["chmod /etc/planted2 "] && seen["unlink /etc/planted2 "] {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("step 2's file operations: %v\n%+v", seen, al.Records)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAuditFollow: ?follow=1 streams records as they come, in seq order,
// and ends once the sandbox stopped; ?after= resumes.
func TestAuditFollow(t *testing.T) {
	parallel(t)
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		t.Skipf("SKIP: the kernel has no BTF (%v): the node runs without telemetry", err)
	}
	s := startServer(t)
	ctx := context.Background()
	sb, err := s.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), sb.ID) })
	recs := make(chan api.AuditRecord, 256)
	done := make(chan error, 1)
	go func() {
		done <- s.C.FollowAudit(ctx, sb.ID, 0, func(r api.AuditRecord) error { recs <- r; return nil })
	}()
	waitFor := func(marker string) api.AuditRecord {
		t.Helper()
		deadline := time.After(15 * time.Second)
		for {
			select {
			case r := <-recs:
				if n := len(r.Argv); n > 0 && r.Argv[n-1] == marker {
					return r
				}
			case err := <-done:
				t.Fatalf("the stream ended early: %v", err)
			case <-deadline:
				t.Fatalf("no record of %s in 15s", marker)
			}
		}
	}
	s.sh(t, sb.ID, "/bin/echo follow-1")
	first := waitFor("follow-1")
	s.sh(t, sb.ID, "/bin/echo follow-2")
	second := waitFor("follow-2")
	if second.Seq <= first.Seq {
		t.Errorf("seq %d then %d", first.Seq, second.Seq)
	}
	if _, err := s.C.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the stream of a stopped sandbox ended with %v, want its end", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the stream did not end after the sandbox stopped")
	}
	al, err := s.C.Audit(ctx, sb.ID, warren.AuditQuery{})
	if err != nil || al.Live {
		t.Fatalf("audit of the stopped sandbox: %+v %v", al, err)
	}
	// after= resumes past what was seen.
	var again []api.AuditRecord
	if err := s.C.FollowAudit(ctx, sb.ID, first.Seq, func(r api.AuditRecord) error { again = append(again, r); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(again) == 0 || again[0].Seq != first.Seq+1 {
		t.Fatalf("after=%d: %+v", first.Seq, again)
	}
}
