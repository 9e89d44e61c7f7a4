package edge

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

func TestCmdHistoryKeepsTheLastInOrder(t *testing.T) {
	var h cmdHistory
	n := api.MaxCommandHistory + 7
	for i := 0; i < n; i++ {
		h.note(&api.ExecRequest{Cmd: fmt.Sprintf("echo %d", i)}, time.Now(), &api.ExecResult{ExitCode: i % 3, DurationMs: 1}, nil)
	}
	got, total := h.list()
	if total != int64(n) || len(got) != api.MaxCommandHistory {
		t.Fatalf("total %d, kept %d", total, len(got))
	}
	for i, r := range got {
		want := i + 7
		if r.Cmd != fmt.Sprintf("echo %d", want) || r.ExitCode == nil || *r.ExitCode != want%3 {
			t.Fatalf("entry %d: %+v, want echo %d", i, r, want)
		}
	}
}

func TestCmdHistoryEntries(t *testing.T) {
	var h cmdHistory
	long := strings.Repeat("x", 3000)
	h.note(&api.ExecRequest{Argv: []string{"a", long, long, "b"}, Trusted: true}, time.Now(), &api.ExecResult{ExitCode: 137, OOMKilled: true, KilledBy: api.KilledByOOM}, nil)
	h.note(&api.ExecRequest{Cmd: "sleep 9"}, time.Now(), &api.ExecResult{CommandID: "c1"}, nil)
	h.note(&api.ExecRequest{Cmd: strings.Repeat("y", 10000)}, time.Now(), nil, errors.New("sandbox stopped"))
	got, _ := h.list()
	n := 0
	for _, a := range got[0].Argv {
		n += len(a)
	}
	if n > maxHistoryText || got[0].Argv[0] != "a" || !got[0].Trusted || !got[0].OOMKilled || got[0].KilledBy != "oom" {
		t.Fatalf("argv entry: %d bytes, %+v", n, got[0].ExitCode)
	}
	if got[1].CommandID != "c1" || got[1].ExitCode != nil {
		t.Fatalf("background entry %+v", got[1])
	}
	if len(got[2].Cmd) != maxHistoryText || got[2].Error != "sandbox stopped" || got[2].ExitCode != nil {
		t.Fatalf("failed entry: %d bytes, %q", len(got[2].Cmd), got[2].Error)
	}
}

func TestReplayFilter(t *testing.T) {
	step := func(out, errs string, code int) *api.TrajectoryStep {
		return &api.TrajectoryStep{Op: "exec", Result: &api.ExecResult{Stdout: out, Stderr: errs, ExitCode: code}}
	}
	logged := step("Ran 2 tests in 0.005s\nOK\n", "took 17ms", 0)
	got := step("Ran 2 tests in 0.113s\nOK\n", "took 4ms", 1)
	none, err := NewReplayFilter(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Join(none.Differs(logged, got), ","); f != "exit_code,stdout,stderr" {
		t.Fatalf("unmasked: %s", f)
	}
	f, err := NewReplayFilter([]string{`in [0-9.]+s`, `took \d+ms`}, []string{"exit_code", "duration_ms"})
	if err != nil {
		t.Fatal(err)
	}
	if d := f.Differs(logged, got); len(d) != 0 {
		t.Fatalf("masked: %v", d)
	}
	// A mask hides only its matches.
	if d := f.Differs(logged, step("Ran 3 tests in 0.1s\nOK\n", "took 4ms", 0)); strings.Join(d, ",") != "stdout" {
		t.Fatalf("other text: %v", d)
	}
	// An error is a difference unless ignored.
	failed := &api.TrajectoryStep{Op: "exec", Error: &api.Error{Code: api.CodeConflict}}
	if d := f.Differs(logged, failed); strings.Join(d, ",") != "error" {
		t.Fatalf("error: %v", d)
	}
	if f2, _ := NewReplayFilter(nil, []string{"error"}); len(f2.Differs(logged, failed)) != 0 {
		t.Fatal("ignored error still differs")
	}
	for _, bad := range [][2][]string{{{"("}, nil}, {{""}, nil}, {nil, {"stdin"}}, {make([]string, api.MaxReplayMasks+1), nil}} {
		if _, err := NewReplayFilter(bad[0], bad[1]); err == nil {
			t.Errorf("NewReplayFilter(%q, %q) accepted", bad[0], bad[1])
		} else if ae := new(api.Error); !errors.As(err, &ae) || ae.Code != api.CodeBadRequest {
			t.Errorf("NewReplayFilter(%q, %q): %v is not a bad_request", bad[0], bad[1], err)
		}
	}
}
