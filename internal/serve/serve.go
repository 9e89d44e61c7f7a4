// Package serve runs every part of warren on one machine: an embedded NATS
// server with JetStream, one edge, the watcher, placement and the apiserver.
// The parts talk over NATS exactly as they do in a cluster.
package serve

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	_ "net/http/pprof"
	"os"
	"path/filepath"
	goruntime "runtime"
	"time"

	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/connlimit"
	"github.com/warrenhq/warren/internal/e2b"
	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/iam"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/runtime/container"
	"github.com/warrenhq/warren/internal/runtime/tiers"
	"github.com/warrenhq/warren/internal/watcher"
)

// DefaultDiskOvercommit is the default of Options.DiskOvercommit
// (--disk-overcommit): sandboxes seldom fill their writable layers, and a
// scratch filesystem that does fill refuses new sandboxes at its reserve
// (edge.Config.MinDiskAvailableMB) and never grows past the host's free
// space (scratch.Space).
const DefaultDiskOvercommit = 10

// DefaultRecycle is the default of Options.Recycle (--recycle).
const DefaultRecycle = 32

// Options configure `warren serve`.
type Options struct {
	DataDir string // default /var/lib/warren
	// Store is the layer store directory (default DataDir/images). In a
	// cluster it is a shared filesystem mounted at the same path on every node.
	Store      string
	Listen     string // default 127.0.0.1:7070
	Node       string // default: hostname, sanitised
	AgentPath  string // default: warren-agent beside the running binary
	NATSListen string // optional: also accept external NATS clients here
	// CPUOvercommit and MemoryOvercommit scale the node's real capacity.
	CPUOvercommit    float64 // default 20
	MemoryOvercommit float64 // default 1.5
	// DiskOvercommit scales what the scratch filesystem can really hold
	// (edge.Config.DiskMB); default DefaultDiskOvercommit.
	DiskOvercommit float64
	// MinMemoryAvailableMB and MaxMemoryPressure: see edge.Config.
	MinMemoryAvailableMB int64
	MaxMemoryPressure    float64
	MaxCPUPressure       float64 // see edge.Config
	BestEffortCap        float64 // see edge.Config
	KeepOnShutdown       bool
	// Recycle is how many wiped containers of one shape the node keeps
	// for reuse (edge.Config.Recycle); 0 = none. RecycleIdle is how long
	// one waits (0 = edge.DefaultRecycleIdle).
	Recycle     int
	RecycleIdle time.Duration
	// TrajectorySweep is how often expired trajectories are deleted (0 =
	// apiserver.DefaultSweepEvery).
	TrajectorySweep time.Duration
	// NoTelemetry: the node loads no BPF telemetry (edge.Config.Telemetry).
	NoTelemetry bool
	// TelemetryRefusals, TelemetryFiles: see edge.Config.
	TelemetryRefusals bool
	TelemetryFiles    bool
	Userns            UsernsOptions
	// VMKernel is the microvm tier's guest kernel directory (default
	// DefaultVMKernel under DataDir; "off": no microvm tier).
	VMKernel string
	// NoVMTemplates boots every microVM from its kernel instead of
	// restoring it from a memory template (microvm.Config.NoTemplates).
	NoVMTemplates bool
	// VMTCGBufferMB is TCG's code buffer of a microVM restored from a
	// template (microvm.Config.RestoredTCGBufferMB; 0: its default).
	VMTCGBufferMB int
	Logger        *slog.Logger
	// Ready, when set, is called once the API answers (with its URL and the admin token).
	Ready func(url, token string)
	// E2BListen, when set, also serves E2B's control plane there
	// (internal/e2b); E2BReady is then called with its URL and the admin
	// token before Ready.
	E2BListen string
	E2BReady  func(url, token string)
	// HTTP bounds the API's connections (see HTTPLimits).
	HTTP HTTPLimits
}

