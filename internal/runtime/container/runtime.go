package container

import (
	"context"
	"errors"
	"fmt"
	"golang.org/x/sys/unix"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/confine"
	"github.com/warrenhq/warren/internal/hoststat"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/sandboxnet"
)

// Config configures the container runtime.
type Config struct {
	// AgentPath is the warren-agent binary (static, CGO_ENABLED=0).
	AgentPath string
	// CgroupParent is the cgroup (relative to each hierarchy's root) under
	// which every sandbox gets its own; default "warren".
	CgroupParent string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// IDBase and IDRanges are the host ids of sandboxes' user namespaces:
	// IDRanges ranges of RangeSize ids from IDBase (userns.go); defaults
	// DefaultIDBase and DefaultIDRanges.
	IDBase   uint32
	IDRanges int
	// HostRoot runs sandboxes without user namespaces, as host root
	// (measurements; never the default). AllowHostRoot permits that only
	// when this kernel cannot run them in user namespaces: without it, New
	// fails there.
	HostRoot, AllowHostRoot bool
	// NetPool is the node-local IPv4 pool networked sandboxes get their
	// /31s from; default sandboxnet.DefaultPool.
	NetPool string
	// DNSUpstream is where the node's resolver for networked sandboxes
	// forwards the names they may resolve (host:port; default the host's
	// resolver).
	DNSUpstream string
	// NetEgressRateMbit is a networked sandbox's egress rate limit in
	// Mbit/s when its create sets none (0: no limit).
	NetEgressRateMbit int
	// NetMaxConns is a networked sandbox's limit of open connections
	// (0: sandboxnet.DefaultMaxConns).
	NetMaxConns uint32
	// NetIngressRateMbit is a networked sandbox's ingress rate limit in
	// Mbit/s when its create sets none (0: no limit).
	NetIngressRateMbit int
}

// SocketName is the agent's socket inside a sandbox's StateDir.
const SocketName = "agent.sock"

// LogName is the agent's stdout and stderr inside a sandbox's StateDir.
const LogName = "agent.log"

// destroyWait bounds how long Destroy waits for a cgroup to empty.
const destroyWait = 10 * time.Second

// Runtime is the "container" tier.
type Runtime struct {
	cfg Config
	log *slog.Logger
	cg  cgroupDriver

	coreSched bool // the kernel offers core-scheduling cookies

	// ids hands out the sandboxes' host id ranges; nil when sandboxes run
	// as host root (hostRoot says why). agentExe is the agent binary, open.
	ids      *idRanges
	hostRoot string
	agentExe *os.File

	// net attaches networked sandboxes (Spec.Network); it holds no state
	// a sandbox without a network pays for.
	net *sandboxnet.Manager

	classMu   sync.Mutex // ensureClass; a leaf
	classMade bool

	mu       sync.Mutex
	children map[int]chan struct{} // agents this process started, closed when reaped
	recycle  map[int]*recycleFDs   // by agent pid (recycle.go)
}

var _ runtime.Runtime = (*Runtime)(nil)

