package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

func counterOp(i int) api.ExecRequest {
	return api.ExecRequest{Cmd: fmt.Sprintf("echo x >> /counter; echo step-%d > /state/s%d; wc -l < /counter", i, i)}
}

func TestTrajectoryRecordKillResume(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{Trajectory: "rollout-1/run", Checkpoint: "none"})
	if sb.Trajectory != "rollout-1/run" {
		t.Fatalf("sandbox: %+v", sb)
	}
	r, err := s.C.Mkdir(ctx, sb.ID, api.MkdirRequest{Path: "/state"})
	if err != nil || r.Step != 1 {
		t.Fatalf("mkdir: %+v %v", r, err)
	}
	for i := 1; i <= 20; i++ {
		res, err := s.C.Exec(ctx, sb.ID, counterOp(i))
		if err != nil {
			t.Fatal(err)
		}
		if res.Step != int64(i+1) || res.Replayed || strings.TrimSpace(res.Stdout) != fmt.Sprint(i) {
			t.Fatalf("step %d: %+v", i, res)
		}
	}
	// A second trajectory of the same name is refused.
	if _, err := s.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Trajectory: "rollout-1/run"}); err == nil || !strings.Contains(err.Error(), "conflict") {
		t.Fatalf("duplicate trajectory: %v", err)
	}

	s.kill9()
	s.start()

	// The log survived.
	steps, err := s.C.TrajectoryAll(ctx, "rollout-1/run")
	if err != nil || len(steps) != 21 {
		t.Fatalf("log after kill -9: %d steps, %v", len(steps), err)
	}
	if steps[0].Op != "mkdir" || steps[5].Op != "exec" || steps[5].Exec.Cmd != counterOp(5).Cmd || steps[5].Result.Stdout != "5\n" {
		t.Fatalf("logged steps: %+v %+v", steps[0], steps[5])
	}
	page, err := s.C.Trajectory(ctx, "rollout-1/run", 3, 5)
	if err != nil || len(page.Steps) != 5 || page.Steps[0].Step != 4 || page.Next != 8 {
		t.Fatalf("page: %+v %v", page, err)
	}

	// Two resumers at once: one wins, the other gets 409.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func(i int) { defer wg.Done(); _, errs[i] = s.C.ResumeTrajectory(ctx, "rollout-1/run", false) }(i)
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("concurrent resumes: %v / %v", errs[0], errs[1])
	}
	for _, e := range errs {
		if e != nil && !strings.Contains(e.Error(), "conflict") {
			t.Fatalf("losing resumer: %v", e)
		}
	}

	// Re-issue the same 21 operations: all replayed, nothing runs.
	if r, err := s.C.Mkdir(ctx, sb.ID, api.MkdirRequest{Path: "/state"}); err != nil || !r.Replayed || r.Step != 1 {
		t.Fatalf("replayed mkdir: %+v %v", r, err)
	}
	for i := 1; i <= 20; i++ {
		var res *api.ExecResult
		var err error
		var streamed strings.Builder
		if i%5 == 0 {
			res, err = s.C.ExecStreamFunc(ctx, sb.ID, counterOp(i), func(ev api.ExecEvent) error {
				if ev.Stdout != nil {
					streamed.WriteString(*ev.Stdout)
				}
				return nil
			})
			if err == nil {
				res.Stdout = streamed.String()
			}
		} else {
			res, err = s.C.Exec(ctx, sb.ID, counterOp(i))
		}
		if err != nil {
			t.Fatal(err)
		}
		if !res.Replayed || res.Step != int64(i+1) || strings.TrimSpace(res.Stdout) != fmt.Sprint(i) {
			t.Fatalf("replay %d: %+v", i, res)
		}
	}
	// Then 5 new ones run live (the first two streamed as NDJSON: the last
	// line carries the step too).
	for i := 21; i <= 25; i++ {
		var res *api.ExecResult
		var err error
		if i < 23 {
			res, err = s.C.ExecStreamFunc(ctx, sb.ID, counterOp(i), func(api.ExecEvent) error { return nil })
		} else {
			res, err = s.C.Exec(ctx, sb.ID, counterOp(i))
		}
		if err != nil {
			t.Fatal(err)
		}
		if res.Replayed || res.Step != int64(i+1) {
			t.Fatalf("live %d: %+v", i, res)
		}
	}
	got := s.sh(t, sb.ID, "wc -l < /counter; ls /state | wc -l").Stdout
	if got != "25\n25\n" {
		t.Fatalf("counter after resume: %q (want 25 live executions)", got)
	}

	// Divergence: a resumed client that issues something else gets 409 with both operations.
	if _, err := s.C.ResumeTrajectory(ctx, "rollout-1/run", false); err != nil {
		t.Fatal(err)
	}
	_, err = s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo different"})
	var we *warren.APIError
	if !errors.As(err, &we) || we.Status != http.StatusConflict || we.Divergence == nil || we.Divergence.Step != 1 || we.Divergence.Logged.Op != "mkdir" || we.Divergence.Received.Exec.Cmd != "echo different" {
		t.Fatalf("divergence: %v %+v", err, we)
	}
	// The CLI shows the log; --path answers provenance.
	out, err := s.warren(t, "traj", "show", "rollout-1/run")
	if err != nil || strings.Count(out, "\n") != 28 || !strings.Contains(out, "echo x >> /counter; echo step-25") {
		t.Fatalf("traj show: %v\n%s", err, out)
	}
	out, err = s.warren(t, "traj", "show", "--path", "/state", "rollout-1/run")
	if err != nil || strings.Count(out, "\n") != 2 || !strings.Contains(out, "mkdir") {
		t.Fatalf("traj show --path: %v\n%s", err, out)
	}
	out, err = s.warren(t, "traj", "diff", "rollout-1/run", "0", "2")
	if err != nil || !strings.Contains(out, "/state") || !strings.Contains(out, "step 2") {
		t.Fatalf("traj diff: %v\n%s", err, out)
	}
	if p, err := s.C.TrajectoryFiles(ctx, "rollout-1/run", "/state"); err != nil || len(p.Steps) != 1 || p.Steps[0].Step != 1 {
		t.Fatalf("provenance: %+v %v", p, err)
	}
	// Unknown trajectories.
	if _, err := s.C.ResumeTrajectory(ctx, "no-such", false); err == nil || !strings.Contains(err.Error(), "not_found") {
		t.Fatalf("resume unknown: %v", err)
	}
	if _, err := s.C.Trajectory(ctx, "no-such", 0, 0); err == nil || !strings.Contains(err.Error(), "not_found") {
		t.Fatalf("read unknown: %v", err)
	}
}

