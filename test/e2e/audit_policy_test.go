package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// auditUntil polls sandbox id's audit until ok accepts its records.
func auditUntil(t *testing.T, c *warren.Client, id string, what string, ok func([]api.AuditRecord) bool) []api.AuditRecord {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		al, err := c.Audit(context.Background(), id, warren.AuditQuery{})
		if err != nil {
			t.Fatalf("audit of %s: %v", id, err)
		}
		if ok(al.Records) {
			return al.Records
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for _, r := range al.Records {
				b.WriteString(strings.Join([]string{r.Kind, r.Path, r.Op, r.Syscall, r.Dest, r.To, r.Rule}, " "))
				b.WriteString("\n")
			}
			t.Fatalf("audit of %s never showed %s:\n%s", id, what, b.String())
		}
		time.Sleep(150 * time.Millisecond)
	}
}

// TestAuditMisbehaviour: a sandbox runs a script of misbehaviour across
// trajectory steps while a neighbour runs its own; its audit lists each
// act at its step (a write into the protected toolkit, a planted binary
// executed, a connection attempt, mount, extent-swap ioctls and ptrace of
// its agent refused, a fork bomb at the pids limit, a flood cut at its
// output cap, a background write between steps), skips the declared
// workspace, and holds nothing of the neighbour.
func TestAuditMisbehaviour(t *testing.T) {
	parallel(t)
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		t.Skipf("SKIP: the kernel has no BTF (%v): the node runs without telemetry", err)
	}
	s := startServer(t, "--telemetry-files", "--telemetry-refusals")
	ctx := context.Background()
	if !nodeTelemetry(t, s) {
		t.Fatalf("no telemetry:\n%s", tail(s.logs.String(), 40))
	}
	if _, err := s.C.CreateLayerFromTar(ctx, "toolkit/grader", 0, bytes.NewReader(tarOf(t, [2]string{"grade.sh", "echo PASS"}))); err != nil {
		t.Fatal(err)
	}
	a := s.create(t, api.CreateSandboxRequest{
		Trajectory: "misbehave", Checkpoint: "none", Pids: 40,
		Layers: []api.LayerAttachment{{Layer: "toolkit/grader", Mount: "/opt/toolkit", Protected: true}},
		Audit:  &api.AuditSpec{Workspace: []string{"/work"}, Policy: []api.AuditRule{{On: "exec:/tmp/*", Do: api.AuditDoFlag}}},
	})
	b := s.create(t, api.CreateSandboxRequest{})

	// The neighbour's script runs all along.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = s.C.Exec(ctx, b.ID, api.ExecRequest{Cmd: "mkdir -p /etc/nb; echo n > /etc/nb/neighbour-marker; /bin/echo neighbour-marker"})
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	// Step 1: the toolkit, the workspace, a planted binary, a connection.
	r1 := s.sh(t, a.ID, "mkdir -p /work; echo notes > /work/notes; echo pwn >> /opt/toolkit/grade.sh; "+
		"cp /bin/busybox /tmp/planted; /tmp/planted true; nc -w 1 127.0.0.1 9 </dev/null; "+
		"cat /opt/toolkit/grade.sh >/dev/null; cat /proc/1/mem 2>/dev/null; cat /etc/hostname >/dev/null; true")
	// Step 2: the probe goes in; step 3 runs it.
	probe, err := os.ReadFile(bins.probe)
	if err != nil {
		t.Fatal(err)
	}
	f2, err := s.C.WriteFileBytes(ctx, a.ID, "/probe", probe, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	// Through the session's shell, as an agent would (an argv command runs
	// its first moments beside the agent, whose file operations are not
	// recorded: see docs/architecture.md, "Telemetry").
	r3, err := s.C.Exec(ctx, a.ID, api.ExecRequest{Cmd: "/probe", Timeout: 60})
	if err != nil {
		t.Fatal(err)
	}
	// Step 4: a flood at the output cap and a fork bomb at the pids limit
	// (the shell gives up at its first refused fork, its sleeps live on).
	r4, err := s.C.Exec(ctx, a.ID, api.ExecRequest{Argv: []string{"sh", "-c", "yes | head -c 3000000; for i in $(seq 60); do sleep 4 & done"}, OutputCap: 4096})
	if err != nil {
		t.Fatal(err)
	}
	// The fork bomb's sleeps (4 s) hold the sandbox's pids until they end.
	time.Sleep(5 * time.Second)
	// The next step starts a background writer that acts between steps.
	r5, err := s.C.Exec(ctx, a.ID, api.ExecRequest{Cmd: "sleep 1; echo bg > /etc/bg-marker", Background: true})
	if err != nil {
		t.Fatal(err)
	}
	if r1.Step != 1 || f2.Step != 2 || r3.Step != 3 || r4.Step != 4 || r5.Step != 5 {
		t.Fatalf("steps: %d %d %d %d %d", r1.Step, f2.Step, r3.Step, r4.Step, r5.Step)
	}
	if !r4.PidsLimited || !r4.Truncated {
		t.Fatalf("step 4 hit no limit: %+v", r4)
	}

	type want struct {
		step int64
		what string
		ok   func(api.AuditRecord) bool
	}
	wants := []want{
		{1, "a write into the toolkit", func(r api.AuditRecord) bool {
			return r.Kind == api.AuditKindFile && r.Path == "/opt/toolkit/grade.sh"
		}},
		{1, "the planted binary, flagged", func(r api.AuditRecord) bool {
			return r.Kind == api.AuditKindExec && r.Path == "/tmp/planted" && r.Action == api.AuditDoFlag && r.Rule == "exec:/tmp/*"
		}},
		{1, "a connection attempt", func(r api.AuditRecord) bool {
			return r.Kind == api.AuditKindConnect && r.Dest == "127.0.0.1:9"
		}},
		{1, "a read of the protected toolkit", func(r api.AuditRecord) bool {
			return r.Kind == api.AuditKindFile && r.Op == api.AuditOpRead && r.Path == "/opt/toolkit/grade.sh"
		}},
		{1, "an open of the agent's memory", func(r api.AuditRecord) bool {
			return r.Kind == api.AuditKindFile && r.Op == api.AuditOpRead && r.Path == "/proc/1/mem"
		}},
		{3, "a read of /proc/kpagecgroup", func(r api.AuditRecord) bool {
			return r.Kind == api.AuditKindFile && r.Op == api.AuditOpRead && r.Path == "/proc/kpagecgroup"
		}},
		{3, "mount refused", func(r api.AuditRecord) bool { return r.Kind == api.AuditKindRefused && r.Syscall == "mount" }},
		{3, "an extent-swap ioctl refused", func(r api.AuditRecord) bool { return r.Kind == api.AuditKindRefused && r.Syscall == "ioctl" }},
		{3, "ptrace of the agent refused", func(r api.AuditRecord) bool { return r.Kind == api.AuditKindRefused && r.Syscall == "ptrace" }},
		{3, "the probe executed", func(r api.AuditRecord) bool { return r.Kind == api.AuditKindExec && r.Path == "/probe" }},
		{4, "the pids limit", func(r api.AuditRecord) bool { return r.Kind == api.AuditKindLimit && r.Op == api.AuditLimitPids }},
		{4, "the output cap", func(r api.AuditRecord) bool { return r.Kind == api.AuditKindLimit && r.Op == api.AuditLimitOutput }},
		{0, "the background write between steps", func(r api.AuditRecord) bool {
			return r.Kind == api.AuditKindFile && r.Path == "/etc/bg-marker"
		}},
	}
	recs := auditUntil(t, s.C, a.ID, "every act of the script", func(recs []api.AuditRecord) bool {
		for _, w := range wants {
			found := false
			for _, r := range recs {
				if r.Step == w.step && w.ok(r) {
					found = true
					break
				}
			}
			if !found {
				return false
			}
		}
		return true
	})
	for _, r := range recs {
		if strings.HasPrefix(r.Path, "/work/") || r.Path == "/work" {
			t.Errorf("a file operation in the declared workspace was recorded: %+v", r)
		}
		if strings.Contains(r.Path, "neighbour-marker") || strings.Contains(strings.Join(r.Argv, " "), "neighbour-marker") {
			t.Errorf("the neighbour's act is in this audit: %+v", r)
		}
		if r.Op == api.AuditOpRead && r.Path == "/etc/hostname" {
			t.Errorf("a plain read is in the audit: %+v", r)
		}
		if r.Action != "" && !(r.Kind == api.AuditKindExec && strings.HasPrefix(r.Path, "/tmp/")) {
			t.Errorf("the policy acted on a record it does not select: %+v", r)
		}
	}
	// The summary counts per step.
	al, err := s.C.Audit(ctx, a.ID, warren.AuditQuery{Summary: true})
	if err != nil {
		t.Fatal(err)
	}
	counts := map[int64]map[string]int64{}
	for _, st := range al.Summary {
		counts[st.Step] = st.Counts
	}
	if counts[3][api.AuditKindRefused] < 3 || counts[4][api.AuditKindLimit] < 2 || counts[1][api.AuditKindConnect] < 1 {
		t.Errorf("summary: %+v", al.Summary)
	}

	// The audit is kept with the trajectory: the summary and each step's
	// records outlive the sandbox.
	time.Sleep(time.Second) // the last step's records are persisted a moment after it
	if _, err := s.C.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	sum, err := s.C.TrajectoryAuditSummary(ctx, "misbehave")
	if err != nil {
		t.Fatal(err)
	}
	kept := map[int64]api.AuditStepSummary{}
	for _, st := range sum.Summary {
		kept[st.Step] = st
	}
	if kept[3].Counts[api.AuditKindRefused] < 3 || kept[4].Counts[api.AuditKindLimit] < 2 || kept[1].Matched < 1 || kept[1].Counts[api.AuditKindExec] < 1 {
		t.Errorf("the trajectory's summary after its sandbox was deleted: %+v", sum.Summary)
	}
	code, body := s.rawRequest(t, "GET", "/v1/trajectories/misbehave/audit/summary", "", nil, nil)
	if code != 200 || !strings.Contains(body, `"matched":`) {
		t.Errorf("GET .../audit/summary: %d %s", code, body)
	}
	page, err := s.C.TrajectoryAudit(ctx, "misbehave", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var probeRefusals int
	for _, st := range page.Steps {
		for _, r := range st.Audit {
			if st.Step == 3 && r.Kind == api.AuditKindRefused {
				probeRefusals++
			}
			if r.Step != st.Step {
				t.Errorf("step %d carries a record of step %d", st.Step, r.Step)
			}
		}
	}
	if probeRefusals < 3 {
		t.Errorf("step 3's records after the sandbox was deleted: %d refusals", probeRefusals)
	}
}

// TestAuditPolicyKillsStep: a hook on writes into the toolkit ends the
// step that tried one, at once, with killed_by "policy"; the sandbox
// lives on. fail-sandbox ends the sandbox.
func TestAuditPolicyKillsStep(t *testing.T) {
	parallel(t)
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		t.Skipf("SKIP: the kernel has no BTF (%v): the node runs without telemetry", err)
	}
	s := startServer(t, "--telemetry-files")
	ctx := context.Background()
	if _, err := s.C.CreateLayerFromTar(ctx, "toolkit/grader", 0, bytes.NewReader(tarOf(t, [2]string{"grade.sh", "echo PASS"}))); err != nil {
		t.Fatal(err)
	}
	tk := []api.LayerAttachment{{Layer: "toolkit/grader", Mount: "/opt/toolkit", Protected: true}}
	a := s.create(t, api.CreateSandboxRequest{Layers: tk, Trajectory: "kill-step", Checkpoint: "none",
		Audit: &api.AuditSpec{Policy: []api.AuditRule{{On: "write:/opt/toolkit/**", Do: api.AuditDoKillStep}}}})
	t0 := time.Now()
	r, err := s.C.Exec(ctx, a.ID, api.ExecRequest{Cmd: "echo pwn > /opt/toolkit/grade.sh; sleep 60; echo survived", Timeout: 90})
	if err != nil {
		t.Fatal(err)
	}
	if r.KilledBy != api.KilledByPolicy || strings.Contains(r.Stdout, "survived") || time.Since(t0) > 20*time.Second {
		t.Fatalf("the step that wrote the toolkit was not ended by the hook: %+v after %v", r, time.Since(t0))
	}
	if ps := s.sh(t, a.ID, "ps -o args | grep -c '[s]leep 60'"); strings.TrimSpace(ps.Stdout) != "0" {
		t.Fatalf("the step's command still runs: %+v", ps)
	}
	if ok := s.sh(t, a.ID, "echo fine"); ok.ExitCode != 0 || ok.KilledBy != "" {
		t.Fatalf("the next step: %+v", ok)
	}
	auditUntil(t, s.C, a.ID, "the matched write", func(recs []api.AuditRecord) bool {
		for _, rec := range recs {
			if rec.Kind == api.AuditKindFile && rec.Path == "/opt/toolkit/grade.sh" && rec.Action == api.AuditDoKillStep {
				return true
			}
		}
		return false
	})

	f := s.create(t, api.CreateSandboxRequest{Layers: tk,
		Audit: &api.AuditSpec{Policy: []api.AuditRule{{On: "write:/opt/toolkit/**", Do: api.AuditDoFailSandbox}}}})
	_, _ = s.C.Exec(ctx, f.ID, api.ExecRequest{Cmd: "echo pwn > /opt/toolkit/grade.sh; sleep 60", Timeout: 90})
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := s.C.Get(ctx, f.ID)
		if err == nil && got.State == api.StateFailed && strings.Contains(got.Reason, "write:/opt/toolkit/**") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("fail-sandbox: %+v %v", got, err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	// A sandbox created with the audit off records nothing.
	off := s.create(t, api.CreateSandboxRequest{Audit: &api.AuditSpec{Off: true}})
	s.sh(t, off.ID, "/bin/ls / >/dev/null; echo x > /etc/off-marker")
	time.Sleep(500 * time.Millisecond)
	if al, err := s.C.Audit(ctx, off.ID, warren.AuditQuery{}); err != nil || len(al.Records) != 0 {
		t.Errorf("audit off: %v %+v", err, al)
	}

	// Bad policies are refused at create.
	for _, bad := range []api.AuditSpec{
		{Off: true, Workspace: []string{"/work"}},
		{Policy: []api.AuditRule{{On: "open:/x", Do: "flag"}}},
		{Policy: []api.AuditRule{{On: "write:/x", Do: "explode"}}},
		{Workspace: []string{"relative/path"}},
	} {
		_, err := s.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Audit: &bad})
		mustCode(t, "create with a bad audit spec", err, api.CodeInvalid)
	}
}