// HTTPLimits bound the connections of the HTTP API (and the E2B front):
// idle or slow clients must never take the descriptors sandboxes need.
type HTTPLimits struct {
	// MaxConns is the most connections held at once; 0 = half the
	// process's descriptor limit (connlimit.Budget). MaxConnsPerClient is
	// the most of one client address; 0 = connlimit.DefaultPerClient. A
	// connection past either is answered 503 and closed.
	MaxConns          int
	MaxConnsPerClient int
	// HeaderTimeout bounds the reading of a request's headers; 0 =
	// DefaultHeaderTimeout. IdleTimeout closes a keep-alive connection
	// idle that long; 0 = DefaultIdleTimeout.
	HeaderTimeout time.Duration
	IdleTimeout   time.Duration
}

// Defaults of HTTPLimits.
const (
	DefaultHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout   = 60 * time.Second
)

func (o *Options) defaults() error {
	if o.DataDir == "" {
		o.DataDir = "/var/lib/warren"
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:7070"
	}
	if o.Node == "" {
		o.Node = DefaultNodeName()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.CPUOvercommit == 0 {
		o.CPUOvercommit = 20
	}
	if o.MemoryOvercommit == 0 {
		o.MemoryOvercommit = 1.5
	}
	if o.DiskOvercommit == 0 {
		o.DiskOvercommit = DefaultDiskOvercommit
	}
	if o.CPUOvercommit < 0 || o.MemoryOvercommit < 0 || o.DiskOvercommit < 0 {
		return errors.New("serve: an overcommit factor must be positive")
	}
	if err := checkRecycle(o.Recycle, o.RecycleIdle); err != nil {
		return err
	}
	if o.AgentPath == "" {
		p, err := FindAgent()
		if err != nil {
			return err
		}
		o.AgentPath = p
	}
	return nil
}

// FindAgent looks for warren-agent beside the running binary, then on PATH.
func FindAgent() (string, error) {
	if exe, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(exe), "warren-agent")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	for _, dir := range filepath.SplitList(os.Getenv("PATH")) {
		p := filepath.Join(dir, "warren-agent")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("serve: warren-agent not found beside the warren binary or on PATH (build it with `make build`, or pass --agent)")
}

// DefaultNodeName derives a valid node name from the hostname.
func DefaultNodeName() string {
	h, _ := os.Hostname()
	out := make([]byte, 0, len(h))
	for _, c := range []byte(h) {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			out = append(out, c)
		case c >= 'A' && c <= 'Z':
			out = append(out, c+'a'-'A')
		case c == '-' || c == '.' || c == '_':
			out = append(out, '-')
		}
		if len(out) == 32 {
			break
		}
	}
	name := string(out)
	for len(name) > 0 && name[len(name)-1] == '-' {
		name = name[:len(name)-1]
	}
	if !edge.ValidNodeName(name) {
		return "node"
	}
	return name
}

// CgroupParent is the cgroup under which the node started from dataDir
// keeps its sandboxes: one per data dir, so that several warren instances
// on one host (tests, benchmarks) never reconcile away each other's sandboxes.
func CgroupParent(dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	h := sha256.Sum256([]byte(abs))
	return "warren/" + hex.EncodeToString(h[:6])
}