func TestTrajectoryRebuildFromCheckpoint(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{Trajectory: "rollout-2", Checkpoint: "every-step"})
	if _, err := s.C.Mkdir(ctx, sb.ID, api.MkdirRequest{Path: "/state"}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 20; i++ {
		if _, err := s.C.Exec(ctx, sb.ID, counterOp(i)); err != nil {
			t.Fatal(err)
		}
	}
	steps, err := s.C.TrajectoryAll(ctx, "rollout-2")
	if err != nil || len(steps) != 21 || steps[20].Checkpoint == "" {
		t.Fatalf("checkpoints: %d steps %v", len(steps), err)
	}
	pid := agentPid(t, s, sb.ID)
	s.kill9()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil { // the sandbox is lost while warren is down
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	s.start()

	nb, err := s.C.ResumeTrajectory(ctx, "rollout-2", false)
	if err != nil {
		t.Fatalf("resume of a lost sandbox: %v\n%s", err, tail(s.logs.String(), 30))
	}
	t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), nb.ID) })
	if nb.ID == sb.ID || nb.Snapshot != steps[20].Checkpoint {
		t.Fatalf("rebuilt sandbox: %+v (checkpoint %s)", nb, steps[20].Checkpoint)
	}
	if r, err := s.C.Mkdir(ctx, nb.ID, api.MkdirRequest{Path: "/state"}); err != nil || !r.Replayed {
		t.Fatalf("replayed mkdir: %+v %v", r, err)
	}
	for i := 1; i <= 20; i++ {
		res, err := s.C.Exec(ctx, nb.ID, counterOp(i))
		if err != nil || !res.Replayed {
			t.Fatalf("replay %d: %+v %v", i, res, err)
		}
	}
	for i := 21; i <= 25; i++ {
		if res, err := s.C.Exec(ctx, nb.ID, counterOp(i)); err != nil || res.Replayed || res.Step != int64(i+1) {
			t.Fatalf("live %d: %+v %v", i, res, err)
		}
	}
	if got := s.sh(t, nb.ID, "wc -l < /counter; ls /state | wc -l").Stdout; got != "25\n25\n" {
		t.Fatalf("rebuilt filesystem: %q", got)
	}
}