// New checks the configuration and detects the host's cgroup layout.
func New(cfg Config) (*Runtime, error) {
	if cfg.AgentPath == "" {
		return nil, errors.New("container: AgentPath is required")
	}
	if fi, err := os.Stat(cfg.AgentPath); err != nil || fi.IsDir() {
		return nil, fmt.Errorf("container: agent %s: not a file (%v)", cfg.AgentPath, err)
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "warren"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	cg, err := newCgroupDriver()
	if err != nil {
		return nil, err
	}
	r := &Runtime{cfg: cfg, log: cfg.Logger, cg: cg, coreSched: hoststat.CoreScheduling(),
		children: map[int]chan struct{}{}, recycle: map[int]*recycleFDs{}}
	if err := r.setupUserns(); err != nil {
		return nil, err
	}
	if r.net, err = sandboxnet.New(cfg.NetPool, cfg.CgroupParent); err != nil {
		return nil, err
	}
	r.net.Upstream, r.net.Log = cfg.DNSUpstream, cfg.Logger
	r.net.EgressRateMbit = cfg.NetEgressRateMbit
	r.net.MaxConns = cfg.NetMaxConns
	r.net.IngressRateMbit = cfg.NetIngressRateMbit
	return r, nil
}

// setupUserns decides whether sandboxes run in user namespaces (see
// userns.go): always, unless HostRoot says otherwise or the kernel cannot
// and AllowHostRoot permits host root.
func (r *Runtime) setupUserns() error {
	if r.cfg.HostRoot {
		r.hostRoot = "configured (HostRoot)"
		return nil
	}
	if r.cfg.IDBase == 0 {
		r.cfg.IDBase = DefaultIDBase
	}
	if r.cfg.IDRanges == 0 {
		r.cfg.IDRanges = DefaultIDRanges
	}
	ids, err := newIDRanges(r.cfg.IDBase, r.cfg.IDRanges, r.cfg.AgentPath)
	if err != nil {
		return err
	}
	if err := probeUsernsFn(ids); err != nil {
		if !r.cfg.AllowHostRoot {
			return fmt.Errorf("container: this kernel cannot run sandboxes in user namespaces (%v); "+
				"they would run as host root: pass --allow-host-root to accept that", err)
		}
		r.hostRoot = "user namespaces unavailable: " + err.Error()
		r.log.Warn("container: sandboxes run as host root (--allow-host-root)", "reason", err)
		return nil
	}
	exe, err := agentFD(r.cfg.AgentPath)
	if err != nil {
		return err
	}
	r.ids, r.agentExe = ids, exe
	go ids.refill()
	return nil
}

// Isolation says how sandboxes' root relates to the host: "userns" (each
// sandbox's root is an unprivileged range of host ids) or "host-root",
// with the reason.
func (r *Runtime) Isolation() (mode, reason string) {
	if r.ids != nil {
		return "userns", fmt.Sprintf("%d ranges of %d host ids from %d, %d in use",
			r.ids.count, RangeSize, r.ids.base, r.ids.inUse())
	}
	return "host-root", r.hostRoot
}

// Name is the tier.
func (r *Runtime) Name() string { return "container" }

// ClassBestEffort is the parent cgroup, under CgroupParent, of the
// best-effort sandboxes (CgroupParent/besteffort/<id>) where the cpu
// controller is on cgroup v2: the lowest weight and cpu.idle as a whole,
// and a CFS quota the edge sets while latency-class sandboxes run
// operations (ClassCap). Latency-class sandboxes live directly under
// CgroupParent. With the cpu controller on cgroup v1 (hybrid hosts) every
// sandbox lives directly under CgroupParent: v1 cannot cap the class
// (ErrClassCapV1), so the extra level would buy nothing.
const ClassBestEffort = "besteffort"

// classed says whether best-effort sandboxes live under ClassBestEffort.
func (r *Runtime) classed() bool {
	_, v2 := r.cg.(*v2Driver)
	return v2
}

// cgroupPathFor is where a sandbox of that class gets its cgroup.
func (r *Runtime) cgroupPathFor(id string, bestEffort bool) string {
	if bestEffort && r.classed() {
		return path.Join(r.cfg.CgroupParent, ClassBestEffort, id)
	}
	return path.Join(r.cfg.CgroupParent, id)
}

// classPath is the best-effort class's parent cgroup.
func (r *Runtime) classPath() string { return path.Join(r.cfg.CgroupParent, ClassBestEffort) }

// cgroupPath finds sandbox id's cgroup when its handle does not say
// (handles made from an id alone): under the best-effort class when it
// exists there.
func (r *Runtime) cgroupPath(id string) string {
	if be := r.cgroupPathFor(id, true); r.classed() && len(r.cg.dirs(be)) > 0 {
		return be
	}
	return r.cgroupPathFor(id, false)
}

// ensureClass creates the best-effort class's parent once.
func (r *Runtime) ensureClass() error {
	r.classMu.Lock()
	defer r.classMu.Unlock()
	if r.classMade {
		return nil
	}
	d, ok := r.cg.(*v2Driver)
	if !ok {
		return ErrClassCapV1
	}
	if err := d.createClass(r.classPath()); err != nil {
		return err
	}
	r.classMade = true
	return nil
}

// ErrClassCapV1 says the class cap is not available on cgroup v1: the
// kernel refuses a CFS quota on a parent below a quota of one of its
// descendants (tg_cfs_schedulable_down: EINVAL on v1, the effective
// minimum on v2), and every best-effort sandbox has a quota of its own (its
// cpu, its idle_cpu). A capped parent would also make every raise of a
// best-effort sandbox's quota above the cap fail, and its creation.
var ErrClassCapV1 = errors.New("container: the best-effort class cap needs the cpu controller on cgroup v2 (cgroup v1 refuses a parent quota below a child's)")

// ClassCap implements runtime.ClassCapper: a gate on the best-effort
// class's parent whose idle level is the cap and whose full level is no
// quota.
func (r *Runtime) ClassCap(cores float64) (runtime.CPUGate, error) {
	if _, v1 := r.cg.(*v1Driver); v1 {
		return nil, ErrClassCapV1
	}
	if len(r.cg.dirs(r.classPath())) == 0 {
		return nil, fmt.Errorf("%w: no best-effort class cgroup yet", runtime.ErrGone)
	}
	return r.cpuGate(runtime.Handle{ID: ClassBestEffort, Cgroup: r.classPath()}, 0, cores, false) // a cap, never a freeze
}

// Start creates the sandbox; see the package doc for the sequence, whose
// steps are listenAgent (1), makeCgroup (2), userNamespace (3), the cgroup
// driver's start (4), adopt (5) and setUp (6). Any failure undoes
// everything (undoStart).
func (r *Runtime) Start(ctx context.Context, spec *runtime.Spec) (inst *runtime.Instance, err error) {
	if err := checkStartSpec(spec); err != nil {
		return nil, err
	}
	t0 := time.Now()
	h := runtime.Handle{
		ID:     spec.ID,
		Socket: filepath.Join(spec.StateDir, SocketName),
		Cgroup: r.cgroupPathFor(spec.ID, spec.Priority == api.PriorityBestEffort),
	}
	var (
		lf     *os.File
		conn   net.Conn
		client *agentproto.Client
	)
	defer func() {
		if err != nil {
			r.undoStart(ctx, h, conn, client)
		}
	}()

	if lf, conn, err = listenAgent(spec.StateDir, h.Socket); err != nil {
		return nil, err
	}
	defer lf.Close()
	logf, err := os.OpenFile(filepath.Join(spec.StateDir, LogName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("container: agent log: %w", err)
	}
	defer logf.Close()
	tListen := time.Now()

	idle := spec.Priority == api.PriorityBestEffort
	if err := r.makeCgroup(h.Cgroup, spec, idle); err != nil {
		return nil, err
	}
	tCgroup := time.Now()

	setup := r.setupConfig(spec, h.Cgroup)
	extra, env, err := r.splitFiles(h.Cgroup)
	if err != nil {
		return nil, err
	}
	defer closeFiles(extra)
	cmd := r.agentCmd(env, logf, append([]*os.File{lf}, extra...))
	if r.ids != nil {
		mounts, err := r.userNamespace(spec, &h, setup, cmd, len(extra))
		if err != nil {
			return nil, err
		}
		defer closeFiles(mounts)
	}
	tRoot := time.Now()
	if err := r.cg.start(h.Cgroup, cmd, idle, h.IDBase); err != nil {
		return nil, fmt.Errorf("container: start agent: %w", err)
	}
	tFork := time.Now()
	if err := r.adopt(cmd, &h, spec.Priority); err != nil {
		return nil, err
	}
	lf.Close() // only the agent holds the listener now: its death resets our connection
	if err := r.attachNetwork(spec, &h); err != nil {
		return nil, err
	}

	client = agentproto.NewClient(conn)
	if err := r.setUp(ctx, client, setup, &h, spec.CPU); err != nil {
		return nil, err
	}
	tSetup := time.Now()
	r.log.Debug("container: started", "id", spec.ID, "pid", h.Pid,
		"listen", tListen.Sub(t0), "cgroup", tCgroup.Sub(tListen), "root", tRoot.Sub(tCgroup), "fork", tFork.Sub(tRoot),
		"setup", tSetup.Sub(tFork), "total", tSetup.Sub(t0))
	return &runtime.Instance{Handle: h, Agent: client}, nil
}

// checkStartSpec refuses a spec whose id is not one plain file name (no
// path, not hidden) or that has no state directory.
func checkStartSpec(spec *runtime.Spec) error {
	if spec.ID == "" || spec.ID != filepath.Base(spec.ID) || spec.ID[0] == '.' {
		return fmt.Errorf("container: bad sandbox id %q", spec.ID)
	}
	if spec.StateDir == "" {
		return errors.New("container: StateDir is required")
	}
	return nil
}

// undoStart undoes a failed Start: it closes the connection to the agent
// (through its client once there is one) and destroys what was made of
// the sandbox h.
func (r *Runtime) undoStart(ctx context.Context, h runtime.Handle, conn net.Conn, client *agentproto.Client) {
	if client != nil {
		client.Close()
	} else if conn != nil {
		conn.Close()
	}
	if derr := r.Destroy(context.WithoutCancel(ctx), h); derr != nil {
		r.log.Error("container: undo failed start", "id", h.ID, "err", derr)
	}
}

// listenAgent is step 1 of Start: it makes stateDir, listens on socket
// (0600) and connects to it right away. The connection waits in the
// backlog until the agent accepts it, so no polling for readiness is
// needed. It returns the listener's file, for the agent to inherit, and
// the connection.
func listenAgent(stateDir, socket string) (*os.File, net.Conn, error) {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("container: state dir: %w", err)
	}
	os.Remove(socket) // a stale socket of an earlier attempt
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return nil, nil, fmt.Errorf("container: listen: %w", err)
	}
	l.SetUnlinkOnClose(false) // the agent keeps listening after we let go
	lf, err := l.File()
	l.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("container: listener fd: %w", err)
	}
	if err := os.Chmod(socket, 0o600); err != nil {
		lf.Close()
		return nil, nil, fmt.Errorf("container: chmod socket: %w", err)
	}
	conn, err := net.Dial("unix", socket)
	if err != nil {
		lf.Close()
		return nil, nil, fmt.Errorf("container: connect: %w", err)
	}
	agentproto.SizeBuffers(conn)
	return lf, conn, nil
}

