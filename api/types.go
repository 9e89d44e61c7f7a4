// Package api holds the wire types of warren's REST API v1. The server, the
// Go SDK and the CLI share them; api/openapi.yaml describes the same contract.
package api

import "time"

// Sandbox states.
const (
	StateCreating = "creating"
	StateRunning  = "running"
	StateStopped  = "stopped"
	StateFailed   = "failed"
	// StateLost is reported for a sandbox whose node stopped heartbeating.
	// It never comes back: its node destroys it when it returns.
	StateLost   = "lost"
	StatePaused = "paused" // frozen, memory pushed to swap; any operation resumes it
)

// QoS classes (CreateSandboxRequest.Priority).
const (
	// PriorityBestEffort runs under SCHED_IDLE with the lowest CPU weight:
	// it gets the CPU only when nothing else wants it. The default.
	PriorityBestEffort = "best-effort"
	// PriorityLatency runs with normal weight (and a core-scheduling cookie
	// where the kernel supports it).
	PriorityLatency = "latency"
)

// What the reaper does with a sandbox idle for idle_timeout seconds.
const (
	IdleActionStop  = "stop" // the default
	IdleActionPause = "pause"
)

// Tiers.
const (
	TierContainer = "container"
	TierFnCall    = "fncall" // POST /v1/fncall: stateless tasks in reset, reused containers
	// TierMicroVM runs the sandbox in a QEMU microVM (its own kernel; the
	// agent is the guest's PID 1).
	TierMicroVM = "microvm"
	// TierVM runs the sandbox in a full QEMU VM (q35: PCI, a BIOS, an
	// optional screen) with the same kernel, agent and layers as microvm.
	TierVM = "vm"
)

// Tiers are the tiers a create request may name.
var Tiers = []string{TierContainer, TierMicroVM, TierVM}

// MemoryForkTiers are the tiers whose sandboxes fork from memory
// (POST /v1/sandboxes/{id}/fork {"memory": true}).
var MemoryForkTiers = []string{TierMicroVM}