func TestTrajectoryRebuildWithoutCheckpointReexecutes(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{Trajectory: "rollout-3"})
	if _, err := s.C.Mkdir(ctx, sb.ID, api.MkdirRequest{Path: "/state"}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		s.C.Exec(ctx, sb.ID, counterOp(i))
	}
	if _, err := s.C.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	nb, err := s.C.ResumeTrajectory(ctx, "rollout-3", false)
	if err != nil {
		t.Fatalf("resume: %v\n%s", err, tail(s.logs.String(), 30))
	}
	t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), nb.ID) })
	// No checkpoint: the logged steps run again on the original state.
	if r, err := s.C.Mkdir(ctx, nb.ID, api.MkdirRequest{Path: "/state"}); err != nil || r.Replayed || r.Step != 1 {
		t.Fatalf("re-executed mkdir: %+v %v", r, err)
	}
	for i := 1; i <= 4; i++ {
		res, err := s.C.Exec(ctx, nb.ID, counterOp(i))
		if err != nil || res.Replayed || res.Step != int64(i+1) || strings.TrimSpace(res.Stdout) != fmt.Sprint(i) {
			t.Fatalf("step %d: %+v %v", i, res, err)
		}
	}
	// Refused operations are not logged: a bad request, a file op the
	// sandbox refuses is (with its error), an op on a stopped sandbox is not.
	if _, err := s.C.Exec(ctx, nb.ID, api.ExecRequest{}); err == nil {
		t.Fatal("empty exec accepted")
	}
	if steps, _ := s.C.TrajectoryAll(ctx, "rollout-3"); len(steps) != 5 {
		t.Fatalf("log has %d steps, want 5 (re-executions are not logged twice)", len(steps))
	}
}

