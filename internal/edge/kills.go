package edge

import (
	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
)

// A command that did not exit by itself says what ended it: the OOM killer
// (the sandbox's memory cgroup counted a kill while the command ran and it,
// or the child a shell reports as 137, died of SIGKILL), its timeout, or another signal; and whether the pids
// limit refused a fork meanwhile. The counters are read once before a
// sandbox's first command and after each one that failed (explainEnd): a
// refusal or kill of a background process between commands, or a refusal
// that a successful command survived, is reported with the next command
// that fails.
// A command that failed while the sandbox's writable layer is at its disk
// limit says disk_full.

// killsBefore reads the counters before sb's first command.
func (e *Edge) killsBefore(sb *sandbox) {
	kc, ok := e.cfg.Runtime.(runtime.KillCounter)
	if !ok {
		return
	}
	sb.mu.Lock()
	read, inst := sb.killsRead, sb.inst
	sb.mu.Unlock()
	if read || inst == nil {
		return
	}
	oom, oerr := kc.OOMKills(inst.Handle)
	pids, perr := kc.PidsRefused(inst.Handle)
	sb.mu.Lock()
	if !sb.killsRead && oerr == nil && perr == nil {
		sb.oomSeen, sb.pidsSeen, sb.killsRead = oom, pids, true
	}
	sb.mu.Unlock()
}

// diskUsage is implemented by writable layers that can tell how much of its
// limit a sandbox's writable layer uses (internal/scratch).
type diskUsage interface {
	Limited() bool
	Usage(id string) (int64, error)
}

// diskFullSlack is how close to its limit a writable layer counts as full
// (the filesystem's own blocks for a file's metadata round usage).
const diskFullSlack = 1 << 20

// diskFull reports whether a failed command's sandbox has its disk quota
// used up.
func (e *Edge) diskFull(sb *sandbox) bool {
	du, ok := e.cfg.Writable.(diskUsage)
	sb.mu.Lock()
	limit, layer := sb.rec.Spec.DiskMB<<20, sb.rec.layer()
	sb.mu.Unlock()
	if !ok || limit <= 0 || !du.Limited() {
		return false
	}
	n, err := du.Usage(layer)
	return err == nil && n+diskFullSlack >= limit
}

// explainEnd fills in r's OOMKilled, KilledBy, PidsLimited and DiskFull.
func (e *Edge) explainEnd(sb *sandbox, r *api.ExecResult) {
	if r.ExitCode != 0 && !r.TimedOut {
		r.DiskFull = e.diskFull(sb)
	}
	switch {
	case r.TimedOut:
		r.KilledBy = api.KilledByTimeout
	case r.Signal != "":
		r.KilledBy = api.KilledBySignal
	}
	kc, ok := e.cfg.Runtime.(runtime.KillCounter)
	if !ok {
		return
	}
	sb.mu.Lock()
	read, inst := sb.killsRead, sb.inst
	sb.mu.Unlock()
	if !read || inst == nil {
		return
	}
	// Killed by SIGKILL: itself, or a child whose status a shell passed on
	// (128+9).
	sigkill := (r.Signal == "SIGKILL" || (r.Signal == "" && r.ExitCode == 137)) && !r.TimedOut
	// The counters are read for a command that failed only: reading them
	// (two cgroup files on v1) was two thirds of the edge's CPU for an
	// exec of `true`. A refusal that a command survived (a shell retries
	// a fork) is thus reported with the next command that fails.
	if r.ExitCode == 0 && r.Signal == "" && !r.TimedOut {
		return
	}
	pids, perr := kc.PidsRefused(inst.Handle)
	var oom int64
	oerr := perr
	if sigkill {
		oom, oerr = kc.OOMKills(inst.Handle)
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if perr == nil {
		r.PidsLimited = pids > sb.pidsSeen
		sb.pidsSeen = max(sb.pidsSeen, pids)
	}
	if oerr == nil && sigkill {
		if oom > sb.oomSeen {
			r.OOMKilled, r.KilledBy = true, api.KilledByOOM
		}
		sb.oomSeen = max(sb.oomSeen, oom)
	}
}