// CreateSandboxRequest is the body of POST /v1/sandboxes.
type CreateSandboxRequest struct {
	Tier        string            `json:"tier,omitempty"`
	Display     bool              `json:"display,omitempty"`   // a virtual screen (tier vm only): screenshot, display, input
	Project     string            `json:"project,omitempty"`   // default: the token's project
	Image       string            `json:"image,omitempty"`     // required unless Snapshot or Resume
	CPU         float64           `json:"cpu,omitempty"`       // cores; default 1
	MemoryMB    int64             `json:"memory_mb,omitempty"` // default 512
	DiskMB      int64             `json:"disk_mb,omitempty"`   // writable layer limit; default 1024
	Pids        int64             `json:"pids,omitempty"`      // default 1024
	Env         map[string]string `json:"env,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	TTL         int64             `json:"ttl,omitempty"`          // seconds of maximum lifetime; 0 = default
	IdleTimeout int64             `json:"idle_timeout,omitempty"` // seconds without an operation; 0 = none
	User        string            `json:"user,omitempty"`         // default user for exec
	Hostname    string            `json:"hostname,omitempty"`
	// Layers are named layers stacked above the image, bottom first
	// ("ws/django-1234@3", "toolkit/harness"), or attached at a mount point
	// ({"layer": "toolkit/harness", "mount": "/opt/toolkit", "protected": true}).
	Layers []LayerAttachment `json:"layers,omitempty"`
	// NodeSelector restricts placement to nodes carrying all these labels.
	NodeSelector map[string]string `json:"node_selector,omitempty"`
	// Priority is the QoS class: "best-effort" (default) or "latency".
	Priority string `json:"priority,omitempty"`
	// IdleTimeoutAction is "stop" (default) or "pause".
	IdleTimeoutAction string `json:"idle_timeout_action,omitempty"`
	// Snapshot restores a snapshot as the new sandbox's filesystem; image
	// and layers then come from the snapshot and must not be given.
	Snapshot string `json:"snapshot,omitempty"`
	// Trajectory names the log that records every state-changing
	// operation. With Resume, re-attach to it instead (fast-forward).
	Trajectory string `json:"trajectory,omitempty"`
	Resume     bool   `json:"resume,omitempty"`
	// Branch: on divergence during a resume, fork a new trajectory T~k
	// instead of answering 409.
	Branch bool `json:"branch,omitempty"`
	// Checkpoint: "none" (default), "every-step" (snapshot after each
	// state-changing operation) or an interval of steps ("10").
	Checkpoint string `json:"checkpoint,omitempty"`
	// TrajectoryTTL: a new trajectory (and each branch of it) is deleted,
	// with its log and inputs, this many seconds after it is made, once no
	// live sandbox records it. 0 = kept until DELETE /v1/trajectories/{name}.
	TrajectoryTTL int `json:"trajectory_ttl,omitempty"`
	// IdleCPU is the CPU, in cores, the sandbox's processes get between
	// operations (docs/architecture.md, "Density and elasticity"): while an
	// exec, a file operation or a command call runs, the sandbox has its
	// full cpu. Default 0.05; 0 = frozen between operations (no CPU at
	// all: background processes stop until the next operation).
	IdleCPU *float64 `json:"idle_cpu,omitempty"`
	// AlwaysOn keeps the full cpu between operations too (a sandbox that
	// serves a port, a long training job).
	AlwaysOn bool `json:"always_on,omitempty"`
	// Network opts into a network interface with an egress allowlist
	// enforced on the host (NetworkSpec). Absent: loopback only.
	Network *NetworkSpec `json:"network,omitempty"`
	// NetworkRules is DSec's shorthand: {"pypi": true, "npm": false}
	// adds the rules set true to Network.Egress (making Network when
	// absent); false ones are ignored.
	NetworkRules map[string]bool `json:"network_rules,omitempty"`
	// Audit declares the sandbox's workspace and policy hooks for its
	// audit (GET /v1/sandboxes/{id}/audit).
	Audit *AuditSpec `json:"audit,omitempty"`
}

// LayerAttachment is one entry of CreateSandboxRequest.Layers. In JSON it
// is either a string (a layer reference stacked into the root) or an
// object with a mount point.
type LayerAttachment struct {
	Layer     string `json:"layer"`               // "name" (latest) or "name@version"
	Mount     string `json:"mount,omitempty"`     // absolute path: a read-only bind mount there instead of a root layer
	Protected bool   `json:"protected,omitempty"` // the sandbox cannot modify, remount or shadow it; usable by trusted exec
}

// Sandbox is the public view of one sandbox.
type Sandbox struct {
	ID          string            `json:"id"`
	State       string            `json:"state"`
	Node        string            `json:"node"`
	Project     string            `json:"project,omitempty"`
	Tier        string            `json:"tier"`
	Display     bool              `json:"display,omitempty"` // it has a screen (tier vm)
	Image       string            `json:"image"`
	CPU         float64           `json:"cpu"`
	MemoryMB    int64             `json:"memory_mb"`
	DiskMB      int64             `json:"disk_mb"`
	Pids        int64             `json:"pids"`
	Labels      map[string]string `json:"labels,omitempty"`
	User        string            `json:"user,omitempty"`
	TTL         int64             `json:"ttl"`
	IdleTimeout int64             `json:"idle_timeout"`
	CreatedAt   time.Time         `json:"created_at"`
	ExpiresAt   *time.Time        `json:"expires_at,omitempty"`
	LastActive  time.Time         `json:"last_active_at"`
	Reason      string            `json:"reason,omitempty"` // why it failed or stopped
	// Layers are the named layers the sandbox was created with, resolved
	// to versions ("ws/django-1234@3", "toolkit/harness@2 at /opt/toolkit (protected)").
	Layers     []string   `json:"layers,omitempty"`
	Pool       string     `json:"pool,omitempty"` // the warm pool it was claimed from
	Priority   string     `json:"priority,omitempty"`
	IdleAction string     `json:"idle_timeout_action,omitempty"`
	PausedAt   *time.Time `json:"paused_at,omitempty"`
	// Snapshot is the snapshot the sandbox was restored from.
	Snapshot string `json:"snapshot,omitempty"`
	// Trajectory is the log the sandbox records into; Step its last step.
	Trajectory string `json:"trajectory,omitempty"`
	Step       int64  `json:"step,omitempty"`
	// Replay is how many logged steps a resuming client may still re-issue
	// and get cached (resume answers only).
	Replay int64 `json:"replay,omitempty"`
	// IdleCPU and AlwaysOn are the sandbox's CPU policy between operations.
	IdleCPU  float64 `json:"idle_cpu"`
	AlwaysOn bool    `json:"always_on,omitempty"`
	// Network is the sandbox's network as created (absent: loopback only);
	// GET /v1/sandboxes/{id}/network adds its address and refusals.
	Network *NetworkSpec `json:"network,omitempty"`
	// CPU is what the sandbox used, measured on its node (GET of one
	// sandbox only).
	CPUStats *SandboxCPU `json:"cpu_stats,omitempty"`
}

// SandboxCPU is a sandbox's CPU time (cgroup usage sampled at each switch
// between its two CPU levels), in seconds.
type SandboxCPU struct {
	// Active is CPU time used while operations ran; Idle between them.
	Active float64 `json:"active_seconds"`
	Idle   float64 `json:"idle_seconds"`
	// Throttled is how long its processes were held back by its quota:
	// between operations, the CPU harvested from it.
	Throttled float64 `json:"throttled_seconds"`
	// Level is "full" or "idle": the CPU it has now.
	Level string `json:"level"`
}

// SandboxList is the body of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// PoolRequest is the body of POST /v1/pools: keep Size sandboxes of this
// shape created and ready on every node; a create with the same shape
// (tier, image, cpu, memory_mb, disk_mb, pids, priority, and no env, user
// or hostname) claims one.
type PoolRequest struct {
	Name     string  `json:"name,omitempty"` // [a-z0-9-]; default: generated
	Tier     string  `json:"tier,omitempty"`
	Image    string  `json:"image"`
	CPU      float64 `json:"cpu,omitempty"`
	MemoryMB int64   `json:"memory_mb,omitempty"`
	DiskMB   int64   `json:"disk_mb,omitempty"`
	Pids     int64   `json:"pids,omitempty"`
	Priority string  `json:"priority,omitempty"`
	Size     int     `json:"size"`
	// Project owns the pool (default: the token's project); its members
	// serve only sandboxes of that project and below.
	Project string `json:"project,omitempty"`
}

// Pool is a warm pool's state, summed over the nodes.
type Pool struct {
	Name     string  `json:"name"`
	Project  string  `json:"project,omitempty"`
	Tier     string  `json:"tier"`
	Image    string  `json:"image"`
	CPU      float64 `json:"cpu"`
	MemoryMB int64   `json:"memory_mb"`
	DiskMB   int64   `json:"disk_mb"`
	Pids     int64   `json:"pids"`
	Priority string  `json:"priority"`
	Size     int     `json:"size"`            // per node
	Ready    int     `json:"ready"`           // created and waiting, all nodes
	Creating int     `json:"creating"`        // being created to refill
	Claimed  int64   `json:"claimed"`         // creates served from the pool so far
	Error    string  `json:"error,omitempty"` // the last refill failure
}

// PoolList is the body of GET /v1/pools.
type PoolList struct {
	Pools []Pool `json:"pools"`
}

// FnCallRequest is the body of POST /v1/fncall: one stateless task run in
// a pre-created container that is reset afterwards. Exactly one of Cmd and
// Argv is set. Files are written before the command runs; they must lie
// under one of the writable directories (/tmp, /var/tmp, /root, /home,
// /run, /work; the root is read-only). The answer is an ExecResult.
type FnCallRequest struct {
	Tier      string            `json:"tier,omitempty"`  // "fncall" or empty
	Image     string            `json:"image,omitempty"` // default busybox
	Cmd       string            `json:"cmd,omitempty"`
	Argv      []string          `json:"argv,omitempty"`
	Files     map[string][]byte `json:"files,omitempty"` // path -> content (base64 in JSON)
	Stdin     string            `json:"stdin,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`        // default /work
	Timeout   float64           `json:"timeout,omitempty"`    // seconds; default 30, at most 600
	OutputCap int64             `json:"output_cap,omitempty"` // bytes per stream; default 1 MiB
	CPU       float64           `json:"cpu,omitempty"`        // default 1
	MemoryMB  int64             `json:"memory_mb,omitempty"`  // default 512
}

// PauseRequest is the body of POST /v1/sandboxes:pause and :resume: every
// sandbox whose labels match all of Label ("key=value") and Labels.
type PauseRequest struct {
	Label  string            `json:"label,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
}

// Template is a named sandbox shape (image, layers, resources, env) of a
// project: POST /v1/templates creates one, and E2B's templateID names one.
type Template struct {
	Name    string `json:"name"`
	Project string `json:"project,omitempty"`
	// Spec is what a sandbox made from the template gets; its image is
	// required, snapshot, trajectory, resume and project are not allowed.
	Spec      CreateSandboxRequest `json:"spec"`
	CreatedAt time.Time            `json:"created_at"`
}

// TemplateList is the body of GET /v1/templates.
type TemplateList struct {
	Templates []Template `json:"templates"`
}

// TimeoutRequest is the body of POST /v1/sandboxes/{id}/timeout.
type TimeoutRequest struct {
	// TTL: the sandbox now expires this many seconds from now.
	TTL int64 `json:"ttl,omitempty"`
	// IdleTimeout, when set, replaces the idle timeout (seconds without
	// an operation, counted from now; 0 = none). At least one is given.
	IdleTimeout *int64 `json:"idle_timeout,omitempty"`
}

// ResumeRequest is the optional body of POST /v1/sandboxes/{id}/resume.
type ResumeRequest struct {
	// Prefetch reads the sandbox's swapped-out memory back ahead of use
	// (default true); false leaves it to page faults.
	Prefetch *bool `json:"prefetch,omitempty"`
}

// PauseResult lists the sandboxes paused (or resumed) and those that failed.
type PauseResult struct {
	Sandboxes []string          `json:"sandboxes"`
	Errors    map[string]string `json:"errors,omitempty"` // id -> why
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec.
// Exactly one of Cmd (a shell string run by the session's shell) and Argv is set.
type ExecRequest struct {
	Cmd        string            `json:"cmd,omitempty"`
	Argv       []string          `json:"argv,omitempty"`
	Session    string            `json:"session,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Cwd        string            `json:"cwd,omitempty"`
	Stdin      string            `json:"stdin,omitempty"`
	User       string            `json:"user,omitempty"`
	Timeout    float64           `json:"timeout,omitempty"`    // seconds; 0 = default (600)
	OutputCap  int64             `json:"output_cap,omitempty"` // bytes per stream; 0 = default (16 MiB)
	Background bool              `json:"background,omitempty"`
	// Trusted runs the command with the shell of the sandbox's first
	// protected toolkit (its bin/sh) and the toolkits' bin directories first
	// on PATH, outside any session, so nothing the sandbox changed in its
	// own root can stand in for the toolkit's programs.
	Trusted bool `json:"trusted,omitempty"`
	// KeepCPU, with Background, keeps the sandbox's full cpu between
	// operations for as long as the command runs.
	KeepCPU bool `json:"keep_cpu,omitempty"`
}

