// Package elastic is a node's elastic CPU: CPU only while work runs
// (docs/architecture.md, "Density and elasticity"). Every operation on a
// sandbox is counted in flight by the lifecycle core (its acquire): the
// first one raises the sandbox's CPU quota to its full cpu before the
// operation is forwarded to the agent (so a command never starts before
// its CPU is there), and the last one to end lowers it to the sandbox's
// idle_cpu budget (SwitchLocked after each change). A background command
// started with keep_cpu holds the full CPU until it ends (Hold, released
// once WaitCommand returns); input to a terminal holds it for a while
// after each keystroke (TypedLocked); always_on sandboxes and FnCall
// workers (reset after every task, so nothing of theirs runs between
// tasks) keep it always. The switch is one write to a cgroup file the
// runtime keeps open (runtime.CPUGate, internal/runtime/cpugate); the
// sandbox's CPU time is sampled at each switch, so what it used during
// operations and between them, and how long its processes were held back
// (harvested), are known (StatsLocked, AddLocked).
//
// idle_cpu 0 freezes the sandbox between operations (its agent too; the
// thaw is part of the raise). The freezer is the one pause uses: a pause
// and a resume run under a hold of the full level (Hold, for the core's
// core.Pausable.HoldCPU), whose release writes the idle level again after
// their thaw, and adoption thaws such a sandbox before it attaches its
// agent.
//
// Admission uses it: a best-effort create that does not fit the node's
// requested CPU still fits when every best-effort sandbox at its idle
// budget counts with it instead of its request (FreedLocked), while the
// host's CPU is not under pressure (Node.Fits).
//
// The lifecycle core (package edge) keeps the sandboxes; each holds its
// CPU and hands itself over as a Sandbox. The package never sees the
// core's records; it needs nothing of the core but a logger and the
// runtime's gates.
//
// # Locks
//
// The package has no lock of its own. A sandbox's CPU is guarded by the
// core's sandbox.mu, which its Sandbox hands over (Lock and Unlock, as
// core.Pausable.PauseLock hands over sandbox.pmu). Every method whose name
// ends in Locked is called with it held; the Sandbox methods it calls then
// take no lock, and the runtime's gate (not safe for concurrent use) is
// called only under it. The core may hold Edge.mu around a Locked call
// (admission's count, the node view): nothing here takes Edge.mu. Hold,
// its release and the timer that lowers the level once typing passed take
// sandbox.mu themselves: the core calls Hold holding none of its locks
// but, for a pause or a resume, sandbox.pmu (which comes before
// sandbox.mu), and releases from a goroutine holding none. WaitCommand and
// Node.Fits take no lock (the core calls Fits under Edge.mu); IdleCPU is
// pure.
package elastic

