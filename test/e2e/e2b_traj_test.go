package e2e

import (
	"context"
	"strings"
	"testing"
)

// TestE2BTrajectory drives warren's trajectories from an E2B harness:
// metadata "warren/trajectory" makes the sandbox record into that log, a
// non-idempotent command run through envd is logged, and a create with
// "warren/resume" re-attaches to the trajectory: the same command answers
// the logged result at once instead of running again.
func TestE2BTrajectory(t *testing.T) {
	parallel(t)
	e2bAddr := freePort(t)
	s := startServer(t, "--e2b-listen", e2bAddr)
	base := "http://" + e2bAddr
	a := &e2bClient{base: base, key: s.Token}
	t.Cleanup(func() { _ = s.C.DeleteTrajectory(context.Background(), "", "e2b-run-1") }) // after the sandbox
	e := a.createEnvd(t, "create with a trajectory", `{"templateID":"busybox","metadata":{"warren/trajectory":"e2b-run-1","task":"7"}}`, s.C)
	first := e.id
	got, err := s.C.Get(context.Background(), first)
	if err != nil || got.Trajectory != "e2b-run-1" || got.Labels["task"] != "7" {
		t.Fatalf("the sandbox: %+v %v (want trajectory e2b-run-1 and label task=7)", got, err)
	}
	var detail struct {
		Metadata map[string]string `json:"metadata"`
	}
	a.do(t, "GET", "/sandboxes/"+first, "").decode(t, &detail)
	if detail.Metadata["warren/trajectory"] != "e2b-run-1" || detail.Metadata["task"] != "7" {
		t.Fatalf("metadata %v: want the trajectory and task", detail.Metadata)
	}

	run := func(e *envdClient) string {
		st := e.stream(t, "Start", `{"process":{"cmd":"/bin/sh","args":["-c","echo x >> /counter; wc -l < /counter"]},"stdin":false}`, nil)
		st.event(t) // start
		out, _, end := st.rest(t)
		if end["exitCode"] != nil && end["exitCode"] != float64(0) {
			t.Fatalf("command ended %v", end)
		}
		return strings.TrimSpace(out)
	}
	if n := run(e); n != "1" {
		t.Fatalf("first run counted %q, want 1", n)
	}
	if n := run(e); n != "2" {
		t.Fatalf("second run counted %q, want 2", n)
	}

	// The harness restarts: it resumes the trajectory and runs its steps
	// again; the logged answers come back, nothing runs twice.
	e = a.createEnvd(t, "resume", `{"templateID":"busybox","metadata":{"warren/trajectory":"e2b-run-1","warren/resume":"true"}}`, s.C)
	if e.id != first {
		t.Fatalf("resume answered sandbox %s, want the live %s", e.id, first)
	}
	if n := run(e); n != "1" {
		t.Fatalf("fast-forward of step 1 answered %q, want the logged 1", n)
	}
	if n := run(e); n != "2" {
		t.Fatalf("fast-forward of step 2 answered %q, want the logged 2", n)
	}
	if n := run(e); n != "3" {
		t.Fatalf("the first live step after the log counted %q, want 3 (the command did not run again)", n)
	}
	// warren/resume without a trajectory is a 400.
	a.do(t, "POST", "/v2/sandboxes", `{"templateID":"busybox","metadata":{"warren/resume":"true"}}`).wantStatus(t, "resume without a trajectory", 400)
}
