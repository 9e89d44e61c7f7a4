package edge

import (
	"context"
	"fmt"
	"time"

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
// Lock order: Edge.mu, then sandbox.mu.

// fnShare is the part of the node's cpu, memory and sandbox slots that
// FnCall workers may grow into on demand.
const fnShare = 0.5

// fnIdleFor is how long a shape's surplus idle workers (beyond fnMinIdle)
// stay once no task needed a new worker, and how long all of them stay
// once no task came at all.
const fnIdleFor = 30 * time.Second

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
	// budget beyond that budget (elastic.go).
	freed float64
}

func (e *Edge) usageLocked() usage {
	var u usage
	for sb := range e.live {
		sb.mu.Lock()
		s := sb.rec.Sandbox.State
		live := (s == api.StateRunning || s == api.StateCreating || s == api.StatePaused) && !sb.reclaimed
		cpu, mem, disk, fn := sb.rec.Spec.CPU, sb.rec.Spec.MemoryMB, sb.rec.Spec.DiskMB, sb.stateless
		freed := freedCPULocked(sb)
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
	case e.cfg.CPUCapacity > 0 && u.cpu+spec.CPU > e.cfg.CPUCapacity+1e-9 && !e.elasticFits(u, spec):
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

// reclaimLocked stops idle FnCall workers until spec fits in u (updated),
// if stopping all of them would make it fit; it reports whether it fits.
func (e *Edge) reclaimLocked(u *usage, spec *api.CreateSandboxRequest) bool {
	if e.closing {
		return false
	}
	all := *u
	for _, sh := range e.fn {
		all.drop(&sh.spec, len(sh.idle))
	}
	if e.shortLocked(all, spec) != nil {
		return false
	}
	for _, sh := range e.fn {
		for e.shortLocked(*u, spec) != nil {
			w := takeIdle(sh)
			if w == nil {
				break
			}
			e.reclaimWorkerLocked(sh, w, "reclaimed for a sandbox")
			u.drop(&sh.spec, 1)
		}
	}
	return e.shortLocked(*u, spec) == nil
}

// drop takes k sandboxes of spec out of u.
func (u *usage) drop(spec *api.CreateSandboxRequest, k int) {
	u.n -= k
	u.cpu -= float64(k) * spec.CPU
	u.mem -= int64(k) * spec.MemoryMB
	u.disk -= int64(k) * spec.DiskMB
}

// takeIdle takes an idle worker off sh's queue without waiting; nil when
// none is idle.
func takeIdle(sh *fnShape) *sandbox {
	select {
	case w := <-sh.idle:
		return w
	default:
		return nil
	}
}

// reclaimWorkerLocked stops an idle worker taken off its shape's queue;
// admission stops counting it at once.
func (e *Edge) reclaimWorkerLocked(sh *fnShape, w *sandbox, reason string) {
	w.mu.Lock()
	w.reclaimed = true
	w.mu.Unlock()
	sh.total--
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.stop(context.Background(), w, api.StateStopped, reason)
	}()
}

// fnRoomLocked reports whether FnCall workers may grow by one of spec
// within their share of the node.
func (e *Edge) fnRoomLocked(spec *api.CreateSandboxRequest) bool {
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

// fnShrink stops idle FnCall workers nobody needs: a shape's surplus over
// fnMinIdle once no task has needed a new worker for fnIdleFor, all of
// them once no task came for fnIdleFor or while the host is under pressure.
func (e *Edge) fnShrink(now time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return
	}
	pressed := e.pressureErr != nil
	for _, sh := range e.fn {
		keep := len(sh.idle)
		switch {
		case pressed || now.Sub(sh.lastUsed) > fnIdleFor:
			keep = 0
		case now.Sub(sh.lastGrown) > fnIdleFor:
			keep = min(keep, fnMinIdle)
		}
		for len(sh.idle) > keep {
			w := takeIdle(sh)
			if w == nil {
				break
			}
			e.reclaimWorkerLocked(sh, w, "fncall worker idle")
		}
	}
}