// Run serves until ctx is cancelled, then shuts down cleanly.
func Run(ctx context.Context, o Options) error {
	if err := o.defaults(); err != nil {
		return err
	}
	log := o.Logger
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return fmt.Errorf("serve: data dir: %w", err)
	}
	// Bind the API port first, so a port conflict fails fast.
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("serve: listen %s: %w", o.Listen, err)
	}
	defer ln.Close()

	// Every part connects with its own credentials, kept in the data dir
	// (other processes on --nats-listen use them: see docs/operations.md).
	auth, err := bus.EnsureAuth(filepath.Join(o.DataDir, "nats-auth"), []string{o.Node})
	if err != nil {
		return err
	}
	nats, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: o.DataDir, Listen: o.NATSListen, Logger: log, Auth: auth})
	if err != nil {
		return err
	}
	defer nats.Shutdown()
	edgeConn, err := nats.Connect("warren-edge", bus.RoleEdge, o.Node)
	if err != nil {
		return err
	}
	defer edgeConn.Close()
	apiConn, err := nats.Connect("warren-apiserver", bus.RoleAPIServer, "")
	if err != nil {
		return err
	}
	defer apiConn.Close()
	// The apiserver makes the buckets the edge uses (it may not).
	if err := apiConn.EnsureBuckets(ctx); err != nil {
		return err
	}

	stopEdge, e, err := startEdge(ctx, edgeConn, EdgeOptions{
		Node: o.Node, DataDir: o.DataDir, AgentPath: o.AgentPath, CPUOvercommit: o.CPUOvercommit,
		MemoryOvercommit: o.MemoryOvercommit, DiskOvercommit: o.DiskOvercommit, KeepOnShutdown: o.KeepOnShutdown, Logger: log,
		MinMemoryAvailableMB: o.MinMemoryAvailableMB, MaxMemoryPressure: o.MaxMemoryPressure, MaxCPUPressure: o.MaxCPUPressure, BestEffortCap: o.BestEffortCap,
		Recycle: o.Recycle, RecycleIdle: o.RecycleIdle, NoTelemetry: o.NoTelemetry, TelemetryRefusals: o.TelemetryRefusals, TelemetryFiles: o.TelemetryFiles,
		Userns: o.Userns, VMKernel: o.VMKernel, NoVMTemplates: o.NoVMTemplates,
		VMTCGBufferMB: o.VMTCGBufferMB,
	})
	if err != nil {
		return err
	}
	defer stopEdge()
	return serveAPI(ctx, apiConn, ln, APIOptions{DataDir: o.DataDir, Logger: log, Ready: o.Ready, WaitForNode: o.Node, Announce: e.Heartbeat, TrajectorySweep: o.TrajectorySweep,
		E2BListen: o.E2BListen, E2BReady: o.E2BReady, HTTP: o.HTTP})
}

// EdgeOptions configure one edge (`warren edge`, or the edge of `warren serve`).
type EdgeOptions struct {
	NATS      bus.DialConfig // for `warren edge`
	Node      string         // default: hostname, sanitised
	DataDir   string         // default /var/lib/warren
	Store     string         // image store directory; default DataDir/images (shared in a cluster)
	AgentPath string
	Labels    map[string]string // node labels matched by node_selector
	// CPUOvercommit and MemoryOvercommit scale the node's real capacity.
	CPUOvercommit    float64
	MemoryOvercommit float64
	DiskOvercommit   float64
	KeepOnShutdown   bool
	// MinMemoryAvailableMB and MaxMemoryPressure: see edge.Config.
	MinMemoryAvailableMB int64
	MaxMemoryPressure    float64
	MaxCPUPressure       float64       // see edge.Config
	BestEffortCap        float64       // see edge.Config
	Recycle              int           // see Options.Recycle
	RecycleIdle          time.Duration // see Options.RecycleIdle
	NoTelemetry          bool          // see Options.NoTelemetry
	TelemetryRefusals    bool          // see Options.TelemetryRefusals
	TelemetryFiles       bool          // see Options.TelemetryFiles
	// DataListen and DataAdvertise: the edge's data listener (see
	// edge.Config); DataListen "" = DefaultDataListen.
	DataListen    string
	DataAdvertise string
	Userns        UsernsOptions
	VMKernel      string // see Options.VMKernel
	NoVMTemplates bool   // see Options.NoVMTemplates
	VMTCGBufferMB int    // see Options.VMTCGBufferMB
	Logger        *slog.Logger
}

// DefaultDataListen is the data listener of an edge: loopback, on a port
// the kernel picks (advertised in the heartbeat). An edge on another host
// than its apiservers listens on an address they can reach.
const DefaultDataListen = "127.0.0.1:0"

