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
)

// Tiers.
const (
	TierContainer = "container"
)

// CreateSandboxRequest is the body of POST /v1/sandboxes.
type CreateSandboxRequest struct {
	Tier        string            `json:"tier,omitempty"`
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
	// Layers are the named layers the sandbox was created with, resolved
	// to versions ("ws/django-1234@3", "toolkit/harness@2 at /opt/toolkit (protected)").
	Layers []string `json:"layers,omitempty"`
	// Snapshot is the snapshot the sandbox was restored from.
	Snapshot string `json:"snapshot,omitempty"`
	// Trajectory is the log the sandbox records into; Step its last step.
	Trajectory string `json:"trajectory,omitempty"`
	Step       int64  `json:"step,omitempty"`
	// Replay is how many logged steps a resuming client may still re-issue
	// and get cached (resume answers only).
	Replay int64 `json:"replay,omitempty"`
}

// SandboxList is the body of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
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
	// Step is the operation's step in the sandbox's trajectory; Replayed
	// says the result came from the log and nothing ran.
	Step     int64 `json:"step,omitempty"`
	Replayed bool  `json:"replayed,omitempty"`
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
	// Step and Replayed: as in ExecResult (writes and mkdirs of a trajectory sandbox).
	Step     int64 `json:"step,omitempty"`
	Replayed bool  `json:"replayed,omitempty"`
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
	ID         string            `json:"id"`
	Name       string            `json:"name,omitempty"`
	Sandbox    string            `json:"sandbox"`
	Image      string            `json:"image"`
	Layers     []LayerAttachment `json:"layers"`
	Diff       string            `json:"diff"`   // the named layer holding this snapshot's changes (snap/<id>@1)
	Digest     string            `json:"digest"` // diff id of that layer
	Size       int64             `json:"size"`   // bytes of the diff (uncompressed tar)
	Entries    int               `json:"entries"`
	Parent     string            `json:"parent,omitempty"`     // the snapshot the sandbox was restored from
	Step       int64             `json:"step,omitempty"`       // trajectory step it was taken after (checkpoints)
	Trajectory string            `json:"trajectory,omitempty"` // the trajectory it checkpoints
	FrozenMs   float64           `json:"frozen_ms"`            // how long the sandbox was frozen
	CreatedAt  time.Time         `json:"created_at"`
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	Count int `json:"count"`
}

// ForkResult answers a fork: the snapshot and the new sandboxes.
type ForkResult struct {
	Snapshot  Snapshot  `json:"snapshot"`
	Sandboxes []Sandbox `json:"sandboxes"`
}

// TrajectoryStep is one logged operation with its result.
type TrajectoryStep struct {
	Step    int64     `json:"step"`
	Op      string    `json:"op"` // exec, write, remove, rename, mkdir
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
	// The result.
	Result *ExecResult `json:"result,omitempty"`
	File   *FileInfo   `json:"file,omitempty"`
	Error  *Error      `json:"error,omitempty"`
	// Checkpoint is the snapshot taken after this step, if any.
	Checkpoint string `json:"checkpoint,omitempty"`
}

// TrajectoryPage is the body of GET /v1/trajectories/{name}.
type TrajectoryPage struct {
	Trajectory string           `json:"trajectory"`
	Sandbox    string           `json:"sandbox"`
	Steps      []TrajectoryStep `json:"steps"`
	Next       int64            `json:"next,omitempty"` // the after= of the next page; 0 = no more
}

// Divergence is the detail of a 409 on resume: the step and both operations.
type Divergence struct {
	Step     int64          `json:"step"`
	Logged   TrajectoryStep `json:"logged"`
	Received TrajectoryStep `json:"received"`
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
}

type NodeList struct {
	Nodes []Node `json:"nodes"`
}

// Error is the body of every error answer: {"error":{"code","message"}}.
type Error struct {
	Code    string      `json:"code"`
	Message string      `json:"message"`
	Diverge *Divergence `json:"divergence,omitempty"` // 409 on resume
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