func TestTrajectoryBranchOnDivergence(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{Trajectory: "br", Checkpoint: "2"})
	if _, err := s.C.Mkdir(ctx, sb.ID, api.MkdirRequest{Path: "/state"}); err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 5; i++ { // steps 2..6; checkpoints after steps 2, 4, 6
		if _, err := s.C.Exec(ctx, sb.ID, counterOp(i)); err != nil {
			t.Fatal(err)
		}
	}
	other := api.ExecRequest{Cmd: "echo other > /state/b; wc -l < /counter; ls /state | tr '\\n' ' '"}
	// branch runs the diverging operation on a new sandbox holding the state
	// after the last matching step (checkpoint 4, then step 5 run again).
	branchAt := func(name string) *api.ExecResult {
		t.Helper()
		if _, err := s.C.ResumeTrajectory(ctx, "br", true); err != nil {
			t.Fatal(err)
		}
		if r, err := s.C.Mkdir(ctx, sb.ID, api.MkdirRequest{Path: "/state"}); err != nil || !r.Replayed {
			t.Fatalf("replayed mkdir: %+v %v", r, err)
		}
		for i := 1; i <= 4; i++ {
			if res, err := s.C.Exec(ctx, sb.ID, counterOp(i)); err != nil || !res.Replayed {
				t.Fatalf("replay %d: %+v %v", i, res, err)
			}
		}
		res, err := s.C.ExecStreamFunc(ctx, sb.ID, other, func(api.ExecEvent) error { return nil })
		if err != nil {
			t.Fatalf("branch: %v\n%s", err, tail(s.logs.String(), 20))
		}
		t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), res.Sandbox) })
		if res.Trajectory != name || res.Sandbox == "" || res.Sandbox == sb.ID || res.Step != 6 || res.Replayed {
			t.Fatalf("branch answer: %+v", res)
		}
		return res
	}
	res := branchAt("br~6")
	if got := s.sh(t, res.Sandbox, "wc -l < /counter; ls /state | tr '\\n' ' '").Stdout; got != "4\nb s1 s2 s3 s4 " {
		t.Fatalf("branch filesystem: %q", got)
	}
	// The branch shares the log up to step 5, then has its own steps 6 and
	// 7 (the look at its files above).
	steps, err := s.C.TrajectoryAll(ctx, "br~6")
	if err != nil || len(steps) != 7 || steps[4].Exec.Cmd != counterOp(4).Cmd || steps[5].Exec.Cmd != other.Cmd || steps[5].Sandbox != res.Sandbox {
		for _, st := range steps {
			t.Logf("%d %s %s", st.Step, st.Op, st.Sandbox)
		}
		t.Fatalf("branch log: %d steps %v", len(steps), err)
	}
	// It goes on live.
	if r, err := s.C.Exec(ctx, res.Sandbox, counterOp(9)); err != nil || r.Step != 8 || r.Replayed || r.Sandbox != "" {
		t.Fatalf("branch step 8: %+v %v", r, err)
	}
	// The original is untouched and goes on live too.
	if got := s.sh(t, sb.ID, "wc -l < /counter; ls /state | tr '\\n' ' '").Stdout; got != "5\ns1 s2 s3 s4 s5 " {
		t.Fatalf("original filesystem: %q", got)
	}
	if orig, err := s.C.TrajectoryAll(ctx, "br"); err != nil || len(orig) != 7 {
		t.Fatalf("original log: %d %v", len(orig), err)
	}
	if r, err := s.C.Exec(ctx, sb.ID, counterOp(6)); err != nil || r.Step != 8 || r.Replayed {
		t.Fatalf("original step 8: %+v %v", r, err)
	}
	// A second branch at the same step gets its own name.
	branchAt("br~6.2")

	// Without checkpoints the branch starts from the original state and
	// runs every matching step again (a file write with its data too).
	nb := s.create(t, api.CreateSandboxRequest{Trajectory: "nb"})
	ops := []func() error{
		func() error { _, err := s.C.WriteFileBytes(ctx, nb.ID, "/a", []byte("1\n"), 0o644); return err },
		func() error { _, err := s.C.Exec(ctx, nb.ID, api.ExecRequest{Cmd: "echo 2 >> /a"}); return err },
		func() error { _, err := s.C.Exec(ctx, nb.ID, api.ExecRequest{Cmd: "echo 3 >> /a"}); return err },
	}
	for _, op := range ops {
		if err := op(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.C.ResumeTrajectory(ctx, "nb", true); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops[:2] {
		if err := op(); err != nil {
			t.Fatal(err)
		}
	}
	r, err := s.C.Exec(ctx, nb.ID, api.ExecRequest{Cmd: "echo X >> /a; cat /a"})
	if err != nil || r.Trajectory != "nb~3" || r.Stdout != "1\n2\nX\n" {
		t.Fatalf("branch without checkpoints: %+v %v", r, err)
	}
	t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), r.Sandbox) })
	if got := s.sh(t, nb.ID, "cat /a").Stdout; got != "1\n2\n3\n" {
		t.Fatalf("original: %q", got)
	}
}

