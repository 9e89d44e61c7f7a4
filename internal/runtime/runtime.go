// Package runtime defines the interface every sandbox tier implements. The
// edge is its only user; one package per tier lives below this one.
package runtime

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
)

// ErrNoDisplay means the sandbox has no screen (it was not created with
// one, or its tier has none).
var ErrNoDisplay = errors.New("runtime: the sandbox has no display")

// ErrGone means the sandbox's processes no longer exist.
var ErrGone = errors.New("runtime: sandbox is gone")

// Spec is everything a runtime needs to start one sandbox. The edge has
// already prepared the directories it names.
type Spec struct {
	ID       string // sb-<node>-<random>
	Hostname string
	// StateDir is a private host directory for this sandbox (sockets, pid
	// files). It is never visible inside the sandbox.
	StateDir string
	// RootDir is an empty host directory where the root is assembled.
	RootDir string
	// Lowers are read-only layer directories, top-most first.
	Lowers []string
	// Binds attach read-only layer directories at paths inside the root.
	Binds []agentproto.Bind
	// Upper and Work are the private writable overlay directories.
	Upper string
	Work  string

	CPU      float64 // cores (cfs quota); 0 = unlimited
	MemoryMB int64   // 0 = unlimited
	Pids     int64   // 0 = unlimited
	Env      map[string]string
	User     string
	// Cwd is the default directory of exec (the image's WORKDIR); "" =
	// the user's home directory.
	Cwd string
	// Stateless, when set, makes a reusable sandbox (the FnCall tier): a
	// read-only root where only these directories (empty tmpfs) are
	// writable; the agent's OpReset returns it to its initial state.
	Stateless []string
	// Priority is the QoS class (api.PriorityBestEffort or
	// api.PriorityLatency; "" = latency, i.e. normal scheduling).
	Priority string
	// Network, when set, gives the sandbox an interface, an address and a
	// default route, and lets it reach the destinations of Egress only
	// (internal/sandboxnet). Nil: loopback only.
	Network *NetworkSpec
	// DiskMB is the sandbox's disk limit (0 = the tier's default). The
	// container tier's comes from its writable storage; the microvm tier
	// sizes the VM's writable disk with it.
	DiskMB int64
	// Tier is the sandbox's tier (api.Tier*; "" = the container tier):
	// internal/runtime/tiers starts it on that tier's runtime.
	Tier string
	// Display gives the sandbox a virtual screen (the vm tier only).
	Display bool
	// Disk, set instead of Lowers for the vm tier, is a disk image (a
	// self-contained qcow2 file of the image store, internal/image) that
	// the VM boots with its own bootloader, kernel and init; the sandbox
	// writes to a copy-on-write overlay over it.
	Disk string
}

// NetworkSpec is a sandbox's opt-in network, parsed.
type NetworkSpec struct {
	Egress []api.EgressRule
	// Group is the key of the sandbox's network group, unique on the node
	// (project and name; "" = none): its members reach each other.
	Group string
	// EgressRateMbit bounds what the sandbox sends (0: the node's default).
	EgressRateMbit int
	// IngressRateMbit bounds what it receives (0: the node's default).
	IngressRateMbit int
	// MaxConns bounds its open connections (0: the node's default).
	MaxConns int
}

// NetHandle is a networked sandbox's addresses.
type NetHandle struct {
	Address string `json:"address"`
	Gateway string `json:"gateway"`
}

// Handle is what the edge persists to find a sandbox again after it restarts.
type Handle struct {
	ID string `json:"id"`
	// Tier is the runtime that made the sandbox ("" = container).
	Tier     string `json:"tier,omitempty"`
	Pid      int    `json:"pid"`       // host pid of the agent
	PidStart uint64 `json:"pid_start"` // start time of that pid (from /proc/<pid>/stat), guards pid reuse
	Socket   string `json:"socket"`    // the agent's listening socket, a host path
	Cgroup   string `json:"cgroup"`    // cgroup path relative to each hierarchy's root
	// IDBase is the host id that the sandbox's root is (its user namespace
	// maps ids 0..65535 to IDBase..IDBase+65535); 0 when the sandbox runs
	// as host root. Files in its writable layer carry these host ids.
	IDBase uint32 `json:"id_base,omitempty"`
	// Net is set when the sandbox has a network (Spec.Network).
	Net *NetHandle `json:"net,omitempty"`
}

// Instance is a live sandbox with a connected agent.
type Instance struct {
	Handle Handle
	Agent  *agentproto.Client
}