// UsernsOptions are the user namespaces of container sandboxes
// (container.Config). IDBase and IDRanges are their host ids (0: the
// defaults). AllowHostRoot lets sandboxes run as host root where the
// kernel cannot run them in user namespaces (without it, the node refuses
// to start there); HostRoot runs them as host root anyway (measurements).
// NetPool is where networked sandboxes' addresses come from
// (container.Config.NetPool).
type UsernsOptions struct {
	IDBase                  uint32
	IDRanges                int
	AllowHostRoot, HostRoot bool
	NetPool                 string
	// DNSUpstream is where the resolver of networked sandboxes forwards
	// (container.Config.DNSUpstream).
	DNSUpstream string
	// NetEgressRateMbit is networked sandboxes' default egress rate limit
	// (container.Config.NetEgressRateMbit).
	NetEgressRateMbit int
	// NetMaxConns is networked sandboxes' limit of open connections
	// (container.Config.NetMaxConns).
	NetMaxConns uint32
	// NetIngressRateMbit is networked sandboxes' default ingress rate
	// limit (container.Config.NetIngressRateMbit).
	NetIngressRateMbit int
}

func (o *EdgeOptions) defaults() error {
	so := Options{DataDir: o.DataDir, Node: o.Node, AgentPath: o.AgentPath, Logger: o.Logger,
		CPUOvercommit: o.CPUOvercommit, MemoryOvercommit: o.MemoryOvercommit, DiskOvercommit: o.DiskOvercommit}
	if err := so.defaults(); err != nil {
		return err
	}
	o.DataDir, o.Node, o.AgentPath, o.Logger = so.DataDir, so.Node, so.AgentPath, so.Logger
	o.CPUOvercommit, o.MemoryOvercommit, o.DiskOvercommit = so.CPUOvercommit, so.MemoryOvercommit, so.DiskOvercommit
	if o.DataListen == "" {
		o.DataListen = DefaultDataListen
	}
	if o.Store == "" {
		o.Store = filepath.Join(o.DataDir, "images")
	}
	return checkRecycle(o.Recycle, o.RecycleIdle)
}

// checkRecycle refuses negative --recycle and --recycle-idle.
func checkRecycle(n int, idle time.Duration) error {
	if n < 0 {
		return fmt.Errorf("--recycle must be 0 (off) or more, not %d", n)
	}
	if idle < 0 {
		return fmt.Errorf("--recycle-idle must not be negative (%v)", idle)
	}
	return nil
}

// RunEdge runs one edge (`warren edge`) against an external NATS until ctx
// is cancelled.
func RunEdge(ctx context.Context, o EdgeOptions) error {
	if err := o.defaults(); err != nil {
		return err
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return fmt.Errorf("edge: data dir: %w", err)
	}
	o.NATS.Name = "warren-edge-" + o.Node
	o.NATS.Role, o.NATS.Node = bus.RoleEdge, o.Node
	conn, err := bus.Dial(o.NATS)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop, _, err := startEdge(ctx, conn, o)
	if err != nil {
		return err
	}
	o.Logger.Info("warren edge is serving", "node", o.Node, "data_dir", o.DataDir, "store", o.Store)
	<-ctx.Done()
	o.Logger.Info("shutting down")
	stop()
	return nil
}