import (
	"log/slog"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/hoststat"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// Sandbox is a sandbox of the core as its CPU gate sees it. Lock and
// Unlock are the core's sandbox.mu; the other methods are called with it
// held and take no lock.
type Sandbox interface {
	sync.Locker
	// CPU is its CPU state (always the same one).
	CPU() *CPU
	// ID names it in the log.
	ID() string
	// Spec is its spec as recorded now (cpu, idle_cpu, always_on,
	// priority).
	Spec() *api.CreateSandboxRequest
	// Stateless says it is an FnCall worker, which keeps its full CPU.
	Stateless() bool
	// InFlight is how many operations run on it now.
	InFlight() int
}

// CPU is a sandbox's CPU gate and what it measured. The zero value has no
// gate (OpenLocked opens one); it is guarded by the sandbox's lock.
type CPU struct {
	gate       runtime.CPUGate // nil: the runtime has none, or the sandbox is stopping
	full       bool            // the level set now
	hold       int             // background commands (keep_cpu), pauses and resumes holding the full CPU
	lastUsage  int64           // usage and throttled time at the last switch
	lastThrott int64
	activeNs   int64 // CPU time used at the full level (during operations)
	idleNs     int64 // CPU time used at the idle budget
	harvested  int64 // throttled time at the idle budget
	throttled  int64 // throttled time at the full level
	// typedUntil: a terminal (or other live input) had input, so the
	// sandbox counts as running an operation until then; typeTimer
	// lowers the level once it passed.
	typedUntil time.Time
	typeTimer  *time.Timer
}

// Node is the node's elastic CPU: the runtime's gates and the admission's
// fit of best-effort creates. It has no lock of its own.
type Node struct {
	log   *slog.Logger
	gater runtime.CPUGater // nil: the runtime has none
	// capacity is the cores the node offers (after overcommit);
	// maxPressure the host's CPU PSI ("some" avg10, percent) up to which
	// Fits counts idle sandboxes with their budget (negative: no check).
	capacity    float64
	maxPressure float64
	// pressure reads the host's CPU PSI "some" avg10.
	pressure func() (float64, error)
}

// New makes a node's elastic CPU: gater is the runtime's (nil: it has
// none), capacity the cores offered and maxPressure the host's CPU
// pressure up to which Fits counts idle sandboxes with their budget
// (negative: no check).
func New(log *slog.Logger, gater runtime.CPUGater, capacity, maxPressure float64) *Node {
	return &Node{log: log, gater: gater, capacity: capacity, maxPressure: maxPressure, pressure: cpuPressure}
}

// cpuPressure is the host's CPU PSI "some" avg10.
func cpuPressure() (float64, error) {
	p, err := hoststat.ReadPressure("cpu")
	return p.Avg10, err
}

// IdleCPU is the sandbox's budget between operations (records written
// before the field existed get the default).
func IdleCPU(spec *api.CreateSandboxRequest) float64 {
	if spec.IdleCPU == nil {
		return min(sandboxspec.DefaultIdleCPU, spec.CPU)
	}
	return *spec.IdleCPU
}

// wantFullLocked says whether s should have its full CPU now.
func wantFullLocked(s Sandbox) bool {
	c := s.CPU()
	return s.Spec().AlwaysOn || s.Stateless() || s.InFlight() > 0 || c.hold > 0 ||
		time.Now().Before(c.typedUntil)
}

// OpenLocked (re)opens s's CPU gate on its container h with its spec's
// levels and sets the level it should have now. Without the runtime's
// gates it does nothing; a gate that fails to open is logged and s keeps
// none.
func (n *Node) OpenLocked(s Sandbox, h runtime.Handle) {
	if n.gater == nil {
		return
	}
	c := s.CPU()
	if c.gate != nil {
		c.sampleLocked()
		c.CloseLocked() // thawed, should the old level have frozen it
	}
	spec := s.Spec()
	gate, err := n.gater.CPUGate(h, spec.CPU, IdleCPU(spec))
	if err != nil {
		n.log.Warn("cpu gate", "id", s.ID(), "err", err)
		return
	}
	c.gate = gate
	c.full = wantFullLocked(s)
	if err := gate.Set(c.full); err != nil {
		n.log.Warn("cpu gate set", "id", s.ID(), "err", err)
	}
	c.lastUsage, c.lastThrott, _ = gate.Sample()
}

// SwitchLocked sets the level s should have after a change of its
// operations in flight or of its holds.
func (n *Node) SwitchLocked(s Sandbox) {
	c := s.CPU()
	want := wantFullLocked(s)
	if c.gate == nil || want == c.full {
		return
	}
	if err := c.gate.Set(want); err != nil {
		n.log.Warn("cpu gate set", "id", s.ID(), "full", want, "err", err)
		return
	}
	c.sampleLocked()
	c.full = want
}

// TypedLocked counts input to a terminal at now as activity: s has its
// full CPU for d (the core restarts its idle timer).
func (n *Node) TypedLocked(s Sandbox, now time.Time, d time.Duration) {
	c := s.CPU()
	c.typedUntil = now.Add(d)
	if c.typeTimer == nil {
		c.typeTimer = time.AfterFunc(d, func() { n.typingPassed(s) })
	}
	n.SwitchLocked(s)
}

// typingPassed lowers s's level once its last input is old enough (or
// waits on for a later one).
func (n *Node) typingPassed(s Sandbox) {
	s.Lock()
	defer s.Unlock()
	c := s.CPU()
	if d := time.Until(c.typedUntil); d > 0 {
		c.typeTimer.Reset(d)
		return
	}
	c.typeTimer = nil
	n.SwitchLocked(s)
}

// Hold raises s to its full level (a thaw, for an idle level that
// freezes) until release, which lowers it again unless something else
// keeps it: for a background command with keep_cpu (until WaitCommand
// returns), a pause or a resume. Hold and release take s's lock; call
// release once.
func (n *Node) Hold(s Sandbox) (release func()) {
	s.Lock()
	defer s.Unlock()
	s.CPU().hold++
	n.SwitchLocked(s)
	return func() {
		s.Lock()
		defer s.Unlock()
		s.CPU().hold--
		n.SwitchLocked(s)
	}
}