// Runtime starts and stops sandboxes of one tier.
type Runtime interface {
	// Name is the tier ("container").
	Name() string
	// Start creates the sandbox and returns once its agent serves.
	Start(ctx context.Context, spec *Spec) (*Instance, error)
	// Attach reconnects to a sandbox that outlived a restart of the edge.
	// It returns ErrGone when the sandbox's processes are dead.
	Attach(ctx context.Context, h Handle) (*Instance, error)
	// Destroy kills every process of the sandbox and frees its cgroups and
	// sockets. It is idempotent and works on dead or half-created sandboxes.
	Destroy(ctx context.Context, h Handle) error
	// Leftovers lists handles of sandboxes this runtime finds on the host
	// (cgroups it made) so the edge can destroy the ones it does not know.
	Leftovers(ctx context.Context) ([]Handle, error)
	// Freeze and Thaw stop and restart every process of the sandbox.
	Freeze(ctx context.Context, h Handle) error
	Thaw(ctx context.Context, h Handle) error
}

// Reclaimer is implemented by runtimes that can push a frozen sandbox's
// memory out (to swap) and give it back. The edge uses it to pause.
type Reclaimer interface {
	// Reclaim reclaims as much of the sandbox's memory as the host allows
	// (anonymous pages to swap, page cache dropped) and keeps its memory
	// limit low until Restore. It returns the sandbox's charged memory
	// before and after, in bytes.
	Reclaim(ctx context.Context, h Handle) (before, after int64, err error)
	// Restore sets the memory limit back to memoryMB.
	Restore(ctx context.Context, h Handle, memoryMB int64) error
	// Prefetch starts reading the sandbox's swapped-out memory back ahead
	// of use (after Restore) and returns the bytes it asked for: the
	// agent's alone (rest false), or every other process's (rest true).
	Prefetch(ctx context.Context, h Handle, rest bool) (int64, error)
}

// KillCounter is implemented by runtimes that can tell what the kernel
// refused or killed in a sandbox: the edge reads it to say why a command
// ended (oom_killed, pids_limited).
type KillCounter interface {
	// OOMKills is the sandbox's count of OOM kills so far.
	OOMKills(h Handle) (int64, error)
	// PidsRefused is how many forks its pids limit refused so far.
	PidsRefused(h Handle) (int64, error)
}

// NetworkReporter is implemented by runtimes that give sandboxes networks:
// what each one's policy refused so far, by reason (sandboxnet.Deny*).
type NetworkReporter interface {
	NetworkDenied(h Handle) (map[string]int64, error)
	// NetworkDeniedDestinations is the bounded record of what was
	// refused: destination, protocol, reason and count.
	NetworkDeniedDestinations(h Handle) ([]api.NetworkDenial, error)
}

// DenialNotifier is implemented by runtimes that hear of refusals as they
// happen (names refused by the node's resolver); fn must not block.
type DenialNotifier interface {
	OnNetworkDenial(fn func(id string, d api.NetworkDenialRecord))
}

// NetworkSetter is implemented by runtimes that can replace a running
// sandbox's egress list.
type NetworkSetter interface {
	SetEgress(h Handle, egress []api.EgressRule) error
}

// MemoryForker is implemented by runtimes whose sandboxes can be forked
// from memory: Fork starts one sandbox per spec from a memory snapshot of
// h's running sandbox, each continuing its processes with an identity of
// its own (hostname: the spec's, else its ID; machine-id; entropy). The
// source runs on afterwards. On an error nothing of the children is left.
type MemoryForker interface {
	Fork(ctx context.Context, h Handle, specs []*Spec) ([]*Instance, error)
}

// ErrNoMemoryFork means a sandbox's tier cannot fork from memory.
var ErrNoMemoryFork = errors.New("runtime: this tier cannot fork from memory")

// ErrNotReusable means a sandbox's container cannot be recycled (something
// of it could outlive it); destroy it instead.
var ErrNotReusable = errors.New("runtime: sandbox cannot be reused")

// Recycler is implemented by runtimes that can reuse the container of a
// deleted sandbox for a new sandbox of the same shape (limits, hostname,
// priority), which saves most of what a start costs. A recycled sandbox
// is wiped, rerooted (once or more) and resumed, in that order.
type Recycler interface {
	// Wipe ends everything of the sandbox behind inst that could reach
	// its next user: its processes, IPC objects, sessions. It fails,
	// wrapping ErrNotReusable, when something would outlive it anyway;
	// the sandbox must then be destroyed (so on any error).
	Wipe(ctx context.Context, inst *Instance) error
	// Reroot gives a wiped sandbox a fresh root of spec's Lowers, Upper
	// and Work and lets its old root go (so the caller may free it). On
	// an error the sandbox must be destroyed.
	Reroot(ctx context.Context, inst *Instance, spec *Spec) error
	// Resume makes a rerooted sandbox serve again, with spec's Env and
	// User. On an error the sandbox must be destroyed.
	Resume(ctx context.Context, inst *Instance, spec *Spec) error
}

