package history

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

func TestCmdHistoryKeepsTheLastInOrder(t *testing.T) {
	var h Commands
	n := api.MaxCommandHistory + 7
	for i := 0; i < n; i++ {
		h.Note(&api.ExecRequest{Cmd: fmt.Sprintf("echo %d", i)}, time.Now(), &api.ExecResult{ExitCode: i % 3, DurationMs: 1}, nil)
	}
	got, total := h.List()
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
	var h Commands
	long := strings.Repeat("x", 3000)
	h.Note(&api.ExecRequest{Argv: []string{"a", long, long, "b"}, Trusted: true}, time.Now(), &api.ExecResult{ExitCode: 137, OOMKilled: true, KilledBy: api.KilledByOOM}, nil)
	h.Note(&api.ExecRequest{Cmd: "sleep 9"}, time.Now(), &api.ExecResult{CommandID: "c1"}, nil)
	h.Note(&api.ExecRequest{Cmd: strings.Repeat("y", 10000)}, time.Now(), nil, errors.New("sandbox stopped"))
	got, _ := h.List()
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