// makeCgroup is step 2 of Start: it creates the sandbox's cgroups at
// cgroup (making the best-effort class's parent first when an idle
// sandbox goes there), with its memory and pids limits but no CPU quota
// yet.
func (r *Runtime) makeCgroup(cgroup string, spec *runtime.Spec, idle bool) error {
	if idle && r.classed() {
		if err := r.ensureClass(); err != nil {
			return err
		}
	}
	// The CPU quota is set once the agent is set up: its start and
	// confinement (a few ms of CPU, ours, not the sandbox's) would
	// otherwise use up a small quota's first period and hold the first
	// command back until the next one (up to 100 ms).
	return r.cg.create(cgroup, limits{memoryMB: spec.MemoryMB, pids: spec.Pids, idle: idle})
}

// setupConfig is what OpSetup tells the agent of spec, the sandbox's
// cgroup being cgroup.
func (r *Runtime) setupConfig(spec *runtime.Spec, cgroup string) *agentproto.SetupConfig {
	return &agentproto.SetupConfig{
		RootDir:   spec.RootDir,
		Lowers:    spec.Lowers,
		Binds:     spec.Binds,
		Upper:     spec.Upper,
		Work:      spec.Work,
		Hostname:  spec.Hostname,
		Env:       spec.Env,
		User:      spec.User,
		Cwd:       spec.Cwd,
		Stateless: spec.Stateless,
		ShmMB:     confine.ShmMBFor(spec.MemoryMB),

		SpawnerCgroups: r.cg.spawnerCgroups(cgroup),
	}
}

