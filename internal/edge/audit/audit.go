// Package audit is the audit of each sandbox (issue 20): what its
// processes did, collected in the kernel by the node's telemetry
// (internal/telemetry: one set of BPF programs for every sandbox, filtered
// by cgroup) and kept per sandbox in a bounded ring, each record stamped
// with the trajectory step running when it happened (the trajectories set
// the step in the kernel's map around every live operation, Node.Step).
// The core files records of its own beside them: the limits a command hit
// (Node.Limit, Node.Limits) and the network's refusals (Node.Denied). A
// create's audit options (internal/auditpolicy) filter the records and
// may end the running step (the operations of State.Enter) or fail the
// sandbox. A trajectory's sandbox also keeps each step's records with the
// trajectory (Node.Save), so that they outlive it.
//
// The lifecycle core (package edge) keeps each sandbox's State with its
// own record of the sandbox and hands the sandbox over as a Sandbox; what
// the package needs of the core is its Host. It never sees the core's
// records or locks.
//
// # Locks
//
// The core's order is at the top of internal/edge/edge.go.
//
//   - Node.mu (the registered sandboxes and every State's cookie) is
//     taken under none of the core's locks but those before Edge.mu
//     (trajectory.Traj.mu: Step, and a logged operation's create or
//     stop); only telemetry.Collector.mu is taken under it.
//   - A State's ring, step and trusted-window locks are leaves (a pool
//     claim resets the ring under the core's Edge.mu).
//   - A State's save lock is held over one save of a step's records
//     (Save, in a goroutine of the edge's): under it the ring's lock, the
//     trajectory log's append (Host.AppendAudit), Sandbox.Project (the
//     core's sandbox.mu) and Host.Charge. It is taken under no lock.
//
// Stop forgets a sandbox's registration a moment later (what the kernel
// recorded before may still be in its ring buffer) from a timer of the
// package's own, which takes only Node.mu; every other goroutine is the
// edge's (Host.After, and Run, which the core starts).
//
// No Sandbox or Host method is called while Node.mu or a leaf is held.
// Sandbox methods take the core's sandbox.mu, and a record that fires a
// fail-sandbox hook stops the sandbox (Host.Fail): the core files records
// (Add, Limit, Limits, Denied) without holding sandbox.mu.
package audit

import (
	"context"
	"log/slog"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/telemetry"
)

// Sandbox is a sandbox of the core as the audit sees it.
type Sandbox interface {
	// ID is its id now (a pool claim changes it).
	ID() string
	// Project is its project now.
	Project() string
	// Audit is its audit, kept by the core.
	Audit() *State
	// Watched reports whether the telemetry is to record its processes
	// (not for an FnCall worker, nor when its create turned the audit
	// off), and the mount of its first protected layer ("" = none).
	Watched() (watched bool, protected string)
	// Live reports whether it is creating, running or paused and not
	// stopping.
	Live() bool
}

// Host is what the audit needs of the lifecycle core.
type Host interface {
	Logger() *slog.Logger
	// After runs f once d has passed, as one of the edge's goroutines
	// (Close waits for it); once the edge is closing it runs nothing.
	After(d time.Duration, f func())
	// AppendAudit appends b (an edgeproto.AuditEntry) to the audit of
	// trajectory key.
	AppendAudit(ctx context.Context, key string, b []byte) error
	// Charge charges n bytes of trajectory key to project.
	Charge(ctx context.Context, project, key string, n int64)
	// Fail stops sb as failed, for reason, in the background.
	Fail(sb Sandbox, reason string)
}

// sandboxIDs is how many host ids a sandbox's user namespace maps
// (runtime.Handle.IDBase).
const sandboxIDs = 65536

// sessionPlumbing is where the agent keeps the FIFOs and scripts of its
// long-lived shells (confine.FIFODir): a session shell's redirections
// into it, on every command, are not worth a record.
const sessionPlumbing = "/dev/.warren/"

// registered is a sandbox registered with the telemetry: where its
// records go, and the host id its user namespace maps its root to (0: it
// runs as host root).
type registered struct {
	sb     Sandbox
	idBase uint32
}

// Node is the audit of one node: its telemetry (none until Open, or where
// the kernel cannot run it) and the sandboxes registered with it.
type Node struct {
	host Host
	log  *slog.Logger
	rt   runtime.Runtime
	// tel and cg are set once by Open, before the sandboxes start.
	tel *telemetry.Collector
	cg  runtime.CgroupLister

	mu   sync.Mutex
	next uint64                // the last cookie given out
	by   map[uint64]registered // cookie -> sandbox
}

