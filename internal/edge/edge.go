// Package edge is the only part of warren that touches a node: it admits
// sandboxes against real capacity, builds their roots from layers, starts
// them through a runtime, reaps expired ones, and reconciles after a crash.
// It owns the truth about its sandboxes and persists enough (one JSON record
// per sandbox) to adopt live sandboxes again after a kill -9.
package edge

// Lock order of the edge (outermost first; a lock is only taken while
// holding locks that come before it in this list):
//
//  1. trajectory.Traj.mu (internal/edge/trajectory, one per sandbox that
//     records a trajectory): held over one whole logged operation, which
//     may snapshot, branch (create) or stop a sandbox;
//  2. sandbox.snap (one snapshot at a time: snapshot.State, in
//     internal/edge/snapshot) or sandbox.pmu (pause and
//     resume, internal/edge/pause: core.Pausable.PauseLock): never both,
//     and each is held over runtime calls (freeze);
//  3. sandbox.wmu: one write of a sandbox's record (persistSandbox),
//     taken under pmu by pause and resume, never under Edge.mu;
//     3a. audit.State's save lock (internal/edge/audit: one save of a
//     step's records with the trajectory, audit.Node.Save): taken under
//     no lock; sandbox.mu (the project charged) and leaves under it;
//  4. Edge.mu: the edge's maps (sandboxes, live);
//     4a. the jobs' own locks, each taken under Edge.mu and never
//     around it (internal/edge/core): fncall.Workers.mu (the FnCall
//     workers by shape; admission reclaims idle ones, core.Reclaimer)
//     and pool.Pools.mu (the warm pools; create claims a member,
//     claimLocked); never one under the other;
//  5. sandbox.mu: one sandbox's record and state (taken under Edge.mu by
//     admission, the reaper, pool claims and the node view; Edge.mu is
//     never taken under it); it also guards the sandbox's elastic.CPU
//     (internal/edge/elastic, the elastic CPU, which has no lock of its
//     own: its Locked calls run under sandbox.mu, its Hold and typing
//     timer take it, under no lock or only pmu);
//  6. leaves, under which nothing else is locked: Edge.spareMu,
//     classCap.mu (taken under sandbox.mu by acquire),
//     Edge.usageMu, uploads.mu (a layer's uploads, layers.go),
//     history.Commands.mu, audit.State's ring, step and trusted-window
//     locks (internal/edge/audit; a pool claim resets the ring under
//     Edge.mu), netdeny.Log.mu (internal/edge/netdeny,
//     the denial logs; taken under Edge.mu and sandbox.mu when a sandbox is
//     dropped), recycle.Shelf.mu (the recycled containers; taken under no
//     lock), audit.Node.mu (the sandboxes registered with the node's
//     telemetry; under Traj.mu; it takes only telemetry.Collector.mu, see
//     internal/edge/audit), netrules.Rules.mu (internal/edge/netrules,
//     the cluster's named network rules; taken under no lock, or under
//     sandbox.mu when a changed rule is applied again to a sandbox's list;
//     never with Edge.mu), and the lock of an upload's writes
//     (internal/edge/upload: the first that failed; taken under no lock).
//
// Goroutines of the edge (Close waits for every one; see Close and drain):
//
//   - Edge.calls: the bus calls in flight (bus.Conn.ServeOwned starts each
//     through it); the data listener's calls are its own Server's (a
//     file upload's writes are its call's, waited for before it answers:
//     internal/edge/upload). Close refuses new calls, lets these finish
//     until the drain deadline, then cancels them (callCtx) and waits.
//   - Edge.wg: the edge's own goroutines (the heartbeat, reaper, denial
//     and roster loops, the network rules' watch, the data listener,
//     background stops and pauses, telemetry and the audit's step saves
//     (audit.Host.After), and what the job packages
//     start through core.Core.Go: pool fillers, FnCall workers starting
//     and resetting). Started with wg.Go, or wg.Add(1) by a goroutine
//     already counted or by a call in flight (which Close drains first).
//     Close cancels runCtx and waits.
//   - Edge.watches: one per sandbox watching its agent's channel; they end
//     with their sandboxes, so Close waits for them after stopping those.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/edge/audit"
	"github.com/warrenhq/warren/internal/edge/elastic"
	"github.com/warrenhq/warren/internal/edge/fncall"
	"github.com/warrenhq/warren/internal/edge/fork"
	"github.com/warrenhq/warren/internal/edge/netdeny"
	"github.com/warrenhq/warren/internal/edge/netrules"
	"github.com/warrenhq/warren/internal/edge/pause"
	"github.com/warrenhq/warren/internal/edge/pool"
	"github.com/warrenhq/warren/internal/edge/recycle"
	"github.com/warrenhq/warren/internal/edge/snapshot"
	"github.com/warrenhq/warren/internal/edge/trajectory"
	"github.com/warrenhq/warren/internal/hoststat"
	"github.com/warrenhq/warren/internal/lifetime"
	"github.com/warrenhq/warren/internal/runtime"
)

