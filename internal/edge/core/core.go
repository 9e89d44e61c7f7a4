// Package core is the edge's lifecycle core as the edge's other jobs see
// it. The core (package edge) keeps the sandboxes' records, admits work
// against the node's capacity, starts and stops sandboxes, reconciles
// after a crash and reaps expired ones. A job that is not the lifecycle
// (FnCall workers in internal/edge/fncall, warm pools in
// internal/edge/pool, recycled containers in internal/edge/recycle, pause
// in internal/edge/pause, trajectories in internal/edge/trajectory,
// snapshots in internal/edge/snapshot, fork from memory in
// internal/edge/fork, the sandboxes' audit in internal/edge/audit, their
// network-denial logs in internal/edge/netdeny, the cluster's named
// network rules and the sandboxes' egress lists in internal/edge/netrules,
// the sandboxes' elastic CPU in internal/edge/elastic, a file's upload
// over the data plane in internal/edge/upload) is a package written
// against Core or against small interfaces of its own: it never sees the
// edge's records or locks, only the handles the core gives it.
// Trajectories are written against a Host and a Sandbox of their own
// (their Sandbox extends this one) because those name their Traj state:
// here they would import the package that imports this one. Snapshots
// and fork need none of Core's lifecycle calls, only their own Host,
// Sandbox (Source, Child) and stores; so do the audit, the denial logs
// and the network rules (their own Host and Sandbox), the elastic CPU
// (its own Sandbox; a logger and the runtime's gates for a host) and the
// uploads (their own Host, Sandbox and Agent).
//
// # Contract
//
//   - Every Sandbox a job holds came from the core (StartWorker), and only
//     those go back to it (the core's own type is behind each); the job
//     gives it back by Stop or Reclaim, hands it to a create (the warm
//     pools' claim), or Close stops it with the rest.
//   - A sandbox may stop under a job at any time (its agent exits, the
//     node shuts down): Ready then answers false, Agent may answer nil,
//     and a call through its agent fails (AgentError says how).
//   - Go runs a goroutine owned by the edge: Close cancels Context and
//     waits for every one. A job starts no goroutine of its own otherwise
//     (but for the audit's timer that forgets a stopped sandbox's
//     telemetry registration, internal/edge/audit, and an upload's
//     writes, which the upload waits for before it answers,
//     internal/edge/upload).
//
// # Locks
//
// The core's locks (the order is at the top of internal/edge/edge.go) are
// never visible here. A job's own lock comes after the core's map lock
// (Edge.mu) and before a sandbox's lock (sandbox.mu): the core may call a
// job's Reclaimer (and the warm pools' Take) under Edge.mu, and Reclaim
// takes sandbox.mu. Therefore a job calls no Core method while it holds
// its own lock, except Logger, Context, Go, Stop and Reclaim (none takes
// Edge.mu). Two jobs' locks are never held together, but for the audit's,
// the denial logs' and the network rules': those come last instead (the
// core may hold sandbox.mu around them, the trajectories their Traj.mu
// around the audit's Node.mu) and their packages call nothing of the core
// under them; the audit's save lock is the exception (see
// internal/edge/audit). The elastic CPU has no lock of its own: a
// sandbox's elastic.CPU is guarded by the core's sandbox.mu, which its
// elastic.Sandbox hands over as Pausable.PauseLock hands over pmu (see
// internal/edge/elastic). An upload's one lock (its writes' first error,
// internal/edge/upload) is taken under no lock and held over nothing.
package core

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/runtime"
)

// Sandbox is a handle on one sandbox of the core.
type Sandbox interface {
	ID() string
	// Agent is the sandbox's agent; nil when it has none (a container
	// handed on by recycling); once it stopped, calls through it fail.
	Agent() *agentproto.Client
	// Ready reports whether it is running and not stopping.
	Ready() bool
}

// WorkerOptions says what kind of sandbox StartWorker makes.
type WorkerOptions struct {
	// Pool names the job holding the worker (in the node view and the
	// record); it is never "".
	Pool string
	// Stateless makes an FnCall worker: tier fncall, a read-only root with
	// only edgeproto.FnCallDirs writable, counted in the workers' share of
	// the node (Room).
	Stateless bool
	// Spare: the worker is started ahead of demand, so it only takes room
	// that is free (within the workers' share when stateless); it neither
	// reclaims idle workers nor crowds sandboxes out.
	Spare bool
}