// ExecResult is the JSON answer of exec (and the last NDJSON event of a stream).
type ExecResult struct {
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	Truncated bool   `json:"truncated"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	Signal    string `json:"signal,omitempty"`
	// OOMKilled: the kernel's OOM killer ended the command (the sandbox's
	// memory limit); KilledBy names what ended a command that did not
	// exit by itself (KilledBy*); PidsLimited: a fork or thread was refused
	// by the sandbox's pids limit while the command, which failed, ran (or
	// since the last failed command).
	OOMKilled   bool   `json:"oom_killed,omitempty"`
	KilledBy    string `json:"killed_by,omitempty"`
	PidsLimited bool   `json:"pids_limited,omitempty"`
	// DiskFull: the command failed with the sandbox's disk quota used up.
	DiskFull   bool    `json:"disk_full,omitempty"`
	DurationMs float64 `json:"duration_ms"`
	CommandID  string  `json:"command_id,omitempty"` // set for background commands
	// Step is the operation's step in the sandbox's trajectory; Replayed
	// says the result came from the log and nothing ran.
	Step     int64 `json:"step,omitempty"`
	Replayed bool  `json:"replayed,omitempty"`
	// Sandbox and Trajectory are set when this operation branched a resumed
	// trajectory (branch: true): it ran on this new sandbox, recording
	// this new trajectory. Continue there.
	Sandbox    string `json:"sandbox,omitempty"`
	Trajectory string `json:"trajectory,omitempty"`
}

// What ended a command that did not exit by itself (ExecResult.KilledBy).
const (
	KilledByOOM     = "oom"     // the OOM killer, at the sandbox's memory limit
	KilledByTimeout = "timeout" // the command's timeout
	KilledBySignal  = "signal"  // a signal from elsewhere (the command itself, another process)
	KilledByPolicy  = "policy"  // an audit policy hook (CreateSandboxRequest.Audit) ended the step
)

// ExecEvent is one line of an NDJSON exec stream. Exactly one field group is set.
type ExecEvent struct {
	Stdout    *string `json:"stdout,omitempty"`
	Stderr    *string `json:"stderr,omitempty"`
	ExitCode  *int    `json:"exit_code,omitempty"`
	Truncated bool    `json:"truncated,omitempty"`
	TimedOut  bool    `json:"timed_out,omitempty"`
	Signal    string  `json:"signal,omitempty"`
	// OOMKilled, KilledBy, PidsLimited, DiskFull (on the final line): as in ExecResult.
	OOMKilled   bool     `json:"oom_killed,omitempty"`
	KilledBy    string   `json:"killed_by,omitempty"`
	PidsLimited bool     `json:"pids_limited,omitempty"`
	DiskFull    bool     `json:"disk_full,omitempty"`
	DurationMs  *float64 `json:"duration_ms,omitempty"`
	// Step, Replayed, Sandbox, Trajectory (on the final line): as in ExecResult.
	Step       int64  `json:"step,omitempty"`
	Replayed   bool   `json:"replayed,omitempty"`
	Sandbox    string `json:"sandbox,omitempty"`
	Trajectory string `json:"trajectory,omitempty"`
	Error      *Error `json:"error,omitempty"`
}

// Command is the state of a background command.
type Command struct {
	ID         string  `json:"id"`
	Running    bool    `json:"running"`
	ExitCode   *int    `json:"exit_code,omitempty"`
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	Truncated  bool    `json:"truncated"`
	TimedOut   bool    `json:"timed_out,omitempty"`
	Signal     string  `json:"signal,omitempty"`
	DurationMs float64 `json:"duration_ms"`
}

// CommandRecord is one command of a sandbox's recent history (GET
// /v1/sandboxes/{id}/commands): what ran and how it ended.
type CommandRecord struct {
	StartedAt time.Time `json:"started_at"`
	Cmd       string    `json:"cmd,omitempty"`  // clipped to 4 KiB
	Argv      []string  `json:"argv,omitempty"` // clipped to 4 KiB in all
	Session   string    `json:"session,omitempty"`
	User      string    `json:"user,omitempty"`
	Trusted   bool      `json:"trusted,omitempty"`
	// CommandID names a background command (its outcome: GET
	// /v1/sandboxes/{id}/commands/{cid}); its exit code is not here.
	CommandID  string  `json:"command_id,omitempty"`
	ExitCode   *int    `json:"exit_code,omitempty"` // absent: in the background, or it did not run (Error)
	TimedOut   bool    `json:"timed_out,omitempty"`
	Signal     string  `json:"signal,omitempty"`
	Truncated  bool    `json:"truncated,omitempty"`
	DurationMs float64 `json:"duration_ms"`
	Error      string  `json:"error,omitempty"` // why it did not run or its outcome was lost
	// KilledBy, OOMKilled, PidsLimited, DiskFull: as in ExecResult.
	KilledBy    string `json:"killed_by,omitempty"`
	OOMKilled   bool   `json:"oom_killed,omitempty"`
	PidsLimited bool   `json:"pids_limited,omitempty"`
	DiskFull    bool   `json:"disk_full,omitempty"`
}

// CommandHistory is the body of GET /v1/sandboxes/{id}/commands: the
// sandbox's most recent commands (at most MaxCommandHistory), oldest first.
type CommandHistory struct {
	Commands []CommandRecord `json:"commands"`
}

// MaxCommandHistory is how many commands a sandbox's history keeps.
const MaxCommandHistory = 100

// SandboxStats is the body of GET /v1/sandboxes/{id}/stats: what the
// sandbox uses now, measured on its node, beside its limits.
type SandboxStats struct {
	ID            string  `json:"id"`
	State         string  `json:"state"`
	CPUSeconds    float64 `json:"cpu_seconds"`  // CPU time used since it started
	MemoryBytes   int64   `json:"memory_bytes"` // memory charged to it now (page cache included)
	CPU           float64 `json:"cpu"`          // limit, cores
	MemoryLimitMB int64   `json:"memory_mb"`    // limit
	Commands      int64   `json:"commands"`     // commands run since it started
	// CPUStats splits the CPU time between operations and the time
	// between them (docs/architecture.md, "Density and elasticity").
	CPUStats *SandboxCPU `json:"cpu_stats,omitempty"`
}

// FileInfo describes one file in a sandbox.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // permission bits
	Type    string    `json:"type"` // file, dir, symlink, other
	ModTime time.Time `json:"mod_time"`
	Target  string    `json:"target,omitempty"` // symlink target
	// Step, Replayed, Sandbox, Trajectory: as in ExecResult (writes and
	// mkdirs of a trajectory sandbox).
	Step       int64  `json:"step,omitempty"`
	Replayed   bool   `json:"replayed,omitempty"`
	Sandbox    string `json:"sandbox,omitempty"`
	Trajectory string `json:"trajectory,omitempty"`
}

// FileList is the body of GET /v1/sandboxes/{id}/files?list=1.
type FileList struct {
	Files []FileInfo `json:"files"`
}

// MkdirRequest, RenameRequest: POST /v1/sandboxes/{id}/files:mkdir and :rename.
type MkdirRequest struct {
	Path    string `json:"path"`
	Mode    uint32 `json:"mode,omitempty"`
	Parents bool   `json:"parents,omitempty"`
}

type RenameRequest struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// Image is one image known to the node's image store.
type Image struct {
	Name      string    `json:"name"`
	Digest    string    `json:"digest"`
	Layers    []string  `json:"layers"`
	Size      int64     `json:"size"`
	CreatedAt time.Time `json:"created_at"`
	// Config holds the defaults a sandbox of the image gets (its
	// environment, working directory and user), and what a Dockerfile
	// recorded (cmd, entrypoint, labels, exposed ports).
	Config *ImageConfig `json:"config,omitempty"`
	// Disk is set on a VM disk image (imported with `warren image import
	// --disk`): sandboxes of tier "vm" boot it with its own bootloader,
	// kernel and init. Such an image has no layers.
	Disk *ImageDisk `json:"disk,omitempty"`
}