// Config configures an edge.
type Config struct {
	Node     string // node name; [a-z0-9-], used in sandbox ids and subjects
	DataDir  string // edge state lives in DataDir/edge
	Bus      *bus.Conn
	Runtime  runtime.Runtime
	Images   ImageResolver
	Writable WritableLayers
	Logger   *slog.Logger

	CPUCapacity  float64 // cores offered (after overcommit)
	MemoryMB     int64   // memory offered (after overcommit)
	MaxSandboxes int
	Labels       map[string]string // node labels, matched by node_selector
	// CPUOvercommit and MemoryOvercommit are the factors behind
	// CPUCapacity and MemoryMB (reported in the node view).
	CPUOvercommit    float64
	MemoryOvercommit float64
	// DiskMB is the disk offered to writable layers (disk_mb), after
	// DiskOvercommit: what the scratch filesystem can really hold times
	// the factor; 0 = no check. DiskSpace, when set, measures the scratch
	// filesystem (total and available, MiB): the node view reports it and
	// new sandboxes are refused while less than MinDiskAvailableMB is
	// free (0 = 1,024 MiB; negative = no check).
	DiskMB             int64
	DiskOvercommit     float64
	DiskSpace          func() (totalMB, availMB int64, err error)
	MinDiskAvailableMB int64
	// MinMemoryAvailableMB refuses new sandboxes while the host's
	// MemAvailable is below it. 0 = 2 % of the host's memory (at least
	// 256 MiB); negative = no check.
	MinMemoryAvailableMB int64
	// MaxMemoryPressure refuses new sandboxes while the host's memory PSI
	// ("some" avg10, percent) is above it. 0 = 40; negative = no check.
	MaxMemoryPressure float64
	// MaxCPUPressure: admission counts a best-effort create against what
	// the node's best-effort sandboxes really get (their idle_cpu while at
	// it, internal/edge/elastic) only while the host's CPU PSI ("some"
	// avg10, percent) is at most this. 0 = 90; negative = no check.
	MaxCPUPressure float64
	// BestEffortCap caps the best-effort class as a whole at this many
	// cores while any latency-class sandbox runs an operation
	// (classcap.go). 0 = 0.1 core; negative = never.
	BestEffortCap float64
	// MinFreeTasks refuses new sandboxes while fewer than this many pids
	// (threads) are left under kernel.pid_max / threads-max: every thread
	// of every sandbox takes one, and a host out of pids cannot even start
	// a thread in warren itself. 0 = 2,048; negative = no check.
	MinFreeTasks int64

	DefaultTTL     time.Duration // 0 = 24h
	TombstoneFor   time.Duration // how long stopped sandboxes stay visible; 0 = 10m
	HeartbeatEvery time.Duration // 0 = 1s
	KeepOnShutdown bool          // leave sandboxes running on Close (for upgrades)
	ReaperEvery    time.Duration // 0 = 1s
	// RosterEvery is how often, at most, the node writes the ids of its live
	// sandboxes to the roster bucket (when they changed). 0 = 500ms; <0 = never.
	RosterEvery time.Duration
	// DrainTimeout is how long Close lets the calls in flight finish
	// before it cancels them (bounded by Close's context). 0 = 10s.
	DrainTimeout time.Duration
	// Recycle is how many wiped containers of one shape are kept for
	// reuse (recycle.go); 0 = none: every sandbox gets a new container.
	Recycle int
	// RecycleIdle is how long a wiped container waits for a create; 0 =
	// DefaultRecycleIdle.
	RecycleIdle time.Duration
	// Telemetry loads the node's BPF programs (internal/telemetry) so the
	// audit of each sandbox records what its processes execute. Where the
	// kernel cannot run them the node runs without (features.telemetry).
	Telemetry bool
	// TelemetryRefusals also records every syscall that fails with EPERM
	// (telemetry.Options.Refusals: it slows every syscall of the host).
	TelemetryRefusals bool
	// TelemetryFiles also records the file writes, renames, unlinks and
	// chmods of sandbox processes (telemetry.Options.Files: it slows every
	// syscall of the host).
	TelemetryFiles bool
	// DataListen is the address of the data listener (dataplane.go), which
	// carries exec output and file and tar transfers; "" = none (those then
	// travel on the bus). DataAdvertise is the address apiservers dial, in
	// the heartbeat; "" = the listener's own address.
	DataListen    string
	DataAdvertise string
}

