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
	StatePaused   = "paused" // frozen, memory pushed to swap; any operation resumes it
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
)

// CreateSandboxRequest is the body of POST /v1/sandboxes.
type CreateSandboxRequest struct {
	Tier        string            `json:"tier,omitempty"`
	Image       string            `json:"image"`
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
	// Priority is the QoS class: "best-effort" (default) or "latency".
	Priority string `json:"priority,omitempty"`
	// IdleTimeoutAction is "stop" (default) or "pause".
	IdleTimeoutAction string `json:"idle_timeout_action,omitempty"`
}

// Sandbox is the public view of one sandbox.
type Sandbox struct {
	ID          string            `json:"id"`
	State       string            `json:"state"`
	Node        string            `json:"node"`
	Tier        string            `json:"tier"`
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
	Pool        string            `json:"pool,omitempty"`   // the warm pool it was claimed from
	Priority    string            `json:"priority,omitempty"`
	IdleAction  string            `json:"idle_timeout_action,omitempty"`
	PausedAt    *time.Time        `json:"paused_at,omitempty"`
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
}

// Pool is a warm pool's state, summed over the nodes.
type Pool struct {
	Name     string  `json:"name"`
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
}

// ExecResult is the JSON answer of exec (and the last NDJSON event of a stream).
type ExecResult struct {
	ExitCode   int     `json:"exit_code"`
	Stdout     string  `json:"stdout"`
	Stderr     string  `json:"stderr"`
	Truncated  bool    `json:"truncated"`
	TimedOut   bool    `json:"timed_out,omitempty"`
	Signal     string  `json:"signal,omitempty"`
	DurationMs float64 `json:"duration_ms"`
	CommandID  string  `json:"command_id,omitempty"` // set for background commands
}

// ExecEvent is one line of an NDJSON exec stream. Exactly one field group is set.
type ExecEvent struct {
	Stdout     *string  `json:"stdout,omitempty"`
	Stderr     *string  `json:"stderr,omitempty"`
	ExitCode   *int     `json:"exit_code,omitempty"`
	Truncated  bool     `json:"truncated,omitempty"`
	TimedOut   bool     `json:"timed_out,omitempty"`
	Signal     string   `json:"signal,omitempty"`
	DurationMs *float64 `json:"duration_ms,omitempty"`
	Error      *Error   `json:"error,omitempty"`
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

// FileInfo describes one file in a sandbox.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Size    int64     `json:"size"`
	Mode    uint32    `json:"mode"` // permission bits
	Type    string    `json:"type"` // file, dir, symlink, other
	ModTime time.Time `json:"mod_time"`
	Target  string    `json:"target,omitempty"` // symlink target
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
}

type ImageList struct {
	Images []Image `json:"images"`
}

// Node is the watcher's view of one edge.
type Node struct {
	Name          string    `json:"name"`
	State         string    `json:"state"` // up, down
	CPUCapacity   float64   `json:"cpu_capacity"`
	MemoryMB      int64     `json:"memory_mb"`
	CPURequested  float64   `json:"cpu_requested"`
	MemRequested  int64     `json:"memory_requested_mb"`
	Sandboxes     int       `json:"sandboxes"`
	Tiers         []string  `json:"tiers"`
	LastHeartbeat time.Time `json:"last_heartbeat"`

	// Measured on the node.
	CPUUsed           float64 `json:"cpu_used"`            // cores the sandboxes used over the last seconds
	MemoryUsedMB      int64   `json:"memory_used_mb"`      // the sandboxes' charged memory (cgroups)
	MemoryAvailableMB int64   `json:"memory_available_mb"` // host MemAvailable
	SwapTotalMB       int64   `json:"swap_total_mb"`
	SwapUsedMB        int64   `json:"swap_used_mb"`
	MemoryPressure    float64 `json:"memory_pressure"` // PSI memory "some" avg10, percent (0 without PSI)
	CPUPressure       float64 `json:"cpu_pressure"`    // PSI cpu "some" avg10, percent

	// Configuration.
	CPUOvercommit    float64 `json:"cpu_overcommit"`
	MemoryOvercommit float64 `json:"memory_overcommit"`

	SandboxesByState    map[string]int `json:"sandboxes_by_state"`
	SandboxesByPriority map[string]int `json:"sandboxes_by_priority"`
	Pools               []NodePool     `json:"pools"`
	Features            NodeFeatures   `json:"features"`
}

// NodePool is one warm pool's state on a node.
type NodePool struct {
	Name  string `json:"name"`
	Size  int    `json:"size"`
	Ready int    `json:"ready"`
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
}

type NodeList struct {
	Nodes []Node `json:"nodes"`
}

// Error is the body of every error answer: {"error":{"code","message"}}.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

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
	CodeUnavailable     = "unavailable"       // 503
	CodeTimeout         = "timeout"           // 504
)

func (e *Error) Error() string { return e.Code + ": " + e.Message }