// ImageDisk describes a VM disk image.
type ImageDisk struct {
	// Format is the imported file's format ("qcow2" or "raw"); the node
	// stores it as a self-contained qcow2.
	Format string `json:"format"`
	// VirtualSize is the disk's size as the guest sees it, in bytes.
	VirtualSize int64 `json:"virtual_size"`
	// StoredSize is the stored qcow2's size in bytes.
	StoredSize int64 `json:"stored_size"`
}

// ImageConfig is the part of an OCI image config warren keeps. A sandbox
// created from the image gets Env as its base environment, WorkingDir as
// the default directory of exec and User as its default user; the others
// are recorded only (a sandbox runs no command of its own).
type ImageConfig struct {
	Env          []string          `json:"env,omitempty"` // KEY=VALUE
	WorkingDir   string            `json:"working_dir,omitempty"`
	User         string            `json:"user,omitempty"`
	Cmd          []string          `json:"cmd,omitempty"`
	Entrypoint   []string          `json:"entrypoint,omitempty"`
	Labels       map[string]string `json:"labels,omitempty"`
	ExposedPorts []string          `json:"exposed_ports,omitempty"`
}

// CommitImageRequest is the body of POST /v1/images:commit: store Name as
// the image Base (empty or "scratch": no layers) with the named layers
// (bottom first, "name@version") stacked above it. Config's environment is
// merged over the base's (a KEY given here replaces the base's); each
// other field that is set replaces the base's. An existing image of that
// name is replaced. This is the last step of `warren image build`.
type CommitImageRequest struct {
	Name   string       `json:"name"`
	Base   string       `json:"base,omitempty"`
	Layers []string     `json:"layers,omitempty"`
	Config *ImageConfig `json:"config,omitempty"`
}

type ImageList struct {
	Images []Image `json:"images"`
}

// PullImageRequest is the body of POST /v1/images: pull ref from an OCI
// registry and store it as name (default: ref).
type PullImageRequest struct {
	Ref  string `json:"ref"`
	Name string `json:"name,omitempty"`
}

// Layer is one version of a named layer.
type Layer struct {
	Name       string    `json:"name"`
	Version    int       `json:"version"`
	Digest     string    `json:"digest"`      // diff id of the layer tar, sha256:<hex>
	Size       int64     `json:"size"`        // bytes of the uncompressed layer tar
	Entries    int       `json:"entries"`     // files, directories, links
	StoredSize int64     `json:"stored_size"` // bytes of its EROFS image in the store
	Source     string    `json:"source,omitempty"`
	Project    string    `json:"project,omitempty"` // the owner; "" = made by a root token: every project may read it
	CreatedAt  time.Time `json:"created_at"`
}

type LayerList struct {
	Layers []Layer `json:"layers"`
}

// CreateLayerRequest is the JSON body of POST /v1/layers that packs a
// sandbox's changes. (A tar body with ?name=&version= uploads a layer.)
type CreateLayerRequest struct {
	Name        string `json:"name"`
	Version     int    `json:"version,omitempty"` // 0 = the next version
	FromSandbox string `json:"from_sandbox"`
}

// GCResult answers POST /v1/layers/gc.
type GCResult struct {
	Removed []string `json:"removed"`
	Bytes   int64    `json:"bytes"`
	Kept    int      `json:"kept"`
}

// CreateSnapshotRequest is the body of POST /v1/sandboxes/{id}/snapshots.
type CreateSnapshotRequest struct {
	Name string `json:"name,omitempty"`
	Stop bool   `json:"stop,omitempty"` // stop the sandbox after the snapshot
}

// Snapshot is a sandbox's filesystem at one moment: its image, its named
// layers and every earlier diff (Layers, bottom first; the last entry is
// this snapshot's own diff). Process memory is not captured.
type Snapshot struct {
	ID      string            `json:"id"`
	Name    string            `json:"name,omitempty"`
	Sandbox string            `json:"sandbox"`
	Project string            `json:"project,omitempty"` // the sandbox's project, which owns the snapshot
	Image   string            `json:"image"`
	Layers  []LayerAttachment `json:"layers"`
	Diff    string            `json:"diff"`   // the named layer holding this snapshot's changes (snap/<id>@1)
	Digest  string            `json:"digest"` // diff id of that layer
	Size    int64             `json:"size"`   // bytes of the diff (uncompressed tar)
	Entries int               `json:"entries"`
	Parent  string            `json:"parent,omitempty"` // the snapshot the sandbox was restored from
	// Previous: the earlier snapshot of the same sandbox this one chains
	// on (it packs only what changed since); empty for a full snapshot.
	Previous   string    `json:"previous,omitempty"`
	Step       int64     `json:"step,omitempty"`       // trajectory step it was taken after (checkpoints)
	Trajectory string    `json:"trajectory,omitempty"` // the trajectory it checkpoints
	FrozenMs   float64   `json:"frozen_ms"`            // how long the sandbox was frozen
	CreatedAt  time.Time `json:"created_at"`
}