// startEdge brings up the edge of o on conn; the returned func stops it.
func startEdge(ctx context.Context, conn *bus.Conn, o EdgeOptions) (func(), *edge.Edge, error) {
	if err := o.defaults(); err != nil {
		return nil, nil, err
	}
	log := o.Logger
	images, err := image.Open(o.Store)
	if err != nil {
		return nil, nil, err
	}
	var closers []func()
	stop := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	// Layer mounts are shared by the node's sandboxes: unmounted last, after
	// the edge stopped them.
	mounts, err := image.NewMounter(filepath.Join(o.DataDir, "layers"), images)
	if err != nil {
		return nil, nil, err
	}
	closers = append(closers, func() {
		if !o.KeepOnShutdown {
			if err := mounts.Close(); err != nil {
				log.Warn("unmount layers", "err", err)
			}
		}
	})
	if _, err := images.EnsureBusybox(ctx); err != nil {
		log.Warn("cannot build the busybox image", "err", err)
	}
	writable, closeWritable, err := openWritable(ctx, o.DataDir, o.KeepOnShutdown, log)
	if err != nil {
		stop()
		return nil, nil, err
	}
	closers = append(closers, closeWritable)
	closeRunDir, err := openRunDir(o.DataDir, o.KeepOnShutdown, log)
	if err != nil {
		stop()
		return nil, nil, err
	}
	closers = append(closers, closeRunDir)
	rt, err := container.New(containerConfig(o))
	if err != nil {
		stop()
		return nil, nil, err
	}
	closers = append(closers, func() {
		if !o.KeepOnShutdown {
			if err := rt.Close(); err != nil {
				log.Warn("remove parent cgroup", "err", err)
			}
		}
	})
	edgeRT, closeVM := withVMTiers(o, images, rt)
	if closeVM != nil {
		closers = append(closers, closeVM)
	}
	e, err := edge.New(edgeConfig(o, conn, edgeRT, imageResolver{store: images, mounts: mounts}, writable))
	if err != nil {
		stop()
		return nil, nil, err
	}
	if err := e.Start(ctx); err != nil {
		stop()
		return nil, nil, err
	}
	closers = append(closers, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		_ = e.Close(cctx)
	})
	return stop, e, nil
}

// containerConfig is the configuration of the edge's container runtime
// (the container tier) for o.
func containerConfig(o EdgeOptions) container.Config {
	return container.Config{AgentPath: o.AgentPath, Logger: o.Logger, CgroupParent: CgroupParent(o.DataDir),
		IDBase: o.Userns.IDBase, IDRanges: o.Userns.IDRanges, AllowHostRoot: o.Userns.AllowHostRoot, HostRoot: o.Userns.HostRoot,
		NetPool: o.Userns.NetPool, DNSUpstream: o.Userns.DNSUpstream, NetEgressRateMbit: o.Userns.NetEgressRateMbit, NetMaxConns: o.Userns.NetMaxConns,
		NetIngressRateMbit: o.Userns.NetIngressRateMbit}
}

// withVMTiers puts the microvm and vm tiers beside the container runtime
// rt when the node can run them (openVMTiers), and starts the default
// shape's memory template. It returns the runtime the edge uses, and the
// func that removes the tiers' parent cgroups at shutdown (unless o keeps
// them), nil when the tiers are off.
func withVMTiers(o EdgeOptions, images *image.LocalStore, rt *container.Runtime) (runtime.Runtime, func()) {
	log := o.Logger
	vm, full, why := openVMTiers(o, images, rt.Network())
	if vm == nil {
		log.Info("microvm and vm tiers off", "reason", why)
		return rt, nil
	}
	closeVM := func() {
		if !o.KeepOnShutdown {
			if err := vm.Close(); err != nil {
				log.Warn("remove the microvm tier's parent cgroup", "err", err)
			}
			if err := full.Close(); err != nil {
				log.Warn("remove the vm tier's parent cgroup", "err", err)
			}
		}
	}
	log.Info("microvm and vm tiers on", "accel", vm.Accel(), "kernel", vm.KernelVersion())
	// The default shape's memory template, before the first create
	// asks for it.
	vm.WarmTemplate()
	return tiers.New(rt, vm, full), closeVM
}

// edgeConfig is the configuration of the edge of o on conn: its runtime,
// images and writable layers, and its capacity (this host's CPUs, memory
// and scratch space, scaled by o's overcommit factors).
func edgeConfig(o EdgeOptions, conn *bus.Conn, rt runtime.Runtime, images imageResolver, writable edge.WritableLayers) edge.Config {
	memMB := totalMemoryMB()
	diskMB, diskSpace := diskCapacity(writable, o.DiskOvercommit, o.Logger)
	return edge.Config{
		Node: o.Node, DataDir: o.DataDir, Bus: conn, Runtime: rt,
		Images: images, Writable: writable, Logger: o.Logger,
		CPUCapacity:    float64(goruntime.NumCPU()) * o.CPUOvercommit,
		MemoryMB:       int64(float64(memMB) * o.MemoryOvercommit),
		Labels:         o.Labels,
		KeepOnShutdown: o.KeepOnShutdown, Recycle: o.Recycle, RecycleIdle: o.RecycleIdle,
		CPUOvercommit: o.CPUOvercommit, MemoryOvercommit: o.MemoryOvercommit,
		DiskMB: diskMB, DiskOvercommit: o.DiskOvercommit, DiskSpace: diskSpace,
		MinMemoryAvailableMB: o.MinMemoryAvailableMB, MaxMemoryPressure: o.MaxMemoryPressure, MaxCPUPressure: o.MaxCPUPressure, BestEffortCap: o.BestEffortCap,
		Telemetry: !o.NoTelemetry, TelemetryRefusals: o.TelemetryRefusals, TelemetryFiles: o.TelemetryFiles,
		DataListen: o.DataListen, DataAdvertise: o.DataAdvertise,
	}
}

