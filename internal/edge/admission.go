package edge

import (
	"fmt"

	"github.com/warrenhq/warren/api"
)

// Admission: the node's final say on new work. Live sandboxes hold what
// they requested; idle FnCall workers hold theirs only until something else
// needs it: they are reclaimable, and a create that would not fit without
// them stops as many as it needs (idle workers of the fewest-needed shapes
// first does not matter: every idle worker is equally cheap to restart).
// FnCall workers together grow to at most fnShare of the node; past that a
// task waits for a worker of its shape, so a burst of tasks leaves sandboxes
// room. Every refusal names the short resource (api.Error.Reason).
//
// Idle workers are internal/edge/fncall's; admission reaches them through
// core.Reclaimer (e.fn), which also stops surplus ones (Shrink, from the
// reaper).
//
// Lock order: Edge.mu, then fncall's Workers.mu, then sandbox.mu.

// fnShare is the part of the node's cpu, memory and sandbox slots that
// FnCall workers may grow into on demand.
const fnShare = 0.5

// usage is what live sandboxes hold on the node.
type usage struct {
	n    int
	cpu  float64
	mem  int64
	disk int64
	// fn* is the part held by FnCall workers (busy and idle).
	fnN   int
	fnCPU float64
	fnMem int64
	// freed is the requested cpu of best-effort sandboxes at their idle
	// budget beyond that budget (internal/edge/elastic).
	freed float64
}

func (e *Edge) usageLocked() usage {
	var u usage
	for sb := range e.live {
		sb.mu.Lock()
		s := sb.rec.Sandbox.State
		live := (s == api.StateRunning || s == api.StateCreating || s == api.StatePaused) && !sb.reclaimed
		cpu, mem, disk, fn := sb.rec.Spec.CPU, sb.rec.Spec.MemoryMB, sb.rec.Spec.DiskMB, sb.stateless
		freed := sb.cpu.FreedLocked(&sb.rec.Spec)
		sb.mu.Unlock()
		if !live {
			continue
		}
		u.n++
		u.cpu += cpu
		u.mem += mem
		u.freed += freed
		u.disk += disk
		if fn {
			u.fnN++
			u.fnCPU += cpu
			u.fnMem += mem
		}
	}
	return u
}

// shortLocked says which resource u lacks for spec (nil: it fits).
func (e *Edge) shortLocked(u usage, spec *api.CreateSandboxRequest) *api.Error {
	switch {
	case u.n+1 > e.cfg.MaxSandboxes:
		return &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonSandboxes,
			Message: fmt.Sprintf("node %s is full: %d of %d sandboxes", e.cfg.Node, u.n, e.cfg.MaxSandboxes)}
	case e.cfg.CPUCapacity > 0 && u.cpu+spec.CPU > e.cfg.CPUCapacity+1e-9 && !e.elastic.Fits(u.cpu, u.freed, spec):
		return &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonCPU,
			Message: fmt.Sprintf("node %s is full: not enough cpu: %.2f of %g cores requested, %g more asked", e.cfg.Node, u.cpu, e.cfg.CPUCapacity, spec.CPU)}
	case e.cfg.MemoryMB > 0 && u.mem+spec.MemoryMB > e.cfg.MemoryMB:
		return &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonMemory,
			Message: fmt.Sprintf("node %s is full: not enough memory: %d of %d MiB requested, %d more asked", e.cfg.Node, u.mem, e.cfg.MemoryMB, spec.MemoryMB)}
	case e.cfg.DiskMB > 0 && u.disk+spec.DiskMB > e.cfg.DiskMB:
		return &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonDisk,
			Message: fmt.Sprintf("node %s is full: not enough disk: %d of %d MiB requested, %d more asked", e.cfg.Node, u.disk, e.cfg.DiskMB, spec.DiskMB)}
	}
	return nil
}

// admitLocked refuses work beyond capacity, after reclaiming idle FnCall
// workers if that makes room.
func (e *Edge) admitLocked(spec *api.CreateSandboxRequest) *api.Error {
	u := e.usageLocked()
	if aerr := e.shortLocked(u, spec); aerr != nil {
		if !e.reclaimLocked(&u, spec) {
			return aerr
		}
	}
	return e.pressure()
}

// reclaimLocked stops idle FnCall workers (internal/edge/fncall, through
// core.Reclaimer) until spec fits in u (updated), if stopping all of them
// would make it fit; it reports whether it fits.
func (e *Edge) reclaimLocked(u *usage, spec *api.CreateSandboxRequest) bool {
	if e.closing {
		return false
	}
	all := *u
	for _, s := range e.fn.Idle() {
		all.drop(s, 1)
	}
	if e.shortLocked(all, spec) != nil {
		return false
	}
	e.fn.ReclaimIdle("reclaimed for a sandbox",
		func() bool { return e.shortLocked(*u, spec) != nil },
		func(s *api.CreateSandboxRequest) { u.drop(s, 1) })
	return e.shortLocked(*u, spec) == nil
}

// drop takes k sandboxes of spec out of u.
func (u *usage) drop(spec *api.CreateSandboxRequest, k int) {
	u.n -= k
	u.cpu -= float64(k) * spec.CPU
	u.mem -= int64(k) * spec.MemoryMB
	u.disk -= int64(k) * spec.DiskMB
}

// workerRoomLocked reports whether FnCall workers may grow by one of spec
// within their share of the node.
func (e *Edge) workerRoomLocked(spec *api.CreateSandboxRequest) bool {
	u := e.usageLocked()
	switch {
	case float64(u.fnN+1) > fnShare*float64(e.cfg.MaxSandboxes):
		return false
	case e.cfg.CPUCapacity > 0 && u.fnCPU+spec.CPU > fnShare*e.cfg.CPUCapacity+1e-9:
		return false
	case e.cfg.MemoryMB > 0 && float64(u.fnMem+spec.MemoryMB) > fnShare*float64(e.cfg.MemoryMB):
		return false
	}
	return true
}
