// Package history is a sandbox's command history (GET
// /v1/sandboxes/{id}/commands): its recent commands and how each ended, in
// memory. The edge's core notes every command it runs through the agent
// (exec, live exec) and answers the history and the command count of the
// stats from it.
//
// Lock order: Commands.mu is a leaf (nothing else is locked under it).
package history

import (
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
)

// maxHistoryText bounds the command text a history entry keeps.
const maxHistoryText = 4 << 10

// Commands is a sandbox's recent commands, a ring of the last
// api.MaxCommandHistory, kept in memory only (a restart of the node's
// warren forgets it). Its mutex is a leaf: nothing else is locked under it.
type Commands struct {
	mu    sync.Mutex
	ring  []api.CommandRecord
	next  int   // where the next entry goes once the ring is full
	total int64 // commands since the sandbox started
}

// Note records one command and how it ended (res nil: it did not run, err says why).
func (h *Commands) Note(x *api.ExecRequest, start time.Time, res *api.ExecResult, err error) {
	r := api.CommandRecord{StartedAt: start.UTC(), Session: x.Session, User: x.User, Trusted: x.Trusted}
	if x.Cmd != "" {
		r.Cmd = clipText(x.Cmd, maxHistoryText)
	} else {
		n := 0
		for _, a := range x.Argv {
			if n+len(a) > maxHistoryText {
				r.Argv = append(r.Argv, clipText(a, max(maxHistoryText-n, 0)))
				break
			}
			n += len(a)
			r.Argv = append(r.Argv, a)
		}
	}
	switch {
	case err != nil:
		r.Error = err.Error()
		r.DurationMs = float64(time.Since(start).Microseconds()) / 1000
	case res.CommandID != "":
		r.CommandID = res.CommandID
	default:
		code := res.ExitCode
		r.ExitCode = &code
		r.TimedOut, r.Signal, r.Truncated, r.DurationMs = res.TimedOut, res.Signal, res.Truncated, res.DurationMs
		r.KilledBy, r.OOMKilled, r.PidsLimited, r.DiskFull = res.KilledBy, res.OOMKilled, res.PidsLimited, res.DiskFull
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.total++
	if len(h.ring) < api.MaxCommandHistory {
		h.ring = append(h.ring, r)
		return
	}
	h.ring[h.next] = r
	h.next = (h.next + 1) % len(h.ring)
}

// List returns the recorded commands, oldest first, and how many ran in all.
func (h *Commands) List() ([]api.CommandRecord, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]api.CommandRecord, 0, len(h.ring))
	out = append(out, h.ring[h.next:]...)
	out = append(out, h.ring[:h.next]...)
	return out, h.total
}

func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