// Edge manages the sandboxes of one node.
type Edge struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	// live holds the sandboxes of sandboxes that are, or were when last
	// looked at, creating, running or paused: admission sums them on every
	// create, while sandboxes also keeps stopped ones for TombstoneFor (at
	// 100 creates/s, 60,000 of them). putLocked and dropLocked keep it up
	// to date; the reaper drops those that have stopped since.
	live    map[*sandbox]struct{}
	closing bool
	// pools is the warm pools (internal/edge/pool), written against the
	// core (core.go); their own lock comes after mu.
	pools *pool.Pools
	// shelf is the recycled containers (internal/edge/recycle), written
	// against the core (core.go, recycle.go); its own lock is a leaf.
	shelf *recycle.Shelf
	// pauser pauses and resumes sandboxes (internal/edge/pause); it has
	// no lock of its own but each sandbox's pmu.
	pauser *pause.Pauser
	// snapshots takes and reads snapshots (internal/edge/snapshot); its
	// lock is each sandbox's snap.
	snapshots *snapshot.Snapshotter
	// forker forks sandboxes from memory (internal/edge/fork); it has no
	// lock of its own.
	forker *fork.Forker
	// elastic switches the sandboxes' CPU between their full and idle
	// levels (internal/edge/elastic, elastic.go); it has no lock of its
	// own: each sandbox's elastic.CPU is under its mu.
	elastic *elastic.Node
	// spareRecords are record files kept for reuse (dropRecord).
	spareMu      sync.Mutex
	spareRecords []string
	spareSeq     int

	// pressureAt and pressureErr: the last reading of the host's pressure
	// (admission), under mu.
	pressureAt  time.Time
	pressureErr *api.Error
	// fn is the FnCall tier (internal/edge/fncall), written against the
	// core (core.go); its own lock comes after mu.
	fn     *fncall.Workers
	runCtx context.Context

	features  api.NodeFeatures
	class     classCap // the best-effort class's cap (classcap.go)
	usageMu   sync.Mutex
	lastUsage runtime.Usage
	lastAt    time.Time
	cpuRate   float64

	roster     jetstream.KeyValue
	lastRoster string

	// Sandboxes of this node the control plane reported lost (see lost.go):
	// id -> project, under mu.
	lost        map[string]string
	lostKV      *bus.Lost
	rules       *netrules.Rules // the cluster's named network rules (internal/edge/netrules, network.go)
	denials     *netdeny.Log    // per sandbox, what its network refused (internal/edge/netdeny, netdenials.go)
	events      *bus.Events
	reconciled  chan struct{} // closed once reconcile is done
	pendingLost [][2]string   // destroyed by reconcile: sandbox.destroyed to publish

	subs   []*nats.Subscription
	cancel context.CancelFunc
	// wg owns the edge's own goroutines (loops, fillers, background
	// stops): every one is counted here, Close cancels them and waits.
	wg lifetime.Group
	// calls owns the bus calls in flight (their handlers and answers);
	// callCtx is theirs, cancelled only when Close's drain deadline
	// passes (drain).
	calls lifetime.Group
	// watches owns the goroutines that watch an agent's channel (watch);
	// they end with their sandbox, so Close waits for them last.
	watches    lifetime.Group
	callCtx    context.Context
	callCancel context.CancelFunc

	uploads uploads // layer tarballs arriving in chunks

	data     *dataplane.Server // the data listener, when DataListen is set
	dataAddr string            // its advertised address (in the heartbeat)

	snaps    *bus.Records // snapshot records
	trajMeta *bus.Records // trajectory records
	tlog     *bus.TrajLog // trajectory logs
	inputs   *bus.Inputs  // logged operations' file data and stdin, by SHA-256
	// trajs is the trajectories (internal/edge/trajectory) over trajMeta,
	// tlog and inputs, written against the core (trajectory.go); its
	// locks (each sandbox's Traj.mu) come first of all.
	trajs   *trajectory.Recorder
	storage *bus.Storage // the projects' stored bytes and storage quotas (storage.go)

	// audit is the sandboxes' audit and the node's telemetry
	// (internal/edge/audit, audit.go).
	audit *audit.Node

	// beatNow asks the heartbeat loop for a heartbeat before its next tick
	// (Heartbeat).
	beatNow chan struct{}
}