// Usage is what a runtime measures of all its sandboxes together.
type Usage struct {
	CPUSeconds  float64 // cumulative CPU time of every sandbox
	MemoryBytes int64   // memory charged to the sandboxes now
}

// UsageReporter is implemented by runtimes that can measure their
// sandboxes as a whole (for the node view).
type UsageReporter interface {
	Usage() (Usage, error)
}

// CPUGater is implemented by runtimes that can switch a sandbox's CPU
// between two levels with a single write (docs/architecture.md, "Density
// and elasticity"): the edge gives a sandbox its full CPU while an
// operation runs and its idle budget between operations.
type CPUGater interface {
	// CPUGate opens the sandbox's CPU controls with its two levels, in
	// cores: full (0 = unlimited) and idle (the kernel's minimum quota at
	// least; 0 also freezes the sandbox, its agent too, at the idle
	// level). The caller closes it.
	CPUGate(h Handle, full, idle float64) (CPUGate, error)
}

// ClassCapper is implemented by runtimes whose best-effort sandboxes
// share one parent cgroup (docs/architecture.md, "Density and
// elasticity"): the edge caps that parent while latency-class sandboxes run
// operations. ClassCap opens the class's CPU controls with the cap, in
// cores; the gate's Set(true) releases the cap, Set(false) applies it.
// ErrGone: no best-effort sandbox was ever started (nothing to cap).
type ClassCapper interface {
	ClassCap(cores float64) (CPUGate, error)
}

// CPUGate switches one sandbox's CPU quota. Its methods are not safe for
// concurrent use: the edge calls them under the sandbox's lock.
type CPUGate interface {
	// Set gives the sandbox its full CPU (true) or its idle budget (false).
	// The quota holds when Set returns: a task throttled under the idle
	// budget, or frozen, runs again at once.
	Set(full bool) error
	// Sample reads the sandbox's cumulative CPU time and how long its
	// processes were held back by its quota, in nanoseconds.
	Sample() (usage, throttled int64, err error)
	Close() error
}

// CgroupLister is implemented by runtimes whose sandboxes live in cgroup v2
// directories: the edge registers them with the node's telemetry
// (internal/telemetry), which recognises a sandbox's processes by them.
type CgroupLister interface {
	// UnifiedCgroups are the sandbox's directories in the cgroup v2
	// hierarchy (its cgroup and the trust split's child), none when the
	// host mounts no v2 hierarchy.
	UnifiedCgroups(h Handle) []string
	// UnifiedRoot is where the host mounts the cgroup v2 hierarchy, ""
	// when nowhere.
	UnifiedRoot() string
}

// SandboxUsageReporter is implemented by runtimes that can measure one
// sandbox (its container's cgroup: CPU time since the container started,
// memory charged now).
type SandboxUsageReporter interface {
	SandboxUsage(h Handle) (Usage, error)
}

// PortDialer is implemented by runtimes that can connect to a port on a
// sandbox's own loopback (issue 16, "ports in"): the edge forwards the
// API's port streams over such connections. It works for sandboxes
// without a network too.
type PortDialer interface {
	DialPort(ctx context.Context, h Handle, port int) (net.Conn, error)
}

// DisplayInput is one input event for a sandbox's screen (the API's).
type DisplayInput = api.DisplayInput

// Display is a runtime whose sandboxes may have a screen (the vm tier).
// Each method returns ErrNoDisplay for a sandbox without one.
type Display interface {
	// Screenshot is the screen as a PNG.
	Screenshot(ctx context.Context, h Handle) ([]byte, error)
	// SendInput sends keyboard or mouse input; a bad event is an error
	// wrapping ErrBadInput.
	SendInput(ctx context.Context, h Handle, in DisplayInput) error
	// DialDisplay connects to the screen's VNC server (RFB).
	DialDisplay(ctx context.Context, h Handle) (net.Conn, error)
}

// ErrBadInput means a display input event is malformed.
var ErrBadInput = errors.New("runtime: bad display input")

// WriteResolvConf names a networked sandbox's gateway (where the node's
// resolver answers, internal/sandboxnet) as its resolver, through its
// agent. A symlink there (to a file the image does not have) is replaced.
func WriteResolvConf(ctx context.Context, c *agentproto.Client, gateway string) error {
	w := &agentproto.WriteRequest{Path: "/etc/resolv.conf", Data: []byte("nameserver " + gateway + "\noptions ndots:0\n"), Mode: 0o644}
	err := c.Call(ctx, agentproto.OpFileWrite, w, nil, nil)
	if err != nil {
		_ = c.Call(ctx, agentproto.OpFileRemove, &agentproto.RemoveRequest{Path: w.Path}, nil, nil)
		err = c.Call(ctx, agentproto.OpFileWrite, w, nil, nil)
	}
	if err != nil {
		return fmt.Errorf("write /etc/resolv.conf: %w", err)
	}
	return nil
}
