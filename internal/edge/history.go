package edge

import (
	"context"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
)

// maxHistoryText bounds the command text a history entry keeps.
const maxHistoryText = 4 << 10

// cmdHistory is a sandbox's recent commands, a ring of the last
// api.MaxCommandHistory, kept in memory only (a restart of the node's
// warren forgets it). Its mutex is a leaf: nothing else is locked under it.
type cmdHistory struct {
	mu    sync.Mutex
	ring  []api.CommandRecord
	next  int   // where the next entry goes once the ring is full
	total int64 // commands since the sandbox started
}

// note records one command and how it ended (res nil: it did not run, err says why).
func (h *cmdHistory) note(x *api.ExecRequest, start time.Time, res *api.ExecResult, err error) {
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

// list returns the recorded commands, oldest first, and how many ran in all.
func (h *cmdHistory) list() ([]api.CommandRecord, int64) {
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

// commands answers OpCommands: the sandbox's recent command history.
func (e *Edge) commands(id string) (*api.CommandHistory, error) {
	sb, err := e.lookup(id)
	if err != nil {
		return nil, err
	}
	cmds, _ := sb.hist.list()
	return &api.CommandHistory{Commands: cmds}, nil
}

// stats answers OpStats: what the sandbox uses now, beside its limits. A
// sandbox that is not running (or a runtime that cannot measure one)
// reports zero use.
func (e *Edge) stats(ctx context.Context, id string) (*api.SandboxStats, error) {
	sb, err := e.lookup(id)
	if err != nil {
		return nil, err
	}
	sb.mu.Lock()
	v := sb.rec.Sandbox
	var h *runtime.Handle
	if sb.inst != nil && (v.State == api.StateRunning || v.State == api.StatePaused) {
		hh := sb.inst.Handle
		h = &hh
	}
	base := sb.rec.CPUBase
	sb.mu.Unlock()
	_, n := sb.hist.list()
	st := &api.SandboxStats{ID: v.ID, State: v.State, CPU: v.CPU, MemoryLimitMB: v.MemoryMB, Commands: n}
	if ur, ok := e.cfg.Runtime.(runtime.SandboxUsageReporter); ok && h != nil {
		u, err := ur.SandboxUsage(*h)
		if err != nil {
			return nil, &api.Error{Code: api.CodeConflict, Message: "sandbox " + id + " cannot be measured now: " + err.Error()}
		}
		st.CPUSeconds, st.MemoryBytes = max(u.CPUSeconds-base, 0), u.MemoryBytes
	}
	return st, nil
}

// cpuBaseline is the CPU time the container of a sandbox has used before
// the sandbox got it: a recycled container's earlier sandboxes are not
// this one's (and not its business).
func (e *Edge) cpuBaseline(rec *record, h runtime.Handle) float64 {
	if rec.Layer == "" {
		return 0 // a container of its own
	}
	ur, ok := e.cfg.Runtime.(runtime.SandboxUsageReporter)
	if !ok {
		return 0
	}
	u, err := ur.SandboxUsage(h)
	if err != nil {
		return 0
	}
	return u.CPUSeconds
}