// New returns the audit of the node whose core is h and runtime rt.
func New(h Host, rt runtime.Runtime) *Node {
	return &Node{host: h, log: h.Logger(), rt: rt}
}

// Open loads the node's programs and reports whether it could. Without
// them (no cgroup v2 hierarchy, no BTF, no permission) the node runs, and
// the audit keeps only what the core files.
func (n *Node) Open(opts telemetry.Options) bool {
	cl, ok := n.rt.(runtime.CgroupLister)
	if !ok || cl.UnifiedRoot() == "" {
		// The programs know sandboxes by their cgroup v2 ids.
		n.log.Warn("edge: no cgroup v2 hierarchy: running without telemetry")
		return false
	}
	tel, err := telemetry.Open(n.log, opts)
	if err != nil {
		n.log.Warn("edge: running without telemetry (the audit records nothing)", "err", err)
		return false
	}
	n.tel, n.cg, n.by = tel, cl, map[uint64]registered{}
	return true
}

// Telemetry reports whether the node's programs run (Open).
func (n *Node) Telemetry() bool { return n.tel != nil }

// Run reads what the programs record until ctx ends; the core runs it as
// one of its goroutines once Open succeeded.
func (n *Node) Run(ctx context.Context) {
	if err := n.tel.Run(ctx, n.deliver); err != nil {
		n.log.Error("edge: telemetry stopped", "err", err)
	}
}

// Close detaches the programs (after Run ended).
func (n *Node) Close() {
	if n.tel != nil {
		if err := n.tel.Close(); err != nil {
			n.log.Warn("edge: close telemetry", "err", err)
		}
	}
}

// Start registers the cgroups of sb's container (handle h) with the
// node's telemetry.
func (n *Node) Start(sb Sandbox, h runtime.Handle) {
	if n.tel == nil {
		return
	}
	watched, protected := sb.Watched()
	if !watched {
		// FnCall workers: nobody can read their audit, and their tasks
		// would fill a ring each (up to ~5 MiB of argv).
		return
	}
	dirs := n.cg.UnifiedCgroups(h)
	if len(dirs) == 0 {
		return
	}
	st := sb.Audit()
	n.mu.Lock()
	defer n.mu.Unlock()
	if st.cookie != 0 {
		n.tel.Remove(st.cookie)
		delete(n.by, st.cookie)
	}
	n.next++
	cookie := n.next
	// UnifiedCgroups lists children first: the last is the agent's.
	last := len(dirs) - 1
	if err := n.tel.AddSandbox(cookie, dirs[last], dirs[:last]...); err != nil {
		n.log.Warn("edge: register a sandbox with telemetry", "sandbox", h.ID, "err", err)
		st.cookie = 0
		return
	}
	st.cookie = cookie
	n.by[cookie] = registered{sb: sb, idBase: h.IDBase}
	if protected != "" {
		// Opens for reading under it are recorded too (the first
		// protected mount only: the programs keep one per sandbox).
		if err := n.tel.Protect(cookie, path.Clean(protected)); err != nil {
			n.log.Warn("edge: audit reads of a protected layer", "sandbox", h.ID, "err", err)
		}
	}
}

// Stop unregisters the cgroups of the sandbox whose audit is st (its
// container stops or serves another sandbox).
func (n *Node) Stop(st *State) {
	if n.tel == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if st.cookie == 0 {
		return
	}
	cookie := st.cookie
	n.tel.Remove(cookie)
	st.cookie = 0
	// What the kernel recorded before the removal may still be in the
	// ring: it reaches the sandbox until the reader drained it.
	time.AfterFunc(4*telemetry.DrainEvery, func() {
		n.mu.Lock()
		delete(n.by, cookie)
		n.mu.Unlock()
	})
}

// Step stamps what the processes of the sandbox whose audit is st do
// from now on with step (0 = between steps).
func (n *Node) Step(st *State, step int64) {
	st.stepNow.Store(step)
	if n.tel == nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if st.cookie != 0 {
		n.tel.SetStep(st.cookie, step)
	}
}

// deliver files what the programs recorded in its sandbox's audit.
func (n *Node) deliver(r telemetry.Record) {
	if r.Kind == telemetry.KindFile && strings.HasPrefix(r.Path, sessionPlumbing) {
		return
	}
	n.mu.Lock()
	a, ok := n.by[r.Cookie]
	n.mu.Unlock()
	if !ok {
		return // its sandbox stopped meanwhile
	}
	if r.Beside && a.sb.Audit().trusted.covers(r.Time) {
		return // a trusted command's own work
	}
	n.Add(a.sb, fromKernel(&r, a.idBase))
}