func TestTrajectoryReplayDeterminism(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{Trajectory: "rp"})
	if _, err := s.C.WriteFileBytes(ctx, sb.ID, "/a", []byte("hello\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	for _, x := range []api.ExecRequest{
		{Cmd: "cat /a; echo x >> /a"},
		{Cmd: "date +%N; cat /proc/sys/kernel/random/uuid"}, // nondeterministic: step 3
		{Cmd: "wc -c; cat /a", Stdin: "abc"},
	} {
		if _, err := s.C.Exec(ctx, sb.ID, x); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.C.Mkdir(ctx, sb.ID, api.MkdirRequest{Path: "/d"}); err != nil {
		t.Fatal(err)
	}
	if err := s.C.Remove(ctx, sb.ID, "/nope", false); err == nil {
		t.Fatal("removing a missing file succeeded")
	}
	if _, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "ls -l /a | cut -c1-10; ls /d; exit 3"}); err != nil {
		t.Fatal(err)
	}
	rep, err := s.C.ReplayTrajectory(ctx, "rp", false)
	if err != nil {
		t.Fatalf("replay: %v\n%s", err, tail(s.logs.String(), 20))
	}
	if rep.Steps != 7 || rep.Deterministic || len(rep.Differences) != 1 {
		t.Fatalf("replay report: %+v", rep)
	}
	d := rep.Differences[0]
	if d.Step != 3 || d.Op != "exec" || strings.Join(d.Fields, ",") != "stdout" || d.Got.Result == nil || d.Got.Result.Stdout == d.Logged.Result.Stdout {
		t.Fatalf("difference: %+v", d)
	}
	// The replay's sandbox is gone; the trajectory's own is untouched.
	if got, err := s.C.Get(ctx, rep.Sandbox); err == nil && got.State == api.StateRunning {
		t.Fatalf("replay sandbox still running: %+v", got)
	}
	if steps, _ := s.C.TrajectoryAll(ctx, "rp"); len(steps) != 7 {
		t.Fatalf("the replay changed the log: %d steps", len(steps))
	}
	out, err := s.warren(t, "traj", "replay", "rp")
	if err == nil || !strings.Contains(out, "1 of 7 steps differ") || !strings.Contains(out, "date +%N") {
		t.Fatalf("warren traj replay: %v\n%s", err, out)
	}
	if _, err := s.C.ReplayTrajectory(ctx, "no-such", false); err == nil || !strings.Contains(err.Error(), "not_found") {
		t.Fatalf("replay of an unknown trajectory: %v", err)
	}
}

// TestTrajectoryFastForwardMixed fast-forwards through execs (answered by
// the API server from its copy of the log) and file operations (answered by
// the edge), streamed and not, then diverges after a few replayed steps.
func TestTrajectoryFastForwardMixed(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{Trajectory: "ffm"})
	ops := []func() (int64, bool, string, error){
		func() (int64, bool, string, error) {
			r, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo one >> /log; cat /log"})
			if err != nil {
				return 0, false, "", err
			}
			return r.Step, r.Replayed, r.Stdout, nil
		},
		func() (int64, bool, string, error) {
			var out strings.Builder
			r, err := s.C.ExecStreamFunc(ctx, sb.ID, api.ExecRequest{Cmd: "echo two >> /log; cat /log", Stdin: "in"}, func(ev api.ExecEvent) error {
				if ev.Stdout != nil {
					out.WriteString(*ev.Stdout)
				}
				return nil
			})
			if err != nil {
				return 0, false, "", err
			}
			return r.Step, r.Replayed, out.String(), nil
		},
		func() (int64, bool, string, error) {
			r, err := s.C.WriteFileBytes(ctx, sb.ID, "/f", []byte("x"), 0o644)
			if err != nil {
				return 0, false, "", err
			}
			return r.Step, r.Replayed, "", nil
		},
		func() (int64, bool, string, error) {
			r, err := s.C.Mkdir(ctx, sb.ID, api.MkdirRequest{Path: "/d"})
			if err != nil {
				return 0, false, "", err
			}
			return r.Step, r.Replayed, "", nil
		},
		func() (int64, bool, string, error) {
			// Logged with its error; replayed with the same error.
			err := s.C.Remove(ctx, sb.ID, "/nope", false)
			if err == nil || !strings.Contains(err.Error(), "not_found") {
				return 0, false, "", fmt.Errorf("remove of a missing file: %v", err)
			}
			return 5, true, "", nil
		},
		func() (int64, bool, string, error) {
			r, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo three >> /log; cat /log /f; ls -d /d"})
			if err != nil {
				return 0, false, "", err
			}
			return r.Step, r.Replayed, r.Stdout, nil
		},
	}
	var outs []string
	for i, op := range ops {
		step, replayed, out, err := op()
		if err != nil || step != int64(i+1) || (replayed && i != 4) {
			t.Fatalf("live %d: %d %v %v", i, step, replayed, err)
		}
		outs = append(outs, out)
	}
	if _, err := s.C.ResumeTrajectory(ctx, "ffm", false); err != nil {
		t.Fatal(err)
	}
	for i, op := range ops {
		step, replayed, out, err := op()
		if err != nil || step != int64(i+1) || !replayed || out != outs[i] {
			t.Fatalf("replay %d: %d %v %q %v", i, step, replayed, out, err)
		}
	}
	r, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "wc -l < /log"})
	if err != nil || r.Replayed || r.Step != 7 || r.Stdout != "3\n" {
		t.Fatalf("live after the fast-forward: %+v %v", r, err)
	}
	// Diverge after two replayed execs.
	if _, err := s.C.ResumeTrajectory(ctx, "ffm", false); err != nil {
		t.Fatal(err)
	}
	for _, op := range ops[:2] {
		if _, replayed, _, err := op(); err != nil || !replayed {
			t.Fatalf("replay: %v %v", replayed, err)
		}
	}
	_, err = s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo other"})
	var we *warren.APIError
	if !errors.As(err, &we) || we.Status != http.StatusConflict || we.Divergence == nil || we.Divergence.Step != 3 || we.Divergence.Logged.Op != "write" {
		t.Fatalf("divergence: %v %+v", err, we)
	}
	// The log holds each operation once.
	if steps, _ := s.C.TrajectoryAll(ctx, "ffm"); len(steps) != 7 {
		t.Fatalf("log: %d steps", len(steps))
	}
}