// APIOptions configure one apiserver (`warren apiserver`, or the one of `warren serve`).
type APIOptions struct {
	NATS    bus.DialConfig // for `warren apiserver`
	Listen  string         // default 127.0.0.1:7070
	DataDir string         // where the bootstrap admin token is written
	Logger  *slog.Logger
	// Ready, when set, is called once the API answers (with its URL and the
	// admin token, "" when another apiserver made it).
	Ready func(url, token string)
	// WaitForNode, when set, delays serving until that node reported in.
	WaitForNode string
	// Announce, when set, is called once the watcher listens, so that the
	// node of WaitForNode reports in at once rather than at its next
	// heartbeat (`warren serve`: its edge's Heartbeat; a second sooner).
	Announce func()
	// E2BListen, when set, also serves E2B's control plane there
	// (internal/e2b) over this apiserver; E2BReady is then called with its
	// URL and the admin token ("" as for Ready) before Ready.
	E2BListen string
	E2BReady  func(url, token string)
	// TrajectorySweep is how often expired trajectories are deleted (0 =
	// apiserver.DefaultSweepEvery).
	TrajectorySweep time.Duration
	// HTTP bounds the API's connections.
	HTTP HTTPLimits
}

// RunAPIServer runs one apiserver replica (`warren apiserver`) against an
// external NATS until ctx is cancelled.
func RunAPIServer(ctx context.Context, o APIOptions) error {
	if o.DataDir == "" {
		o.DataDir = "/var/lib/warren"
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:7070"
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return fmt.Errorf("apiserver: data dir: %w", err)
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("apiserver: listen %s: %w", o.Listen, err)
	}
	defer ln.Close()
	o.NATS.Name = "warren-apiserver"
	o.NATS.Role = bus.RoleAPIServer
	conn, err := bus.Dial(o.NATS)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.EnsureBuckets(ctx); err != nil {
		return err
	}
	return serveAPI(ctx, conn, ln, o)
}