// Core is what the lifecycle core offers the edge's other jobs.
type Core interface {
	Logger() *slog.Logger
	// Context is cancelled when the edge closes (the jobs are used only
	// once the edge has started: Start loads the pools, ops follow).
	Context() context.Context
	// Go runs f as one of the edge's own goroutines (Close waits for it);
	// call it from a call in flight or from a goroutine Go started.
	Go(f func())
	// Closing reports whether the edge is shutting down.
	Closing() bool
	// Room reports whether stateless workers may grow by one of spec
	// within their share of the node.
	Room(spec *api.CreateSandboxRequest) bool
	// StartWorker admits a sandbox of spec (a refusal is an *api.Error
	// naming the short resource) and starts it; ctx bounds the wait, not
	// the start, which finishes either way.
	StartWorker(ctx context.Context, spec api.CreateSandboxRequest, o WorkerOptions) (Sandbox, error)
	// Stop stops sb in the background (Go).
	Stop(sb Sandbox, reason string)
	// Reclaim is Stop for an idle worker given up for room: admission
	// stops counting it at once. It does not take Edge.mu.
	Reclaim(sb Sandbox, reason string)
	// BeforeCommand and AfterCommand frame a command run through the
	// agent: AfterCommand explains an end the sandbox caused (OOM kill,
	// pids limit, full disk) in res.
	BeforeCommand(sb Sandbox)
	AfterCommand(sb Sandbox, res *api.ExecResult)
	// AgentError turns an agent call's error into the API's.
	AgentError(sb Sandbox, err error) error
}

// Roots is the core's storage of sandbox roots, for a job that keeps a
// container across sandboxes (internal/edge/recycle). None of its methods
// takes a lock of the core.
type Roots interface {
	// NewID names a new writable layer (or sandbox).
	NewID() string
	// AllocWritable makes the writable layer name with a disk limit of
	// diskMB, and its overlay upper and work directories.
	AllocWritable(name string, diskMB int64) (upper, work string, err error)
	// MountLayers mounts layers (diff ids, top-most first) for holder and
	// returns their directories; FreeLayer(holder) lets them go.
	MountLayers(holder string, layers []string) ([]string, error)
	// FreeLayer frees a writable layer and the layer mounts its name
	// holds ("": none).
	FreeLayer(name string)
	// FreeStorage is FreeLayer(layer) and the removal of the container
	// store's state directory.
	FreeStorage(store, layer string)
}

// Pausable is a sandbox as pausing (internal/edge/pause) sees it: the
// core keeps its record, which pause changes through these methods and
// writes with Persist.
type Pausable interface {
	Sandbox
	// PauseLock serializes the sandbox's pauses and resumes; it is held
	// over each, runtime calls included, and comes before every other
	// lock of the sandbox (the core's sandbox.pmu).
	PauseLock() sync.Locker
	// PauseState is its recorded state; live says it has a container and
	// is not stopping; h is the container's handle and memoryMB its
	// memory limit.
	PauseState() (state string, live bool, h runtime.Handle, memoryMB int64)
	// MarkPaused records it paused (in memory) when it runs and returns
	// its container's handle; already says it was paused; a sandbox that
	// does not run is a conflict (*api.Error).
	MarkPaused() (h runtime.Handle, already bool, err error)
	// SetRunning records it running again (no pause time); active also
	// marks it used now, which starts its idle timeout again.
	SetRunning(active bool)
	// SetPausedAt records when its freeze ended.
	SetPausedAt(t time.Time)
	// Persist writes its record as it is now (not once it is stopping).
	Persist() error
	// HoldCPU gives it its full CPU until release is called: a pause or a
	// resume runs at full speed (a VM's QEMU writes or reads its memory
	// inside the sandbox's cgroup, under its CPU gate).
	HoldCPU() (release func())
}

// Reclaimer is a job holding idle workers that give way to any create:
// admission calls it under Edge.mu (so it takes only its own lock and
// calls only Reclaim and Go of the core).
type Reclaimer interface {
	// Idle lists the spec of every idle worker (one entry each).
	Idle() []*api.CreateSandboxRequest
	// ReclaimIdle takes idle workers one at a time while more() says room
	// is still wanted, calling took with each one's spec, and gives them
	// back to the core (Core.Reclaim) with reason.
	ReclaimIdle(reason string, more func() bool, took func(*api.CreateSandboxRequest))
}

// ShapeKey names the shape of spec: sandboxes of one shape are
// interchangeable (warm pools, FnCall workers). ok is false for specs that
// make each sandbox its own (environment, user, hostname, network, a
// screen).
func ShapeKey(s *api.CreateSandboxRequest) (key string, ok bool) {
	k := fmt.Sprintf("%s|%s|%g|%d|%d|%d|%s", s.Tier, s.Image, s.CPU, s.MemoryMB, s.DiskMB, s.Pids, s.Priority)
	if len(s.Env) > 0 || s.User != "" || s.Hostname != "sandbox" || s.Network != nil || s.Display {
		return "", false
	}
	return k, true
}