// agentCmd is the command that starts the agent in its new namespaces
// (but for the user namespace: userNamespace), with the environment env,
// stdout and stderr to logf and files as its descriptors from 3 on (the
// listener first).
func (r *Runtime) agentCmd(env []string, logf *os.File, files []*os.File) *exec.Cmd {
	return &exec.Cmd{
		Path: r.cfg.AgentPath,
		// argv[0] is all a sandbox can read of PID 1 (/proc/1/cmdline;
		// exe, environ and maps are closed to it): no host path.
		Args:       []string{"warren-agent"},
		Env:        env,
		Stdout:     logf,
		Stderr:     logf,
		ExtraFiles: files,
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS |
				syscall.CLONE_NEWIPC | syscall.CLONE_NEWNET | syscall.CLONE_NEWCGROUP,
			Setsid:    true,
			Pdeathsig: 0, // sandboxes outlive the edge
		},
	}
}

// userNamespace is step 3 of Start: it allocates the sandbox's id range
// (into h.IDBase), mounts its root for it (setup then names the mounts)
// and makes cmd start the agent in a user namespace mapped to the range,
// inheriting the mounts after its nextra files of the trust split. It
// returns the mounts, for the caller to close once the agent has started.
func (r *Runtime) userNamespace(spec *runtime.Spec, h *runtime.Handle, setup *agentproto.SetupConfig, cmd *exec.Cmd, nextra int) ([]*os.File, error) {
	var err error
	if h.IDBase, err = r.ids.alloc(spec.ID); err != nil {
		return nil, err
	}
	// The mounts follow the listener and the trust split's files.
	mounts, err := r.userRoot(spec, h.IDBase, setup, agentListenFD+1+nextra)
	if err != nil {
		return nil, err
	}
	r.inUserns(cmd, h.IDBase, mounts)
	return mounts, nil
}

