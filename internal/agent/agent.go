// Package agent is warren-agent: PID 1 inside a sandbox. It serves the
// agentproto protocol on an inherited listening socket (fd 3), reaps every
// zombie, runs commands in sessions and performs file operations resolved
// inside the sandbox root.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/confine"
)

// ListenFD is the descriptor of the inherited listening socket.
const ListenFD = 3

// confineEnter mounts the sandbox root, pivots into it and drops privileges.
var confineEnter = confine.Enter

// Main runs the agent until the listening socket fails; it never returns
// normally.
func Main() {
	// At most two Ps: the agent mostly waits, and on a big host the default
	// (one P per CPU) would multiply threads in every one of thousands of
	// agents. One P measured slower here (a blocking fork holds the only P
	// until sysmon hands it off): 1.55 vs 1.32 ms exec p50.
	goruntime.GOMAXPROCS(min(2, goruntime.NumCPU()))
	split, splitErr := inheritedSplit()
	closeInheritedFDs(keptFDs())
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	slog.SetDefault(log)
	f := os.NewFile(ListenFD, "listener")
	ln, err := net.FileListener(f)
	if err != nil {
		log.Error("agent: fd 3 is not a listening socket", "err", err)
		os.Exit(2)
	}
	f.Close()
	a := New(log)
	a.split = split
	if splitErr != nil {
		log.Error("agent: trust split", "err", splitErr)
	}
	if err := a.Serve(ln); err != nil {
		log.Error("agent: serve", "err", err)
		os.Exit(1)
	}
}

// Agent is the state of one agent process.
type Agent struct {
	log    *slog.Logger
	reaper *reaper
	// spawner forks every sandbox process from one thread whose bounding
	// set is cut (nil when unconfined: tests).
	spawner *spawner
	// split is the sandbox's trust split (isolate.go); nil without one.
	split *trustSplit
	// gate: ordinary spawns hold it for reading, a trusted command for
	// writing over its whole run (isolate.go).
	gate sync.RWMutex

	mu      sync.Mutex
	setup   bool
	cfg     agentproto.SetupConfig
	root    *fsRoot // file operations root
	shell   string
	baseEnv map[string]string
	defUser *credential // nil: run as the agent's own user
	pool    *warmPool
	dotOK   bool // /proc/self/fd usable: scripts are fed through a pipe
	live    liveShells
	// zyg is a stateless sandbox's zygote (zygote.go), under mu; zygEnv
	// is the environment it starts with.
	zyg    zygoteSlot
	zygEnv map[string]string
	// resetDone is closed when the last reset requested by an exec's
	// ResetAfter is over; resetErr is its (sticky) failure. Under mu.
	resetDone chan struct{}
	resetErr  error

	// Recycling (recycle.go), under mu: wiped from OpWipe to OpResume;
	// inflight counts the requests running, idle is closed when it drops
	// to 0 during a wipe; baseline is the agent's attributes after setup.
	wiped      bool
	rerooted   bool // since the wipe
	inflight   int
	idle       chan struct{}
	baseline   procAttrs
	baselineOK bool

	sessions *sessions
	procs    *procTable
	tars     *tarPuts

	connMu  sync.Mutex
	curConn net.Conn

	// vmService: the agent is a service of a VM's own init
	// (VMServiceMain); setup then sets the VM's hostname.
	vmService bool
	// vm: the agent serves a VM's host (VMMain or VMServiceMain); setup
	// then configures the VM's network interface.
	vm bool
}

// New returns an agent. It starts the reaper and makes the agent a child
// subreaper so orphans are reaped even when it is not PID 1.
func New(log *slog.Logger) *Agent {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		log.Warn("agent: cannot become subreaper", "err", err)
	}
	// PID 1 in a pid namespace gets no default signal action, but the Go
	// runtime installs handlers, so the kernel's protection of a namespace
	// init does not apply: handle (and ignore) every signal that would end
	// a Go program. Handled signals reset to the default in children on
	// exec, ignored ones would not.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, confine.FatalSignals...)
	go logIgnoredSignals(log, sigs, time.Minute)
	return &Agent{
		log:      log,
		reaper:   startReaper(),
		sessions: newSessions(),
		procs:    newProcTable(),
		tars:     newTarPuts(),
	}
}

// logIgnoredSignals logs the signals the agent ignores: the first one,
// then at most one line per interval with how many came. A process of the
// sandbox may send them as fast as it can, and the agent's log lives on
// the host (a tmpfs shared by every sandbox of the node).
func logIgnoredSignals(log *slog.Logger, sigs <-chan os.Signal, interval time.Duration) {
	var last time.Time
	n := 0
	for s := range sigs {
		n++
		if now := time.Now(); now.Sub(last) >= interval {
			log.Info("agent: ignoring signals", "last", s, "count", n)
			last, n = now, 0
		}
	}
}