// TestTrajectoryReplayMasks: a step whose output carries a timing ("Ran 2
// tests in 0.005s") makes a replay non-deterministic; masks on stdout and
// stderr, and fields to ignore, make it deterministic again, over the API
// and the CLI. Bad masks and unknown fields are a 400.
func TestTrajectoryReplayMasks(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{Trajectory: "mask"})
	for _, x := range []string{
		"echo stable",
		`u=$(tr -dc 0-9 </proc/sys/kernel/random/uuid); echo "Ran 2 tests in 0.${u}s"; echo "took ${u}ns" >&2`,
		"exit $(( RANDOM % 2 + 1 ))", // exit 1 or 2
	} {
		if _, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: x}); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := s.C.ReplayTrajectoryWith(ctx, api.ReplayRequest{Trajectory: "mask"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Deterministic || len(rep.Differences) == 0 || rep.Differences[0].Step != 2 {
		t.Fatalf("unmasked replay: %+v", rep)
	}
	masked := api.ReplayRequest{Trajectory: "mask", Masks: []string{`in [0-9.]+s`, `took \d+ns`}, Ignore: []string{"exit_code", "duration_ms"}}
	// The exit code is random: in 8 replays it differs at least once (but
	// for a chance of 1/256), which ignore must hide.
	for i := 0; i < 8; i++ {
		rep, err = s.C.ReplayTrajectoryWith(ctx, masked)
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Deterministic || len(rep.Differences) != 0 || rep.Steps != 3 {
			t.Fatalf("masked replay: %+v", rep)
		}
	}
	// Masks hide only what they match.
	rep, err = s.C.ReplayTrajectoryWith(ctx, api.ReplayRequest{Trajectory: "mask", Masks: []string{`took \d+ns`}, Ignore: []string{"exit_code"}})
	if err != nil || rep.Deterministic || len(rep.Differences) != 1 || strings.Join(rep.Differences[0].Fields, ",") != "stdout" {
		t.Fatalf("stderr masked only: %+v %v", rep, err)
	}
	out, err := s.warren(t, "traj", "replay", "mask", "--mask", `in [0-9.]+s`, "--mask", `took \d+ns`, "--ignore", "exit_code")
	if err != nil || !strings.Contains(out, "0 of 3 steps differ") {
		t.Fatalf("warren traj replay --mask: %v\n%s", err, out)
	}
	for _, bad := range []api.ReplayRequest{
		{Trajectory: "mask", Masks: []string{"(unclosed"}},
		{Trajectory: "mask", Ignore: []string{"nonsense"}},
	} {
		if _, err := s.C.ReplayTrajectoryWith(ctx, bad); err == nil || !strings.Contains(err.Error(), "bad_request") {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
}