// New checks cfg and prepares directories; Start brings the edge up.
func New(cfg Config) (*Edge, error) {
	if !ValidNodeName(cfg.Node) {
		return nil, fmt.Errorf("edge: invalid node name %q (want [a-z0-9-], at most 32)", cfg.Node)
	}
	if cfg.Bus == nil || cfg.Runtime == nil || cfg.Images == nil || cfg.Writable == nil {
		return nil, errors.New("edge: bus, runtime, images and writable layers are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.DefaultTTL == 0 {
		cfg.DefaultTTL = 24 * time.Hour
	}
	if cfg.RecycleIdle == 0 {
		cfg.RecycleIdle = DefaultRecycleIdle
	}
	if cfg.TombstoneFor == 0 {
		cfg.TombstoneFor = 10 * time.Minute
	}
	if cfg.HeartbeatEvery == 0 {
		cfg.HeartbeatEvery = time.Second
	}
	if cfg.RosterEvery == 0 {
		cfg.RosterEvery = 500 * time.Millisecond
	}
	if cfg.ReaperEvery == 0 {
		cfg.ReaperEvery = time.Second
	}
	if cfg.MaxSandboxes == 0 {
		cfg.MaxSandboxes = 10000
	}
	if cfg.MinDiskAvailableMB == 0 {
		cfg.MinDiskAvailableMB = 1024
	}
	if cfg.MinMemoryAvailableMB == 0 {
		cfg.MinMemoryAvailableMB = 256
		if m, err := hoststat.ReadMemory(); err == nil && m.Total>>20/50 > cfg.MinMemoryAvailableMB {
			cfg.MinMemoryAvailableMB = m.Total >> 20 / 50
		}
	}
	if cfg.MaxMemoryPressure == 0 {
		cfg.MaxMemoryPressure = 40
	}
	if cfg.BestEffortCap == 0 {
		cfg.BestEffortCap = 0.1
	}
	if cfg.MaxCPUPressure == 0 {
		cfg.MaxCPUPressure = 90
	}
	if cfg.MinFreeTasks == 0 {
		cfg.MinFreeTasks = 2048
	}
	e := &Edge{cfg: cfg, log: cfg.Logger.With("part", "edge", "node", cfg.Node), sandboxes: make(map[string]*sandbox), live: make(map[*sandbox]struct{}), lost: map[string]string{}, reconciled: make(chan struct{}), beatNow: make(chan struct{}, 1)}
	e.fn = fncall.New(jobCore{e})
	e.pools = pool.New(jobCore{e}, filepath.Join(cfg.DataDir, "edge", "pools.json"))
	e.shelf = recycle.New(jobCore{e}, jobCore{e}, cfg.Runtime, cfg.Recycle)
	e.pauser = pause.New(jobCore{e}, cfg.Runtime)
	e.snapshots = e.newSnapshotter()
	e.forker = fork.New(forkHost{e}, cfg.Runtime)
	e.audit = audit.New(auditHost{e}, cfg.Runtime)
	e.denials = netdeny.New(denyHost{e}, cfg.Runtime)
	e.rules = netrules.New(netHost{e}, cfg.Runtime)
	gater, _ := cfg.Runtime.(runtime.CPUGater)
	e.elastic = elastic.New(e.log, gater, cfg.CPUCapacity, cfg.MaxCPUPressure)
	e.features = hoststat.Features()
	_, e.features.Freezer = cfg.Runtime.(runtime.Reclaimer)
	if iso, ok := cfg.Runtime.(isolator); ok {
		e.features.SandboxRoot, e.features.SandboxRootDetail = iso.Isolation()
	}
	for _, d := range []string{e.recordsDir(), e.runDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("edge: %w", err)
		}
	}
	return e, nil
}