// SnapshotList is the body of GET /v1/snapshots: the snapshots of the
// caller's project and the projects below it, newest first.
type SnapshotList struct {
	Snapshots []Snapshot `json:"snapshots"`
}

// Trajectory describes one trajectory (GET /v1/trajectories): its owner,
// its current sandbox, the bytes it holds (log and inputs) and when it
// expires (ttl; zero = never).
type Trajectory struct {
	Name           string    `json:"name"`
	Project        string    `json:"project,omitempty"`
	Sandbox        string    `json:"sandbox"`
	Parent         string    `json:"parent,omitempty"`
	CheckpointSnap string    `json:"checkpoint_snapshot,omitempty"`
	Bytes          int64     `json:"bytes"`
	CreatedAt      time.Time `json:"created_at"`
	ExpiresAt      time.Time `json:"expires_at,omitzero"`
}

// TrajectoryList is the body of GET /v1/trajectories.
type TrajectoryList struct {
	Trajectories []Trajectory `json:"trajectories"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	Count int `json:"count"`
	// Memory forks from a memory snapshot: the children continue the
	// source's running processes (tiers MemoryForkTiers only).
	Memory bool `json:"memory,omitempty"`
}

// ForkResult answers a fork: the snapshot (a disk fork's; none for a
// memory fork) and the new sandboxes.
type ForkResult struct {
	Snapshot  *Snapshot `json:"snapshot,omitempty"`
	Sandboxes []Sandbox `json:"sandboxes"`
}

// TrajectoryStep is one logged operation with its result.
type TrajectoryStep struct {
	Step    int64     `json:"step"`
	Op      string    `json:"op"` // exec, write, remove, rename, mkdir, network
	Sandbox string    `json:"sandbox"`
	At      time.Time `json:"at"`
	// The operation.
	Exec      *ExecRequest `json:"exec,omitempty"`
	StdinHash string       `json:"stdin_sha256,omitempty"`
	Path      string       `json:"path,omitempty"`
	To        string       `json:"to,omitempty"`
	Mode      uint32       `json:"mode,omitempty"`
	Recursive bool         `json:"recursive,omitempty"`
	Parents   bool         `json:"parents,omitempty"`
	Append    bool         `json:"append,omitempty"`
	DataHash  string       `json:"data_sha256,omitempty"`
	DataSize  int64        `json:"data_size,omitempty"`
	// Egress is the list a "network" step set (PUT …/network).
	Egress []string `json:"egress,omitempty"`
	// The result.
	Result *ExecResult `json:"result,omitempty"`
	File   *FileInfo   `json:"file,omitempty"`
	Error  *Error      `json:"error,omitempty"`
	// Checkpoint is the snapshot taken after this step, if any.
	Checkpoint string `json:"checkpoint,omitempty"`
	// Audit is what the sandbox's processes did during the step, on
	// GET /v1/trajectories/{name}?audit=1 only (never in the log).
	Audit []AuditRecord `json:"audit,omitempty"`
}

// TrajectoryPage is the body of GET /v1/trajectories/{name}.
type TrajectoryPage struct {
	Trajectory string           `json:"trajectory"`
	Sandbox    string           `json:"sandbox"`
	Steps      []TrajectoryStep `json:"steps"`
	Next       int64            `json:"next,omitempty"` // the after= of the next page; 0 = no more
}

// ReplayRequest is the body of POST /v1/trajectories:replay.
type ReplayRequest struct {
	Trajectory string `json:"trajectory"`
	// Project owns the trajectory (names are unique per project); default:
	// the token's project.
	Project string `json:"project,omitempty"`
	// Keep leaves the replay's sandbox running (to inspect it); by default
	// it is removed when the replay ends.
	Keep bool `json:"keep,omitempty"`
	// Masks are regular expressions (RE2 syntax, at most MaxReplayMasks):
	// every match in a step's stdout and stderr, logged and re-executed
	// alike, is replaced by ReplayMaskText before the two are compared, so
	// that timings and other noise ("Ran 2 tests in 0.005s") do not count
	// as a difference. The report keeps the unmasked outputs.
	Masks []string `json:"masks,omitempty"`
	// Ignore names outcome fields not to compare: any of ReplayFields
	// (duration_ms is accepted and never compared).
	Ignore []string `json:"ignore,omitempty"`
}

// ReplayMaskText replaces every match of a replay mask.
const ReplayMaskText = "<masked>"

// MaxReplayMasks bounds ReplayRequest.Masks.
const MaxReplayMasks = 64

// ReplayFields are the outcome fields a replay compares (and may ignore),
// plus duration_ms, which it never compares.
var ReplayFields = []string{"exit_code", "stdout", "stderr", "timed_out", "signal", "file", "error", "duration_ms"}

// TrajectoryReplay reports a re-execution of a trajectory's log in a fresh
// sandbox from its original state: every step whose outcome differs.
type TrajectoryReplay struct {
	Trajectory    string           `json:"trajectory"`
	Sandbox       string           `json:"sandbox"` // where it ran (removed unless keep)
	Steps         int              `json:"steps"`   // steps re-executed
	Deterministic bool             `json:"deterministic"`
	Differences   []StepDifference `json:"differences"`
	DurationMs    float64          `json:"duration_ms"`
}

// StepDifference is one step whose re-execution differs from the log.
type StepDifference struct {
	Step int64  `json:"step"`
	Op   string `json:"op"`
	// Fields that differ: exit_code, stdout, stderr, timed_out, signal,
	// file (size, mode, type or link target), error (one failed, or with
	// another code; not_found when the operation's input was not kept).
	Fields []string       `json:"fields"`
	Logged TrajectoryStep `json:"logged"` // the logged step with its result
	Got    TrajectoryStep `json:"got"`    // the same operation with the re-execution's result
}

// Divergence is the detail of a 409 on resume: the step and both operations.
type Divergence struct {
	Step     int64          `json:"step"`
	Logged   TrajectoryStep `json:"logged"`
	Received TrajectoryStep `json:"received"`
}

// Node is the watcher's view of one edge.
type Node struct {
	Name         string  `json:"name"`
	State        string  `json:"state"` // up, down
	CPUCapacity  float64 `json:"cpu_capacity"`
	MemoryMB     int64   `json:"memory_mb"`
	CPURequested float64 `json:"cpu_requested"`
	MemRequested int64   `json:"memory_requested_mb"`
	// DiskMB is the disk (disk_mb) the node admits: what its scratch
	// filesystem can really hold × DiskOvercommit (0: no limit);
	// DiskRequestedMB what its live sandboxes were given.
	DiskMB          int64             `json:"disk_mb"`
	DiskRequestedMB int64             `json:"disk_requested_mb"`
	Sandboxes       int               `json:"sandboxes"`
	Tiers           []string          `json:"tiers"`
	Labels          map[string]string `json:"labels,omitempty"`
	LastHeartbeat   time.Time         `json:"last_heartbeat"`

	// Accelerator is how the node's VM tiers run guests: "kvm" or "tcg"
	// (emulated: much slower); empty when it offers none.
	Accelerator string `json:"accelerator,omitempty"`
	// VMKernel names the guest kernel of the node's VM tiers.
	VMKernel string `json:"vm_kernel,omitempty"`

	// DataAddr is the address of the node's data listener (host:port),
	// where apiservers open the streams of exec output and file transfers.
	DataAddr string `json:"data_addr,omitempty"`
	// Images are the images whose layers the node holds (placement prefers them).
	Images []string `json:"images,omitempty"`
	// States counts sandboxes per state; Projects sums live usage per
	// project; Jobs counts live sandboxes per value of their "job" label.
	States   map[string]int   `json:"states,omitempty"`
	Projects map[string]Usage `json:"projects,omitempty"`
	Jobs     map[string]int   `json:"jobs,omitempty"`
	// NetworkGroups counts live sandboxes per network group
	// (NetworkGroupKey: "project/group"): placement sends a group's next
	// member to the node that holds it.
	NetworkGroups map[string]int `json:"network_groups,omitempty"`

	// Measured on the node.
	CPUUsed           float64 `json:"cpu_used"`            // cores the sandboxes used over the last seconds
	MemoryUsedMB      int64   `json:"memory_used_mb"`      // the sandboxes' charged memory (cgroups)
	MemoryAvailableMB int64   `json:"memory_available_mb"` // host MemAvailable
	SwapTotalMB       int64   `json:"swap_total_mb"`
	SwapUsedMB        int64   `json:"swap_used_mb"`
	MemoryPressure    float64 `json:"memory_pressure"`   // PSI memory "some" avg10, percent (0 without PSI)
	CPUPressure       float64 `json:"cpu_pressure"`      // PSI cpu "some" avg10, percent
	DiskAvailableMB   int64   `json:"disk_available_mb"` // free on the scratch filesystem (and the host under it)

	// Configuration.
	CPUOvercommit    float64 `json:"cpu_overcommit"`
	MemoryOvercommit float64 `json:"memory_overcommit"`
	DiskOvercommit   float64 `json:"disk_overcommit"`

	SandboxesByState    map[string]int `json:"sandboxes_by_state"`
	SandboxesByPriority map[string]int `json:"sandboxes_by_priority"`
	Pools               []NodePool     `json:"pools"`
	Features            NodeFeatures   `json:"features"`
	// Recycling counts the containers of deleted sandboxes reused for new
	// ones (docs/architecture.md, "Recycled containers").
	Recycling NodeRecycling `json:"recycling"`
	// NetworkDenied counts what its sandboxes' networks refused since
	// the node started, by reason (names, and packets as observed).
	NetworkDenied map[string]int64 `json:"network_denied,omitempty"`
	// Elastic is the CPU given to sandboxes only while they run operations
	// (docs/architecture.md, "Density and elasticity").
	Elastic NodeElastic `json:"elastic"`
}

// NodeElastic sums the node's live sandboxes' CPU use during operations
// and between them (seconds), how long their processes were held back by
// the idle budget (the harvested CPU), how many sit at their idle budget
// now and how many cores of best-effort sandboxes' requested CPU that
// frees (what admission may give to more best-effort sandboxes).
type NodeElastic struct {
	ActiveSeconds    float64 `json:"active_seconds"`
	IdleSeconds      float64 `json:"idle_seconds"`
	HarvestedSeconds float64 `json:"harvested_seconds"`
	IdleSandboxes    int     `json:"idle_sandboxes"`
	FreedCPU         float64 `json:"freed_cpu"`
	// ClassCapped: the best-effort class is capped now (a latency-class
	// operation runs); ClassCaps and ClassReleases count the cap's writes
	// since the node started.
	ClassCapped   bool  `json:"class_capped"`
	ClassCaps     int64 `json:"class_caps"`
	ClassReleases int64 `json:"class_releases"`
}

// NodeRecycling is a node's recycled containers: Waiting now for a
// create of their shape; since the node started, Kept (wiped and kept at a
// delete), Reused (given to a new sandbox) and Refused (destroyed at a
// delete because something of the sandbox could outlive it).
type NodeRecycling struct {
	Waiting int   `json:"waiting"`
	Kept    int64 `json:"kept"`
	Reused  int64 `json:"reused"`
	Refused int64 `json:"refused"`
}

// NodePool is one warm pool's state on a node.
type NodePool struct {
	Name    string `json:"name"`
	Project string `json:"project,omitempty"` // the warm pool's (or FnCall workers') owner
	Size    int    `json:"size"`
	Ready   int    `json:"ready"`
}

// NodeFeatures says which isolation and elasticity features the node's
// kernel offers.
type NodeFeatures struct {
	SchedIdle      bool `json:"sched_idle"`      // best-effort sandboxes run under SCHED_IDLE
	CgroupCPUIdle  bool `json:"cgroup_cpu_idle"` // the cpu cgroup has cpu.idle (group-level SCHED_IDLE)
	CoreScheduling bool `json:"core_scheduling"` // PR_SCHED_CORE cookies (CONFIG_SCHED_CORE)
	PSI            bool `json:"psi"`             // /proc/pressure
	Freezer        bool `json:"freezer"`         // cgroup freezer: pause works
	Swap           bool `json:"swap"`            // swap is on: pause pushes memory out
	// Telemetry: the node's BPF programs are loaded, so the audit of its
	// sandboxes (GET /v1/sandboxes/{id}/audit) records what they execute.
	Telemetry bool `json:"telemetry"`
	// SandboxRoot is who a container sandbox's root is on the host:
	// "userns" (a range of unprivileged host ids of its own, in a user
	// namespace) or "host-root" (this kernel cannot, and the operator
	// passed --allow-host-root), with the reason or the ranges in use.
	SandboxRoot       string `json:"sandbox_root,omitempty"`
	SandboxRootDetail string `json:"sandbox_root_detail,omitempty"`
}

// Usage is what live sandboxes hold.
type Usage struct {
	Sandboxes int     `json:"sandboxes"`
	CPU       float64 `json:"cpu"`
	MemoryMB  int64   `json:"memory_mb"`
	// StorageBytes: what the project and its subprojects store now.
	StorageBytes int64 `json:"storage_bytes"`
}

// Event is one entry of the event stream (GET /v1/events).
type Event struct {
	Seq     uint64    `json:"seq"`
	Time    time.Time `json:"time"`
	Type    string    `json:"type"` // node.down, node.up, sandbox.lost, sandbox.destroyed, sandbox.network.denied
	Node    string    `json:"node,omitempty"`
	Sandbox string    `json:"sandbox,omitempty"`
	Project string    `json:"project,omitempty"`
	Message string    `json:"message,omitempty"`
}

type EventList struct {
	Events []Event `json:"events"`
	// Next is the seq to pass as ?after= to continue.
	Next uint64 `json:"next"`
}

// Event types.
const (
	EventNodeDown    = "node.down"
	EventNodeUp      = "node.up"
	EventSandboxLost = "sandbox.lost"
	// EventSandboxDestroyed: a node that comes back destroyed a sandbox
	// reported lost while it was unheard.
	EventSandboxDestroyed = "sandbox.destroyed"
	// EventSandboxNetworkDenied: a sandbox's network policy refused
	// something (at most one event per sandbox a second, with the count;
	// GET /v1/sandboxes/{id}/network/denials has each).
	EventSandboxNetworkDenied = "sandbox.network.denied"
)

type NodeList struct {
	Nodes []Node `json:"nodes"`
}

// Error is the body of every error answer: {"error":{"code","message"}}.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	// Reason names what is short on a 503 (a Reason* constant), so a
	// client can tell a full node from a missing tier without parsing text.
	Reason  string      `json:"reason,omitempty"`
	Diverge *Divergence `json:"divergence,omitempty"` // 409 on resume
}

// Reasons of a 503: the resource or condition that refused the work.
const (
	ReasonCPU          = "cpu"    // requested cores beyond capacity
	ReasonMemory       = "memory" // requested memory beyond capacity
	ReasonMemPressure  = "memory_pressure"
	ReasonDisk         = "disk"          // disk space
	ReasonPids         = "pids"          // the host's pids/threads (503), or the sandbox's own pids limit (429)
	ReasonSandboxes    = "sandboxes"     // the node's sandbox count limit
	ReasonTier         = "tier"          // no node offers the tier
	ReasonNodeSelector = "node_selector" // no node has the labels asked for
	ReasonNoNodes      = "no_nodes"      // no healthy node at all
	ReasonShuttingDown = "shutting_down" // the node is stopping
	// ReasonNetworkGroup: the node that holds the sandbox's network group
	// cannot take one more member (a group lives on one node).
	ReasonNetworkGroup = "network_group"
	// ReasonStorageQuota (a 413): the write would take the project over
	// its storage_bytes quota.
	ReasonStorageQuota = "storage_quota"
)

type ErrorBody struct {
	Error Error `json:"error"`
}

// Error codes and the HTTP status each maps to.
const (
	CodeBadRequest      = "bad_request"       // 400
	CodeUnauthorized    = "unauthorized"      // 401
	CodeForbidden       = "forbidden"         // 403
	CodeNotFound        = "not_found"         // 404
	CodeConflict        = "conflict"          // 409
	CodeTooLarge        = "too_large"         // 413
	CodeInvalid         = "invalid"           // 422
	CodeTooManyRequests = "too_many_requests" // 429
	CodeInternal        = "internal"          // 500
	CodeBadGateway      = "bad_gateway"       // 502: a sandbox's port did not answer
	CodeUnavailable     = "unavailable"       // 503
	CodeTimeout         = "timeout"           // 504
)

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Roles, from most to least powerful. An admin manages the subprojects and
// tokens of its project; a member creates and uses sandboxes; a viewer reads.
const (
	RoleAdmin  = "admin"
	RoleMember = "member"
	RoleViewer = "viewer"
)

// Quota limits what the live sandboxes of a project and all its
// descendants may hold; 0 means no limit of its own (its ancestors' still apply).
type Quota struct {
	Sandboxes int     `json:"sandboxes,omitempty"`
	CPU       float64 `json:"cpu,omitempty"`
	MemoryMB  int64   `json:"memory_mb,omitempty"`
	// StorageBytes bounds what the project and its subprojects store:
	// their trajectories' logs and inputs, their snapshots and their
	// layers. A write beyond it is refused (413, reason storage_quota).
	StorageBytes int64 `json:"storage_bytes,omitempty"`
	// EgressRateMbit and IngressRateMbit bound, in Mbit/s, the network
	// rates one sandbox of the project may ask for at create
	// (network.egress_rate_mbit, network.ingress_rate_mbit; more is a
	// 403); a networked sandbox that asks none is given the quota's.
	EgressRateMbit  int `json:"egress_rate_mbit,omitempty"`
	IngressRateMbit int `json:"ingress_rate_mbit,omitempty"`
	// MaxConns bounds, the same way, the open connections one sandbox of
	// the project may ask for (network.max_conns).
	MaxConns int `json:"max_conns,omitempty"`
}

// Project is a node of the project tree. Its id is the path of names from
// the top, joined by '.' ("acme.rl.run7").
type Project struct {
	ID     string `json:"id"`
	Parent string `json:"parent,omitempty"`
	Name   string `json:"name"`
	Quota  Quota  `json:"quota"`
	// IdleCPU is the idle_cpu its sandboxes (and its subprojects', unless
	// they set their own) get when their create gives none.
	IdleCPU   *float64  `json:"idle_cpu,omitempty"`
	Usage     *Usage    `json:"usage,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	CreatedBy string    `json:"created_by,omitempty"`
}