// TestPidsLimitAnswers429: a command that cannot start because the
// sandbox's processes hold every pid it may use answers 429 with reason
// pids (it was a 500), and the audit records the limit.
func TestPidsLimitAnswers429(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{Pids: 30})
	probe, err := os.ReadFile(bins.probe)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.C.WriteFileBytes(ctx, sb.ID, "/probe", probe, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"/probe", "hold", "20"}, Background: true}); err != nil {
		t.Fatal(err)
	}
	// Each try holds its pid too (a background sleep): a command that ended
	// at once would give its pid back to the agent's warm shell, which
	// then runs the next one without a fork, for as long as the test asks.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"/bin/sleep", "60"}, Background: true})
		if err == nil {
			if time.Now().After(deadline) {
				t.Fatal("the probe never filled the pids limit")
			}
			continue
		}
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeTooManyRequests || ae.Reason != api.ReasonPids {
			t.Fatalf("exec at the pids limit: %v (want 429, reason pids)", err)
		}
		break
	}
	auditUntil(t, s.C, sb.ID, "a limit record", func(recs []api.AuditRecord) bool {
		for _, r := range recs {
			if r.Kind == api.AuditKindLimit && r.Op == api.AuditLimitPids {
				return true
			}
		}
		return false
	})
}

// TestSessionZombiesDoNotHoldPids: background jobs of a session's command
// that have ended are zombies of its idle shell; at the pids limit they
// must not refuse the sandbox's next process (they did, for good: the
// shell reaps only when it runs its next command).
func TestSessionZombiesDoNotHoldPids(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{Pids: 40})
	r := s.sh(t, sb.ID, "for i in $(seq 36); do sleep 1 & done; echo started")
	if !strings.Contains(r.Stdout, "started") {
		t.Fatalf("session command: %+v", r)
	}
	time.Sleep(3 * time.Second) // the sleeps have ended: zombies of the idle session shell
	for i := 0; i < 3; i++ {
		// Each takes six pids beside the 36 zombies (of 40).
		res, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"sh", "-c", "/bin/true & /bin/true & /bin/true & /bin/true & /bin/true & wait"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("a new process beside the session's ended jobs: %+v %v", res, err)
		}
	}
}