func (e *Edge) recordsDir() string        { return filepath.Join(e.cfg.DataDir, "edge", "sandboxes") }
func (e *Edge) runDir() string            { return filepath.Join(e.cfg.DataDir, "edge", "run") }
func (e *Edge) stateDir(id string) string { return filepath.Join(e.runDir(), id) }

// Start reconciles with what is on the host, then serves requests, sends
// heartbeats and reaps expired sandboxes until Close.
func (e *Edge) Start(ctx context.Context) error {
	var err error
	if changed, err := hoststat.RaiseSharedLimits("/proc/sys"); err != nil {
		e.log.Warn("edge: per-user limits that sandboxes share with the host's root stay low", "err", err)
	} else if len(changed) > 0 {
		e.log.Info("edge: raised per-user limits that sandboxes share with the host's root", "sysctls", changed)
	}
	if err := e.openStores(ctx); err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	e.cancel = cancel
	e.runCtx = runCtx
	if err := e.watchLost(runCtx); err != nil {
		cancel()
		return err
	}
	if err := e.watchNetRules(runCtx); err != nil {
		cancel()
		return err
	}
	if dn, ok := e.cfg.Runtime.(runtime.DenialNotifier); ok {
		dn.OnNetworkDenial(e.recordDenial)
	}
	e.startTelemetry(runCtx)
	e.classReset(false)
	err = e.reconcile(ctx)
	close(e.reconciled)
	if err != nil {
		cancel()
		return err
	}
	// Rules changed while this edge was down reach its adopted sandboxes.
	e.wg.Go(func() { e.rules.Apply("") })
	if pending := e.pendingLost; len(pending) > 0 {
		e.pendingLost = nil
		e.wg.Go(func() {
			for _, p := range pending {
				e.lostDestroyed(p[0], p[1])
			}
		})
	}
	if e.cfg.RosterEvery > 0 {
		kv, err := e.cfg.Bus.KeyValue(ctx, bus.BucketRoster, 0)
		if err != nil {
			cancel()
			return err
		}
		e.roster = kv
	}
	e.callCtx, e.callCancel = context.WithCancel(context.Background())
	sub, err := e.cfg.Bus.ServeOwned(e.callCtx, bus.EdgeSubject(e.cfg.Node), "", e.handle, e.calls.Go)
	if err != nil {
		cancel()
		return err
	}
	if err := e.startData(ctx); err != nil {
		_ = sub.Unsubscribe()
		cancel()
		return err
	}
	e.subs = append(e.subs, sub)
	e.wg.Add(3)
	go e.heartbeatLoop(runCtx)
	go e.reaperLoop(runCtx)
	go e.denialLoop(runCtx)
	if e.roster != nil {
		e.wg.Add(1)
		go e.rosterLoop(runCtx)
	}
	e.pools.Load()
	e.log.Info("edge serving", "sandboxes", e.count())
	return nil
}

// openStores opens what the edge keeps on the bus: snapshot and
// trajectory records, trajectory logs and inputs, storage use, lost
// sandboxes, events.
func (e *Edge) openStores(ctx context.Context) error {
	var err error
	if e.snaps, err = e.cfg.Bus.Records(ctx, bus.BucketSnapshots); err != nil {
		return err
	}
	if e.trajMeta, err = e.cfg.Bus.Records(ctx, bus.BucketTrajectories); err != nil {
		return err
	}
	if e.tlog, err = e.cfg.Bus.TrajectoryLog(ctx); err != nil {
		return err
	}
	if e.inputs, err = e.cfg.Bus.TrajectoryInputs(ctx); err != nil {
		return err
	}
	e.trajs = trajectory.NewRecorder(trajHost{e}, e.trajMeta, e.tlog, e.inputs)
	if e.storage, err = e.cfg.Bus.Storage(ctx); err != nil {
		return err
	}
	if e.lostKV, err = e.cfg.Bus.OpenLost(ctx); err != nil {
		return err
	}
	e.events, err = e.cfg.Bus.OpenEvents(ctx)
	return err
}