type ProjectList struct {
	Projects []Project `json:"projects"`
}

// CreateProjectRequest is the body of POST /v1/projects.
type CreateProjectRequest struct {
	Name   string `json:"name"`
	Parent string `json:"parent,omitempty"` // default: the caller's project
	Quota  Quota  `json:"quota"`
	// IdleCPU is the project's default idle_cpu (cores between operations).
	IdleCPU *float64 `json:"idle_cpu,omitempty"`
}

// UpdateProjectRequest is the body of PATCH /v1/projects/{id}.
type UpdateProjectRequest struct {
	Quota Quota `json:"quota"`
}

// CreateTokenRequest is the body of POST /v1/tokens.
type CreateTokenRequest struct {
	Principal string `json:"principal"`
	Project   string `json:"project,omitempty"`    // default: the caller's project
	Role      string `json:"role,omitempty"`       // default: member
	ExpiresIn int64  `json:"expires_in,omitempty"` // seconds; 0 = as long as the caller's token
}

// Token describes an API token. Secret is set only in the answer that
// created it: it is stored hashed and cannot be shown again.
type Token struct {
	ID        string     `json:"id"`
	Principal string     `json:"principal"`
	Project   string     `json:"project"`
	Role      string     `json:"role"`
	CreatedAt time.Time  `json:"created_at"`
	CreatedBy string     `json:"created_by,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
	Secret    string     `json:"token,omitempty"`
}

type TokenList struct {
	Tokens []Token `json:"tokens"`
}

// BatchCreateRequest is the body of POST /v1/sandboxes:batch: count
// sandboxes of one spec, placed and created in one call.
type BatchCreateRequest struct {
	Count   int                  `json:"count"`
	Spec    CreateSandboxRequest `json:"spec"`
	IDsOnly bool                 `json:"ids_only,omitempty"` // answer ids, not whole sandboxes
}

// BatchCreateResult answers a batch create. Created sandboxes are listed
// (or their ids); those that could not be created are counted per error.
type BatchCreateResult struct {
	Created   int          `json:"created"`
	IDs       []string     `json:"ids"`
	Sandboxes []Sandbox    `json:"sandboxes,omitempty"`
	Failed    int          `json:"failed"`
	Errors    []BatchError `json:"errors,omitempty"`
}

// BatchError is one kind of failure in a batch and how often it happened.
type BatchError struct {
	Count int   `json:"count"`
	Error Error `json:"error"`
}

// Kinds of audit records.
const (
	AuditKindExec    = "exec"    // an execve that succeeded
	AuditKindRefused = "refused" // a syscall that failed with EPERM (seccomp, capabilities)
	AuditKindSignal  = "signal"  // a signal sent to the sandbox's PID 1 (its agent)
	AuditKindFile    = "file"    // a syscall asking to write, rename, unlink or chmod a file
	AuditKindConnect = "connect" // a TCP connection attempt (Dest)
	AuditKindLimit   = "limit"   // a limit hit by a command: oom, pids, disk_full, output (Op)
	AuditKindDenied  = "denied"  // a network refusal: a name or a destination (Dest), Op the protocol, Reason why
)

// AuditKinds lists every kind of audit record.
var AuditKinds = []string{AuditKindExec, AuditKindRefused, AuditKindSignal, AuditKindFile, AuditKindConnect, AuditKindLimit, AuditKindDenied}

// Limits an audit record of kind limit names in its Op.
const (
	AuditLimitOOM    = "oom"       // the OOM killer ended a command at the sandbox's memory limit
	AuditLimitPids   = "pids"      // a fork or thread was refused at the pids limit
	AuditLimitDisk   = "disk_full" // a command failed with the writable layer at its disk limit
	AuditLimitOutput = "output"    // a command's output was cut at its output cap
)

// AuditOpRead is the op of a file record that opened a sensitive file for
// reading (/proc/kpage*, /proc/kcore, a process's mem or environ, the
// sandbox's protected directory).
const AuditOpRead = "read"

// AuditSpec is a create's audit options (CreateSandboxRequest.Audit).
type AuditSpec struct {
	// Off: the sandbox is not audited at all (its node's kernel
	// telemetry ignores it; limits are not recorded either): for runs
	// that want every last microsecond.
	Off bool `json:"off,omitempty"`
	// Workspace lists the directories the agent is meant to change
	// (absolute paths): file operations inside them are not recorded, the
	// rest are. Empty: every file operation is recorded.
	Workspace []string `json:"workspace,omitempty"`
	// Policy turns kinds of records into actions, evaluated in the node as
	// each record arrives (first matching rule wins).
	Policy []AuditRule `json:"policy,omitempty"`
}

// AuditRule is one policy hook: On selects records as "kind:pattern" and
// Do is what happens when one arrives.
//
// Kinds and what the pattern matches: exec (the file executed), write
// (the file of a file operation: write, rename (either name), unlink,
// chmod), read (a sensitive file opened for reading), refused (the syscall's name), signal (the signal's number),
// connect (the destination "ip:port"), limit (oom, pids, disk_full,
// output). Patterns are globs: "*" any run of characters but "/", "**"
// any run, "?" one character; "kind" alone or "kind:**" matches all.
type AuditRule struct {
	On string `json:"on"`
	// Do: "flag" (the record is marked flagged), "kill-step" (every
	// command of the sandbox running now is killed, and answers killed_by
	// "policy"), "fail-sandbox" (as kill-step, then the sandbox ends in
	// state failed with the rule as its reason).
	Do string `json:"do"`
}

// Actions of an audit rule.
const (
	AuditDoFlag        = "flag"
	AuditDoKillStep    = "kill-step"
	AuditDoFailSandbox = "fail-sandbox"
)

// AuditRecord is one thing a sandbox's processes did, as the node's kernel
// saw it (GET /v1/sandboxes/{id}/audit).
type AuditRecord struct {
	// Seq numbers the sandbox's records from 1, in order (?after=, follow).
	Seq  int64     `json:"seq"`
	Time time.Time `json:"time"`
	// Step is the trajectory step that was running then (0: between
	// steps, or the sandbox records no trajectory).
	Step int64  `json:"step"`
	Kind string `json:"kind"` // exec, refused, signal, file, connect, limit, denied
	// Pid and Ppid are in the sandbox's pid namespace; UID is as the
	// sandbox's user namespace numbers it, HostUID as the host does.
	Pid     int `json:"pid"`
	Ppid    int `json:"ppid"`
	UID     int `json:"uid"`
	HostUID int `json:"host_uid"`
	// Path is the file executed, as given to execve (exec), or the file
	// of a file operation, as the process named it (file: relative paths
	// are relative to its working directory).
	Path string   `json:"path,omitempty"`
	Argv []string `json:"argv,omitempty"`
	// ArgvTruncated: argv was longer than the cap (1 KiB) and was cut.
	ArgvTruncated bool `json:"argv_truncated,omitempty"`
	// Syscall is the refused syscall's name (refused).
	Syscall string `json:"syscall,omitempty"`
	// Signal is the signal's number and Target the pid it went to, as the
	// sandbox numbers it: 1 (signal).
	Signal int `json:"signal,omitempty"`
	Target int `json:"target,omitempty"`
	// Outcome is what the kernel did with the signal: delivered, ignored
	// (PID 1 of a namespace ignores what it has no handler for),
	// already_pending, overflow_fail, lose_info (signal).
	Outcome string `json:"outcome,omitempty"`
	// Op is a file operation (file): write (an open that writes, creates
	// or truncates), rename, unlink, chmod; To is a rename's new name.
	Op string `json:"op,omitempty"`
	To string `json:"to,omitempty"`
	// Dest is a connection's destination, "ip:port" (connect), or what
	// the network refused: a name, ADDR:PORT or ADDR (denied).
	Dest string `json:"dest,omitempty"`
	// Reason is why the network refused it (denied: as in
	// SandboxNetwork.DeniedBy); Count how many times since the last
	// record of it.
	Reason string `json:"reason,omitempty"`
	Count  int64  `json:"count,omitempty"`
	// Rule is the create's audit rule (its "on") that matched the record,
	// and Action what it did (flag, kill-step, fail-sandbox).
	Rule   string `json:"rule,omitempty"`
	Action string `json:"action,omitempty"`
}

// AuditList is a sandbox's audit, oldest first.
type AuditList struct {
	Records []AuditRecord `json:"records"`
	// Dropped counts the oldest records dropped from the sandbox's ring
	// (it keeps the newest).
	Dropped int64 `json:"dropped"`
	// Telemetry is false when the sandbox's node collects nothing (no BPF).
	Telemetry bool `json:"telemetry"`
	// Live: the sandbox still runs, so more records may come.
	Live bool `json:"live"`
	// Summary (with ?summary=1, instead of the records): per step, how
	// many records of each kind, steps in order.
	Summary []AuditStepSummary `json:"summary,omitempty"`
}

// AuditStepSummary counts one step's audit records by kind.
type AuditStepSummary struct {
	Step   int64            `json:"step"`
	Counts map[string]int64 `json:"counts"`
	// Matched counts the step's records that a policy rule of the create
	// matched (flagged, or acted on).
	Matched int64 `json:"matched,omitempty"`
}

// DisplayInput is the body of POST /v1/sandboxes/{id}/display/input: one
// of {"type":"text","text":"…"} (printable ASCII, tab, newline; a US
// layout), {"type":"key","key":"ctrl-alt-delete"} (QEMU's key names
// joined by '-', pressed together) or {"type":"click","x":…,"y":…} (a
// left click at that pixel).
type DisplayInput struct {
	Type string `json:"type"`
	Text string `json:"text,omitempty"`
	Key  string `json:"key,omitempty"`
	X    int    `json:"x,omitempty"`
	Y    int    `json:"y,omitempty"`
}