// Serve accepts connections forever. Exactly one connection is active: a new
// one replaces (closes) the previous one. Work started on an old connection
// keeps running.
func (a *Agent) Serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("accept: %w", err)
		}
		agentproto.SizeBuffers(c)
		a.connMu.Lock()
		if a.curConn != nil {
			a.curConn.Close()
		}
		a.curConn = c
		a.connMu.Unlock()
		go a.serveConn(c)
	}
}

// hostPid reads the agent's pid as the currently mounted /proc sees it (the
// host's, before confinement remounts /proc).
func hostPid() int {
	s, err := os.Readlink("/proc/self")
	if err == nil {
		var pid int
		if _, err := fmt.Sscanf(s, "%d", &pid); err == nil {
			return pid
		}
	}
	return os.Getpid()
}

// doSetup sets the sandbox up once (OpSetup): a microVM's root, the
// confinement (unless unconfined), the root directory the agent resolves
// paths in, a VM's binds and network, the defaults of every command and the
// warm shells. It holds a.mu throughout.
func (a *Agent) doSetup(ctx context.Context, cfg *agentproto.SetupConfig) (any, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.setup {
		return nil, errf(agentproto.ErrInvalid, "setup: already done")
	}
	if cfg.VMLayers > 0 || vmTemplate.pending {
		// A microVM restored from a memory template: its root first.
		if !a.vm || a.vmService {
			return nil, errf(agentproto.ErrInvalid, "setup: vm_layers is for the agent of a microVM")
		}
		if err := vmAttach(cfg.VMLayers); err != nil {
			return nil, errf(agentproto.ErrInternal, "setup: %v", err)
		}
	}
	pid := hostPid()
	rootDir := "/"
	if cfg.Unconfined {
		if cfg.RootDir != "" {
			rootDir = cfg.RootDir
		}
	} else if err := a.confineSelf(cfg); err != nil {
		return nil, err
	}
	root, err := openRoot(rootDir)
	if err != nil {
		return nil, errf(agentproto.ErrInternal, "setup: open root %s: %v", rootDir, err)
	}
	if err := a.setupMachine(cfg); err != nil {
		return nil, err
	}
	if err := a.adoptConfig(root, cfg); err != nil {
		return nil, err
	}
	a.prepareCommands(cfg)
	a.log.Info("agent: set up", "root", rootDir, "unconfined", cfg.Unconfined, "shell", a.shell)
	return &agentproto.SetupResult{Pid: pid, Proto: agentproto.Proto}, nil
}

// confineSelf confines the agent for setup: it starts the spawner thread,
// enters the confinement and has the spawner cut its bounding set, in that
// order, and keeps the spawner in a.spawner. Its caller holds a.mu.
func (a *Agent) confineSelf(cfg *agentproto.SetupConfig) error {
	// The spawner thread starts before confinement, while the host's
	// cgroup file systems are still in reach, to join the cgroups of
	// the sandbox's processes; Enter confines it with every other
	// thread, and it cuts its bounding set afterwards.
	sp, err := startSpawner(func() error { return joinCgroups(cfg.SpawnerCgroups) })
	if err != nil {
		a.log.Error("agent: spawner thread", "err", err)
		return errf(agentproto.ErrInternal, "setup: spawner: %v", err)
	}
	if err := confineEnter(cfg); err != nil {
		a.log.Error("agent: confinement failed", "err", err)
		return errf(agentproto.ErrInternal, "setup: confine: %v", err)
	}
	if _, err := sp.run(func() (int, error) { return 0, confine.DropBoundingSet() }); err != nil {
		a.log.Error("agent: spawner thread", "err", err)
		return errf(agentproto.ErrInternal, "setup: spawner: %v", err)
	}
	a.spawner = sp
	return nil
}

// setupMachine does setup's part that a VM's agent alone does: the
// service VM's hostname, a microVM's layer binds and a VM's network
// interface (which any other agent refuses). Its caller holds a.mu.
func (a *Agent) setupMachine(cfg *agentproto.SetupConfig) error {
	if a.vmService && cfg.Hostname != "" {
		if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
			a.log.Warn("agent: sethostname", "err", err)
		}
	}
	if a.vm && !a.vmService {
		// A microVM's layers attached at paths (a VM booted from its own
		// disk has no layers).
		if err := vmBinds(cfg.Binds); err != nil {
			return errf(agentproto.ErrInternal, "setup: %v", err)
		}
	}
	if cfg.Net != nil {
		if !a.vm {
			return errf(agentproto.ErrInvalid, "setup: a network interface is configured by a VM's agent only")
		}
		if err := vmNetwork(cfg.Net); err != nil {
			return errf(agentproto.ErrInternal, "setup: network: %v", err)
		}
	}
	return nil
}