// Close stops serving: it takes no more calls, lets those in flight
// finish (until the drain deadline, then cancels them), stops the edge's
// goroutines and waits for all of them. Unless KeepOnShutdown, every
// sandbox is then stopped and its resources freed.
func (e *Edge) Close(ctx context.Context) error {
	e.mu.Lock()
	e.closing = true
	e.mu.Unlock()
	e.drain(ctx)
	if e.cancel != nil {
		e.cancel()
	}
	e.wg.Close()
	_ = e.wg.Wait(context.Background())
	defer e.audit.Close()
	e.mu.Lock()
	all := make([]*sandbox, 0, len(e.sandboxes))
	for _, sb := range e.sandboxes {
		all = append(all, sb)
	}
	e.mu.Unlock()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, sb := range all {
		if e.cfg.KeepOnShutdown {
			sb.detach()
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func(sb *sandbox) {
			defer wg.Done()
			defer func() { <-sem }()
			e.stop(ctx, sb, api.StateStopped, "node shut down")
		}(sb)
	}
	wg.Wait()
	e.shelf.Close()
	// What the stops started ends too, and the watches with their agents.
	_ = e.wg.Wait(context.Background())
	_ = e.watches.Wait(context.Background())
	e.classReset(true)
	return nil
}

// drain stops taking calls, on the bus and the data listener, and waits
// for those in flight until the drain deadline (Config.DrainTimeout,
// bounded by ctx); then it cancels them and waits for them to return.
func (e *Edge) drain(ctx context.Context) {
	// New calls are refused (answered unavailable) while the subscription
	// stays: the callers of the calls in flight probe it (a ping) and
	// would take no responders for a dead node.
	e.calls.Close()
	d := e.cfg.DrainTimeout
	if d <= 0 {
		d = 10 * time.Second
	}
	dctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	dataDone := make(chan struct{})
	go func() {
		defer close(dataDone)
		if e.data != nil {
			_ = e.data.Shutdown(dctx) // after the deadline, streams still running are reset
		}
	}()
	if err := e.calls.Wait(dctx); err != nil && e.callCancel != nil {
		e.log.Warn("edge: calls still running at the drain deadline are cancelled", "calls", e.calls.Len())
		e.callCancel()
		_ = e.calls.Wait(context.Background())
	}
	<-dataDone
	for _, s := range e.subs {
		_ = s.Unsubscribe()
	}
	if e.callCancel != nil {
		e.callCancel()
	}
}

func (e *Edge) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for sb := range e.live {
		if sb.live() {
			n++
		}
	}
	return n
}

// putLocked records sb under id (and, when it is live, in e.live).
func (e *Edge) putLocked(id string, sb *sandbox) {
	e.sandboxes[id] = sb
	if sb.live() {
		e.live[sb] = struct{}{}
	}
}

// put is putLocked for a caller without e.mu (the reconcile at start, while
// the watch of lost sandboxes may already run).
func (e *Edge) put(id string, sb *sandbox) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.putLocked(id, sb)
}

// dropLocked forgets the sandbox recorded under id.
func (e *Edge) dropLocked(id string) {
	if sb := e.sandboxes[id]; sb != nil {
		delete(e.live, sb)
	}
	delete(e.sandboxes, id)
	e.denials.Forget(id)
}

// newID returns sb-<node>-<random>; the random part has no '-'.
func (e *Edge) newID() string { return NewSandboxID(e.cfg.Node) }

// isolator is a runtime that says who its sandboxes' root is on the host
// (the container tier: user namespaces or host root).
type isolator interface {
	Isolation() (mode, detail string)
}

// nodeFeatures is the node's features, with the runtime's isolation as it
// is now (the ranges in use change).
func (e *Edge) nodeFeatures() api.NodeFeatures {
	f := e.features
	if iso, ok := e.cfg.Runtime.(isolator); ok {
		f.SandboxRoot, f.SandboxRootDetail = iso.Isolation()
	}
	return f
}