// adopt is step 5 of Start, once cmd has started the agent: it records the
// agent's pid and the pid's start time in h, gives a latency sandbox's
// agent a core-scheduling cookie of its own and starts reaping it.
func (r *Runtime) adopt(cmd *exec.Cmd, h *runtime.Handle, priority string) error {
	h.Pid = cmd.Process.Pid
	if priority == api.PriorityLatency {
		r.coreCookie(h.Pid)
	}
	var err error
	h.PidStart, err = pidStart(h.Pid)
	r.reap(cmd)
	if err != nil {
		return fmt.Errorf("container: agent start time: %w", err)
	}
	return nil
}

// attachNetwork attaches the sandbox's network, if spec asks for one, and
// records its address in h. It comes before setup: the sandbox's first
// command finds its network up.
func (r *Runtime) attachNetwork(spec *runtime.Spec, h *runtime.Handle) error {
	if spec.Network == nil {
		return nil
	}
	a, err := r.net.AttachWith(spec.ID, h.Pid, spec.Network.Egress, sandboxnet.AttachOptions{Group: spec.Network.Group, EgressRateMbit: spec.Network.EgressRateMbit,
		IngressRateMbit: spec.Network.IngressRateMbit, MaxConns: spec.Network.MaxConns})
	if err != nil {
		return fmt.Errorf("container: network: %w", err)
	}
	h.Net = &runtime.NetHandle{Address: a.Address.String(), Gateway: a.Gateway.String()}
	return nil
}

// setUp is step 6 of Start: the agent confines itself (OpSetup) and, with
// a network, gets its resolv.conf; then the sandbox's CPU quota (cpu
// cores; none for 0) is set.
func (r *Runtime) setUp(ctx context.Context, client *agentproto.Client, setup *agentproto.SetupConfig, h *runtime.Handle, cpu float64) error {
	var res agentproto.SetupResult
	if err := client.Call(ctx, agentproto.OpSetup, setup, &res, nil); err != nil {
		return fmt.Errorf("container: agent setup: %w", err)
	}
	if h.Net != nil {
		if err := runtime.WriteResolvConf(ctx, client, h.Net.Gateway); err != nil {
			return fmt.Errorf("container: %w", err)
		}
	}
	if cpu > 0 {
		if err := r.cg.setCPULimit(h.Cgroup, cpu); err != nil {
			return fmt.Errorf("container: cpu limit: %w", err)
		}
	}
	return nil
}

// reap waits for an agent this process started, so it never stays a zombie.
// It parks on a pidfd in the runtime's poller rather than in a blocking
// wait: os.Process.Wait would hold one OS thread per live sandbox, and
// thousands of idle sandboxes would then exhaust the host's thread and pid
// limits (a Go process dies when it cannot make a thread). The pidfd is
// the only descriptor kept per agent: os.Process's own is released.
func (r *Runtime) reap(cmd *exec.Cmd) {
	done := make(chan struct{})
	pid := cmd.Process.Pid
	r.mu.Lock()
	r.children[pid] = done
	r.mu.Unlock()
	// The agent cannot have been reaped yet, so its pid is still its own.
	pidfd, perr := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if perr == nil {
		_ = cmd.Process.Release()
	}
	go func() {
		var status any
		if perr == nil {
			waitExit(pidfd)
			var ws unix.WaitStatus
			_, err := unix.Wait4(pid, &ws, 0, nil)
			for err == unix.EINTR {
				_, err = unix.Wait4(pid, &ws, 0, nil)
			}
			status = ws
			if err != nil {
				status = err
			}
		} else {
			status = cmd.Wait()
		}
		r.mu.Lock()
		delete(r.children, pid)
		r.mu.Unlock()
		close(done)
		r.log.Debug("container: agent exited", "pid", pid, "status", status)
	}()
}