// TestAuditArgvAndTrusted: a command started by argv is recorded from its
// first moment (it runs beside the agent until it is moved into work/,
// where its file operations were not recorded: a quick one went unseen),
// while a trusted command's own file work (a grader, beside the agent,
// the sandbox frozen) stays out of the audit, background ones included.
func TestAuditArgvAndTrusted(t *testing.T) {
	parallel(t)
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		t.Skipf("SKIP: the kernel has no BTF (%v): the node runs without telemetry", err)
	}
	s := startServer(t, "--telemetry-files")
	ctx := context.Background()
	dir := t.TempDir()
	if err := os.MkdirAll(dir+"/bin", 0o755); err != nil {
		t.Fatal(err)
	}
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("SKIP: no /bin/busybox on the host to build a toolkit from")
	}
	if err := os.WriteFile(dir+"/bin/busybox", bb, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("busybox", dir+"/bin/sh"); err != nil {
		t.Fatal(err)
	}
	if out, err := s.warren(t, "layer", "create", "--from-dir", dir, "--name", "toolkit/tr"); err != nil {
		t.Fatalf("toolkit: %q %v", out, err)
	}
	sb := s.create(t, api.CreateSandboxRequest{Layers: []api.LayerAttachment{{Layer: "toolkit/tr", Mount: "/opt/toolkit", Protected: true}}})
	for i := 0; i < 5; i++ {
		r, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"/bin/sh", "-c", fmt.Sprintf("echo x > /etc/argv-%d", i)}})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("argv: %+v %v", r, err)
		}
	}
	for _, bg := range []bool{false, true} {
		r, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: fmt.Sprintf("echo graded > /tmp/trusted-%v; sleep 0.5; echo again > /tmp/trusted-%v", bg, bg), Trusted: true, Background: bg})
		if err != nil || r.ExitCode != 0 {
			t.Fatalf("trusted (background %v): %+v %v", bg, r, err)
		}
	}
	time.Sleep(2 * time.Second) // the background trusted command ends
	recs := auditUntil(t, s.C, sb.ID, "every argv command's write", func(recs []api.AuditRecord) bool {
		n := 0
		for _, r := range recs {
			if r.Kind == api.AuditKindFile && strings.HasPrefix(r.Path, "/etc/argv-") {
				n++
			}
		}
		return n == 5
	})
	for _, r := range recs {
		if strings.Contains(r.Path, "trusted-") {
			t.Errorf("a trusted command's own file work is in the audit: %+v", r)
		}
	}
}