// serveAPI runs the watcher, IAM and HTTP API on conn and ln until ctx ends.
func serveAPI(ctx context.Context, conn *bus.Conn, ln net.Listener, o APIOptions) error {
	log := o.Logger
	limits, err := o.HTTP.limiter(log)
	if err != nil {
		return err
	}
	ln = limits.Listen(ln)
	var e2bLn net.Listener
	if o.E2BListen != "" {
		var err error
		if e2bLn, err = net.Listen("tcp", o.E2BListen); err != nil {
			return fmt.Errorf("serve: e2b listen %s: %w", o.E2BListen, err)
		}
		defer e2bLn.Close()
		e2bLn = limits.Listen(e2bLn) // one budget for both fronts
	}
	if addr := os.Getenv("WARREN_PPROF"); addr != "" {
		// Profiling for measurements (warren sim): the default mux carries net/http/pprof.
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
	w, err := watcher.Start(ctx, watcher.Config{Bus: conn, Logger: log})
	if err != nil {
		return err
	}
	defer w.Close()
	if o.Announce != nil {
		o.Announce()
	}
	go announceAPIServer(ctx, conn)
	auth, err := iam.Open(ctx, conn)
	if err != nil {
		return err
	}
	token, err := auth.Bootstrap(ctx, o.DataDir)
	if err != nil {
		return err
	}
	api, err := apiserver.New(ctx, apiserver.Config{Bus: conn, IAM: auth, Watcher: w, Logger: log, SweepEvery: o.TrajectorySweep})
	if err != nil {
		return err
	}
	defer api.Close()
	if o.WaitForNode != "" && !w.WaitForNode(o.WaitForNode, 10*time.Second) {
		return errors.New("serve: the edge did not report in")
	}
	srv := o.HTTP.server(api, limits)
	errc := make(chan error, 2)
	// The E2B front first: once the native API answers, both are up.
	if e2bLn != nil {
		stopE2B := serveE2B(o, api, e2bLn, limits, token, errc)
		defer stopE2B()
	}
	go func() { errc <- srv.Serve(ln) }()
	url := "http://" + ln.Addr().String()
	if token != "" {
		log.Info("warren is serving", "url", url, "data_dir", o.DataDir, "admin_token_file", filepath.Join(o.DataDir, "admin-token"))
	} else {
		log.Info("warren is serving", "url", url, "data_dir", o.DataDir, "admin_token", "made by another apiserver")
	}
	if o.Ready != nil {
		o.Ready(url, token)
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: http: %w", err)
		}
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return nil
}

// serveE2B serves E2B's control plane (internal/e2b) over api on ln,
// sending the server's end to errc, and calls o.E2BReady with its URL and
// token. The returned func ends the front's live commands and shuts its
// server down.
func serveE2B(o APIOptions, api *apiserver.Server, ln net.Listener, limits *connlimit.Limiter, token string, errc chan<- error) func() {
	front := e2b.New(e2b.Config{API: api, Logger: o.Logger})
	srv := o.HTTP.server(front, limits)
	go func() { errc <- srv.Serve(ln) }()
	stop := func() {
		front.Close() // its live commands (stdin, PTYs) end, and their streams
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}
	url := "http://" + ln.Addr().String()
	o.Logger.Info("serving E2B's control plane", "url", url)
	if o.E2BReady != nil {
		o.E2BReady(url, token)
	}
	return stop
}

// limiter raises the descriptor limit to its hard value and makes the
// connection limiter of the API's listeners.
func (h HTTPLimits) limiter(log *slog.Logger) (*connlimit.Limiter, error) {
	nofile, err := connlimit.RaiseNoFile()
	if err != nil {
		log.Warn("cannot raise the descriptor limit", "err", err)
	}
	l, err := connlimit.New(connlimit.Config{Max: h.MaxConns, PerClient: h.MaxConnsPerClient, Logger: log})
	if err != nil {
		return nil, fmt.Errorf("serve: %w", err)
	}
	maxConns, perClient := l.Caps()
	log.Info("http connection limits", "max_conns", maxConns, "max_conns_per_client", perClient, "nofile", nofile)
	return l, nil
}

// server is an http.Server with h's timeouts that tells l which of its
// connections are idle.
func (h HTTPLimits) server(handler http.Handler, l *connlimit.Limiter) *http.Server {
	if h.HeaderTimeout <= 0 {
		h.HeaderTimeout = DefaultHeaderTimeout
	}
	if h.IdleTimeout <= 0 {
		h.IdleTimeout = DefaultIdleTimeout
	}
	return &http.Server{Handler: handler, ReadHeaderTimeout: h.HeaderTimeout, IdleTimeout: h.IdleTimeout, ConnState: l.ConnState}
}

func totalMemoryMB() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	var kb int64
	_, _ = fmt.Sscanf(string(b), "MemTotal: %d kB", &kb)
	return kb / 1024
}

// announceAPIServer tells the other replicas this one exists (each shares
// the quota headroom with the others).
func announceAPIServer(ctx context.Context, conn *bus.Conn) {
	id := fmt.Sprintf("%d-%x", os.Getpid(), time.Now().UnixNano())
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		_ = conn.NATS().Publish(bus.SubjectAPIServerHeartbeat, []byte(id))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