// waitExit blocks the calling goroutine (not a thread) until the process
// behind pidfd has exited, and closes pidfd.
func waitExit(pidfd int) {
	f := os.NewFile(uintptr(pidfd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	_ = rc.Read(func(fd uintptr) bool {
		// A pidfd polls readable once its process has exited.
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 0)
		return err != nil || n > 0
	})
}

// Attach reconnects to a running sandbox's agent.
func (r *Runtime) Attach(ctx context.Context, h runtime.Handle) (*runtime.Instance, error) {
	if !sameProcess(h.Pid, h.PidStart) {
		return nil, fmt.Errorf("%w: agent pid %d", runtime.ErrGone, h.Pid)
	}
	if r.ids != nil && h.IDBase != 0 {
		if err := r.ids.reserve(h.IDBase, h.ID); err != nil {
			return nil, err
		}
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", h.Socket)
	if err != nil {
		return nil, fmt.Errorf("%w: connect %s: %v", runtime.ErrGone, h.Socket, err)
	}
	if h.Net != nil {
		if err := r.net.Adopt(h.ID); err != nil {
			conn.Close()
			return nil, fmt.Errorf("container: network of %s: %w", h.ID, err)
		}
	}
	agentproto.SizeBuffers(conn)
	client := agentproto.NewClient(conn)
	if err := client.Call(ctx, agentproto.OpPing, nil, nil, nil); err != nil {
		client.Close()
		if errors.Is(err, agentproto.ErrClosed) {
			return nil, fmt.Errorf("%w: %v", runtime.ErrGone, err)
		}
		return nil, fmt.Errorf("container: ping agent: %w", err)
	}
	return &runtime.Instance{Handle: h, Agent: client}, nil
}

// Destroy kills every process of the sandbox, deletes its cgroups and
// removes its socket. It is idempotent.
func (r *Runtime) Destroy(ctx context.Context, h runtime.Handle) error {
	if h.Cgroup == "" && h.ID != "" {
		h.Cgroup = r.cgroupPath(h.ID)
	}
	if h.Cgroup == "" {
		return errors.New("container: destroy: handle names no cgroup")
	}
	r.dropFDs(h.Pid)
	// Killing PID 1 of the pid namespace kills the whole namespace.
	if h.Pid > 0 && sameProcess(h.Pid, h.PidStart) {
		syscall.Kill(h.Pid, syscall.SIGKILL)
	}
	// A paused sandbox's tasks are frozen, and a frozen task acts on its
	// SIGKILL only once thawed: thaw it, or the wait below runs out (10 s
	// per deleted paused sandbox).
	if frozen(r.cg.dirs(h.Cgroup)) {
		if err := r.cg.thaw(h.Cgroup); err != nil && !errors.Is(err, os.ErrNotExist) {
			slog.Debug("container: thaw for destroy", "cgroup", h.Cgroup, "err", err)
		}
	}
	// When we started the agent, its reaping means the namespace is empty
	// (the kernel ends PID 1's exit only after every other member is gone),
	// so the cgroups can simply be removed. Otherwise (an adopted sandbox,
	// or anything left behind) kill what the cgroups hold, then delete them.
	r.waitReaped(ctx, h.Pid)
	var errs []error
	dirs := r.cg.dirs(h.Cgroup)
	if len(dirs) > 0 && !removeDirs(dirs) {
		if err := r.killCgroup(ctx, h.Cgroup, dirs); err != nil {
			errs = append(errs, err)
		}
		if err := r.cg.remove(h.Cgroup); err != nil {
			errs = append(errs, fmt.Errorf("container: delete cgroup %s: %w", h.Cgroup, err))
		}
	}
	if h.Socket != "" {
		if err := os.Remove(h.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if h.Net != nil {
		// Its processes are gone (reaped or killed with the cgroup), so
		// its namespace and the veth pair in it go with them.
		if err := r.net.Release(h.ID); err != nil {
			errs = append(errs, fmt.Errorf("container: %w", err))
		}
	}
	if r.ids != nil && h.IDBase != 0 && len(errs) == 0 {
		r.ids.free(h.IDBase, h.ID) // no process of the range is left
	}
	return errors.Join(errs...)
}

// frozen reports whether a cgroup (its directories) is frozen or freezing:
// freezer.state on cgroup v1, cgroup.freeze on v2.
func frozen(dirs []string) bool {
	for _, d := range dirs {
		if b, err := os.ReadFile(filepath.Join(d, "freezer.state")); err == nil && strings.TrimSpace(string(b)) != "THAWED" {
			return true
		}
		if b, err := os.ReadFile(filepath.Join(d, "cgroup.freeze")); err == nil && strings.TrimSpace(string(b)) == "1" {
			return true
		}
	}
	return false
}

// removeDirs removes empty cgroup directories; false if any remains.
func removeDirs(dirs []string) bool {
	ok := true
	for _, d := range dirs {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			ok = false
		}
	}
	return ok
}

// killCgroup SIGKILLs whatever is left in the cgroup (frozen first, so
// nothing forks in between) and waits until it is empty.
func (r *Runtime) killCgroup(ctx context.Context, cgPath string, dirs []string) error {
	deadline := time.Now().Add(destroyWait)
	for attempt := 0; ; attempt++ {
		pids := procsOf(dirs)
		if len(pids) == 0 {
			return nil
		}
		if attempt%50 == 0 { // again every ~50 ms, for stragglers
			// Freeze so nothing forks between listing and killing. Thaw
			// whatever the freeze returned: a freeze that timed out may
			// still have frozen the tasks, and frozen tasks never die.
			_ = r.cg.freeze(cgPath, killFreezeTimeout)
			for _, pid := range procsOf(dirs) {
				syscall.Kill(pid, syscall.SIGKILL)
			}
			_ = r.cg.thaw(cgPath)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("container: cgroup %s still holds %v", cgPath, pids)
		}
		time.Sleep(time.Millisecond)
	}
}

// waitReaped waits (bounded) until an agent this process started is reaped.
func (r *Runtime) waitReaped(ctx context.Context, pid int) {
	r.mu.Lock()
	done, ok := r.children[pid]
	r.mu.Unlock()
	if !ok {
		return
	}
	select {
	case <-done:
	case <-ctx.Done():
	case <-time.After(destroyWait):
	}
}

// Leftovers lists the sandboxes found under CgroupParent. Pid is the
// agent's (PID 1 of the sandbox) when it is still alive; Socket is unknown.
func (r *Runtime) Leftovers(ctx context.Context) ([]runtime.Handle, error) {
	cgs, err := r.sandboxCgroups()
	if err != nil {
		return nil, fmt.Errorf("container: list cgroups: %w", err)
	}
	var out []runtime.Handle
	for _, cg := range cgs {
		id := path.Base(cg)
		h := runtime.Handle{ID: id, Cgroup: cg}
		pids := procsOf(r.cg.dirs(h.Cgroup))
		slices.Sort(pids)
		for _, pid := range pids {
			if namespacePid1(pid) {
				h.Pid = pid
				break
			}
		}
		if h.Pid == 0 && len(pids) > 0 {
			h.Pid = pids[0]
		}
		if h.Pid > 0 {
			h.PidStart, _ = pidStart(h.Pid)
			r.reserveRange(&h)
		}
		if r.net.Attached(id) {
			h.Net = &runtime.NetHandle{}
		}
		out = append(out, h)
	}
	// Networks whose sandbox has no cgroup left (a crash between them). A
	// tap is a VM's (internal/runtime/microvm): its tier sweeps it.
	live := map[string]bool{}
	for _, h := range out {
		live[h.ID] = true
	}
	if gone, err := r.net.Sweep(func(id string) bool { return live[id] || r.net.IsTap(id) }); err != nil {
		return out, fmt.Errorf("container: sweep networks: %w", err)
	} else if len(gone) > 0 {
		r.log.Info("container: removed leftover networks", "ids", gone)
	}
	return out, nil
}

// sandboxCgroups lists the sandboxes' cgroups of both classes.
func (r *Runtime) sandboxCgroups() ([]string, error) {
	names, err := r.cg.children(r.cfg.CgroupParent)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		if n != ClassBestEffort || !r.classed() {
			out = append(out, r.cgroupPathFor(n, false))
		}
	}
	if !r.classed() {
		return out, nil
	}
	be, err := r.cg.children(r.classPath())
	if err != nil {
		return nil, err
	}
	for _, n := range be {
		out = append(out, r.cgroupPathFor(n, true))
	}
	return out, nil
}

// UnifiedCgroups implements runtime.CgroupLister: the sandbox's cgroup
// and its work child in the cgroup v2 hierarchy.
func (r *Runtime) UnifiedCgroups(h runtime.Handle) []string {
	cg := h.Cgroup
	if cg == "" {
		cg = r.cgroupPath(h.ID)
	}
	u := r.cg.unified(cg)
	if u == "" {
		return nil
	}
	return splitDirs(u)
}

// UnifiedRoot implements runtime.CgroupLister.
func (r *Runtime) UnifiedRoot() string { return r.cg.unified("") }

// Freeze stops every process of the sandbox.
func (r *Runtime) Freeze(ctx context.Context, h runtime.Handle) error {
	return r.freezeThaw(h, func(p string) error { return r.cg.freeze(p, freezeTimeout) })
}

// Thaw restarts every process of the sandbox.
func (r *Runtime) Thaw(ctx context.Context, h runtime.Handle) error {
	return r.freezeThaw(h, r.cg.thaw)
}

func (r *Runtime) freezeThaw(h runtime.Handle, fn func(string) error) error {
	if h.Cgroup == "" {
		h.Cgroup = r.cgroupPath(h.ID)
	}
	err := fn(h.Cgroup)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: cgroup %s", runtime.ErrGone, h.Cgroup)
	}
	return err
}

// Close removes the parent cgroup when no sandbox remains under it (a
// node shutting down with its sandboxes kept leaves it in place), and its
// ancestors ("warren" above a per-data-dir parent) once nothing else of
// another instance is in them.
func (r *Runtime) Close() error {
	if r.ids != nil {
		r.ids.close()
	}
	if err := r.net.Close(); err != nil {
		r.log.Warn("container: remove the network table", "err", err) // the next start's sweep retries
	}
	cgs, err := r.sandboxCgroups()
	if err != nil || len(cgs) > 0 {
		return err
	}
	if r.classed() {
		if err := r.cg.remove(r.classPath()); err != nil {
			return err
		}
	}
	if err := r.cg.remove(r.cfg.CgroupParent); err != nil {
		return err
	}
	for p := path.Dir(r.cfg.CgroupParent); p != "." && p != "/"; p = path.Dir(p) {
		removeDirs(r.cg.dirs(p)) // fails (and keeps it) while another instance uses it
	}
	return nil
}

// Network is the node's sandbox networks, which the VM tiers share.
func (r *Runtime) Network() *sandboxnet.Manager { return r.net }

// NetworkDenied reads what a networked sandbox's policy refused so far.
func (r *Runtime) NetworkDenied(h runtime.Handle) (map[string]int64, error) {
	if h.Net == nil {
		return nil, nil
	}
	return r.net.Denied(h.ID)
}

// OnNetworkDenial hands every name the resolver refuses to fn.
func (r *Runtime) OnNetworkDenial(fn func(id string, d api.NetworkDenialRecord)) {
	r.net.OnDNSDenial = func(id string, d sandboxnet.DNSDenial) {
		fn(id, api.NetworkDenialRecord{Time: d.Time, Destination: d.Name, Protocol: "dns", Reason: sandboxnet.DenyDNS, Count: 1})
	}
}

// SetEgress replaces a networked sandbox's egress list.
func (r *Runtime) SetEgress(h runtime.Handle, egress []api.EgressRule) error {
	if h.Net == nil {
		return errors.New("container: the sandbox has no network")
	}
	return r.net.SetEgress(h.ID, egress)
}

// NetworkDeniedDestinations reads a networked sandbox's record of refused
// destinations.
func (r *Runtime) NetworkDeniedDestinations(h runtime.Handle) ([]api.NetworkDenial, error) {
	if h.Net == nil {
		return nil, nil
	}
	return r.net.Denials(h.ID)
}
