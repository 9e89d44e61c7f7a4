package edge

import (
	"errors"
	"sync"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
)

// The latency class holds (docs/architecture.md, "Density and
// elasticity"): best-effort sandboxes yield to latency-class ones through
// their weight, cpu.idle and SCHED_IDLE, but on a host without core
// scheduling their spinning processes may still slow a latency-class
// command down (the interference figure, docs/BENCHMARKS.md). So while any
// latency-class sandbox runs an operation, the best-effort class as a
// whole (its parent cgroup, runtime.ClassCapper) is capped at
// Config.BestEffortCap cores, and the cap is released when the last
// latency-class operation ends: one quota write each way, on a file kept
// open. The cap needs the cpu controller on cgroup v2: on v1 the runtime
// answers container.ErrClassCapV1 and the class is left uncapped.
// Best-effort operations and nodes without latency-class sandboxes pay
// nothing.
//
// classCap.mu is a leaf: it is taken under sandbox.mu (acquire) and
// nothing is locked under it.

// classCap is the edge's cap of the best-effort class.
type classCap struct {
	mu   sync.Mutex
	ops  int             // latency-class operations in flight
	gate runtime.CPUGate // nil until a best-effort class exists
	// off: the runtime cannot cap the class (cgroup v1, no cpu
	// controller, a default tier without a class), logged once.
	off bool
	// caps and releases count the writes (node view).
	caps, releases int64
}

// latencyOp reports whether an operation on sb counts for the class cap.
func (e *Edge) latencyOp(sb *sandbox) bool {
	return e.cfg.BestEffortCap > 0 && sb.rec.Spec.Priority == api.PriorityLatency
}

// classBegin counts a latency-class operation in; the first caps the
// best-effort class.
func (e *Edge) classBegin() {
	c := &e.class
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops++
	if c.ops != 1 || !e.classOpenLocked() {
		return
	}
	if err := c.gate.Set(false); err != nil {
		e.log.Warn("best-effort class cap", "err", err)
		return
	}
	c.caps++
}

// classEnd counts a latency-class operation out; the last releases the
// cap.
func (e *Edge) classEnd() {
	c := &e.class
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ops--
	if c.ops != 0 || c.gate == nil {
		return
	}
	if err := c.gate.Set(true); err != nil {
		e.log.Warn("best-effort class release", "err", err)
		return
	}
	c.releases++
}

// classOpenLocked opens the class's gate when the runtime has a
// best-effort class (created with its first best-effort sandbox).
func (e *Edge) classOpenLocked() bool {
	c := &e.class
	if c.gate != nil {
		return true
	}
	cc, ok := e.cfg.Runtime.(runtime.ClassCapper)
	if !ok || c.off {
		return false
	}
	g, err := cc.ClassCap(e.cfg.BestEffortCap)
	if errors.Is(err, runtime.ErrGone) {
		return false // no best-effort sandbox yet: nothing to cap
	}
	if err != nil {
		c.off = true
		e.log.Info("edge: the best-effort class is not capped on this node", "err", err)
		return false
	}
	c.gate = g
	return true
}

// classReset releases a cap left by an earlier edge process (a crash
// while a latency-class operation ran) and, at Close, closes the gate.
func (e *Edge) classReset(closing bool) {
	c := &e.class
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gate == nil {
		if closing {
			return
		}
		if cc, ok := e.cfg.Runtime.(runtime.ClassCapper); ok {
			// Any cap of an earlier process goes, whatever this one's
			// BestEffortCap.
			if g, err := cc.ClassCap(max(e.cfg.BestEffortCap, 0.01)); err == nil {
				c.gate = g
			}
		}
		if c.gate == nil {
			return
		}
	}
	if err := c.gate.Set(true); err != nil {
		e.log.Warn("best-effort class release", "err", err)
	}
	if closing {
		_ = c.gate.Close()
		c.gate = nil
	}
}

// classNode adds the class cap's counts to the node's elastic view.
func (e *Edge) classNode(n *api.NodeElastic) {
	c := &e.class
	c.mu.Lock()
	defer c.mu.Unlock()
	n.ClassCaps, n.ClassReleases = c.caps, c.releases
	n.ClassCapped = c.ops > 0 && c.gate != nil
}