// adoptConfig keeps the root and the configuration, with the defaults
// every command starts from (shell, environment, user), and marks the
// agent set up. Its caller holds a.mu.
func (a *Agent) adoptConfig(root *fsRoot, cfg *agentproto.SetupConfig) error {
	a.root = root
	a.cfg = *cfg
	a.shell = cfg.Shell
	if a.shell == "" {
		a.shell = "/bin/sh"
	}
	a.baseEnv = map[string]string{"PATH": defaultPath}
	for k, v := range cfg.Env {
		a.baseEnv[k] = v
	}
	if cfg.User != "" {
		cred, err := resolveUser(root, cfg.User)
		if err != nil {
			return err
		}
		a.defUser = cred
	}
	_, err := os.Stat("/proc/self/fd")
	a.dotOK = err == nil
	a.setup = true
	return nil
}

// prepareCommands readies what commands run with once the agent is set
// up: the live shells' FIFO directory, the warm shells, a stateless
// worker's scheduling and (confined) the baseline of the sandbox. Its
// caller holds a.mu.
func (a *Agent) prepareCommands(cfg *agentproto.SetupConfig) {
	// Live shells' and the zygote's per-command FIFOs: in the sandbox's
	// private /dev tmpfs (a tmpfs of their own in a stateless sandbox), or
	// (unconfined: tests) in a directory any user can reach.
	a.live.dir = confine.FIFODir
	if cfg.Unconfined {
		a.live.dir = UnconfinedFIFODir(os.Getpid())
	}
	if a.dotOK {
		// Warm shells start with the environment and directory a default
		// session's first command gets; scripts adjust the difference.
		plan, err := a.plan(&agentproto.ExecRequest{Cmd: "true"})
		if err == nil {
			a.pool = newWarmPool(a, warmShells, a.shell, plan.env, plan.cwd, a.defUser, len(cfg.Stateless) > 0)
			a.zygEnv = plan.env
		}
	}
	if len(cfg.Stateless) > 0 && !cfg.Unconfined {
		// An FnCall worker serves one task at a time, many per second, and
		// there are few of them: one P (no fork on a task's path: the
		// zygote forks) and a lazier GC trade a little memory for CPU.
		goruntime.GOMAXPROCS(1)
		debug.SetGCPercent(400)
	}
	if !cfg.Unconfined {
		a.recordBaseline()
	}
}

// UnconfinedFIFODir is where an unconfined agent (tests) makes the FIFOs and
// scripts of its live shells: on the host's /dev/shm (a tmpfs, like the
// sandbox's /dev), else in the temporary directory.
func UnconfinedFIFODir(pid int) string {
	base := "/dev/shm"
	if st, err := os.Stat(base); err != nil || !st.IsDir() {
		base = os.TempDir()
	}
	return filepath.Join(base, "warren-fifo-"+strconv.Itoa(pid))
}

// warmShells is how many idle shells of the default user are kept ready.
const warmShells = 2

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

func (a *Agent) isSetup() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.setup
}

// keptFDs is N of agentproto.KeepFDsEnv (0 when absent or malformed), and
// unsets it.
func keptFDs() int {
	v := os.Getenv(agentproto.KeepFDsEnv)
	os.Unsetenv(agentproto.KeepFDsEnv)
	if n, err := strconv.Atoi(v); err == nil && n > 0 && n < 1024 {
		return n
	}
	return 0
}

// closeInheritedFDs closes every descriptor above the listener that the
// agent inherited by accident (whatever its starter leaked without
// close-on-exec), so no sandboxed process can ever receive one. The keep
// descriptors right after the listener stay, close-on-exec.
func closeInheritedFDs(keep int) {
	_ = unix.CloseRange(ListenFD+1, uint(ListenFD+keep), unix.CLOSE_RANGE_CLOEXEC)
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		// No /proc: mark everything above the listener close-on-exec.
		_ = unix.CloseRange(ListenFD+1, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
		return
	}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd <= ListenFD+keep {
			continue
		}
		flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
		if err == nil && flags&unix.FD_CLOEXEC == 0 {
			_ = unix.Close(fd)
		}
	}
}
