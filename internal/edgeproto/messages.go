// Package edgeproto is the wire between the apiserver and the edges: the
// operations an edge answers on its bus subject (and its data listener),
// their request and answer bodies, sandbox ids, the KV records both sides
// read, and the checks the apiserver makes before it routes a request that
// the edge makes again. It imports api and sandboxspec only, so the
// ingress (internal/apiserver, internal/e2b) links none of the node's code
// (see internal/apiserver/deps_test.go).
package edgeproto

import "github.com/warrenhq/warren/api"

// Operations an edge answers on its bus subject (bus.EdgeSubject(node).<op>).
const (
	OpCreate      = "create"
	OpGet         = "get"
	OpList        = "list"
	OpDelete      = "delete"
	OpExec        = "exec"
	OpCommandGet  = "command_get"
	OpCommandKill = "command_kill"
	OpFileRead    = "file_read"
	OpFileWrite   = "file_write"
	OpFileList    = "file_list"
	OpFileStat    = "file_stat"
	OpFileMkdir   = "file_mkdir"
	OpFileRemove  = "file_remove"
	OpFileRename  = "file_rename"
	OpTarGet      = "tar_get"
	OpTarPut      = "tar_put"
	OpImages      = "images"
	OpImagePull   = "image_pull"
	OpImageCommit = "image_commit"   // api.CommitImageRequest -> api.Image
	OpLayerCreate = "layer_create"   // from a sandbox's changes (routed by sandbox id)
	OpPause       = "pause"          // IDRequest -> api.Sandbox
	OpResume      = "resume"         // ResumeSandboxRequest -> api.Sandbox
	OpTimeout     = "timeout"        // TimeoutRequest -> api.Sandbox
	OpPauseMatch  = "pause_matching" // PauseMatchingRequest -> api.PauseResult
	OpPoolPut     = "pool_put"       // api.PoolRequest -> api.Pool
	OpPoolList    = "pool_list"      // {} -> api.PoolList
	OpPoolDelete  = "pool_delete"    // PoolNameRequest -> api.Pool
	OpFnCall      = "fncall"         // FnCallRequest -> api.ExecResult
	OpLayerUpload = "layer_upload"   // a layer tar in chunks
	OpLayerList   = "layer_list"
	OpLayerGet    = "layer_get"
	OpLayerDelete = "layer_delete"
	OpLayerGC     = "layer_gc"
	OpCreateBatch = "create_batch"
	OpSnapshot    = "snapshot"     // SnapshotRequest → api.Snapshot
	OpSnapshotGet = "snapshot_get" // SnapshotGetRequest → api.Snapshot (any node)
	OpTrajResume  = "traj_resume"  // ResumeRequest → api.Sandbox
	OpTrajReplay  = "traj_replay"  // ReplayRequest → api.TrajectoryReplay
	OpTrajAdvance = "traj_advance" // AdvanceRequest → StepResult
	OpAudit       = "audit"        // AuditRequest → api.AuditList
	OpCommands    = "commands"     // IDRequest → api.CommandHistory
	OpStats       = "stats"        // IDRequest → api.SandboxStats
	OpNetwork     = "network"      // IDRequest → api.SandboxNetwork
	OpNetworkSet  = "network_set"  // NetworkSetRequest → api.SandboxNetwork
)

// OpNetworkDenials answers a sandbox's denial log: IDRequest →
// api.NetworkDenials.
const OpNetworkDenials = "network_denials"

// OpFileUpload writes a file from a stream (data plane only): a
// FileRequest (ID, Path, Mode) with the file's bytes as the call's upload;
// -> api.FileInfo. The file appears whole (renamed into place) or not at
// all.
const OpFileUpload = "file_upload"

// OpTarUpload extracts a tar stream into a directory (data plane only): a
// FileRequest (ID, Path) with the archive as the call's upload; ->
// TarPutResult (Files).
const OpTarUpload = "tar_upload"

// DataOps are the operations the data listener serves: those that stream.
// OpLayerUpload there is the node's store's: its grant names no sandbox,
// and the whole upload (a layer, an image archive or a VM disk) is one
// stream.
var DataOps = map[string]bool{OpExec: true, OpFileRead: true, OpTarGet: true, OpFileUpload: true, OpTarUpload: true, OpExecLive: true, OpPort: true, OpDisplay: true, OpLayerUpload: true}

// NetworkSetRequest replaces a running sandbox's egress list.
type NetworkSetRequest struct {
	ID      string          `json:"id"`
	Network api.NetworkSpec `json:"network"`
}

// LayerRequest is the body of the layer operations. Upload chunks (on the
// bus) carry Data; the first has no Handle and its answer names one; the
// one with Final set creates the layer and answers with it. On the data
// plane an upload is one call: the request names what to make, the upload
// is the whole file.
type LayerRequest struct {
	Name    string `json:"name,omitempty"`
	Version int    `json:"version,omitempty"`
	Ref     string `json:"ref,omitempty"` // layer_get, layer_delete: name or name@version
	ID      string `json:"id,omitempty"`  // layer_create: the sandbox
	Handle  string `json:"handle,omitempty"`
	Data    []byte `json:"data,omitempty"`
	Final   bool   `json:"final,omitempty"`
	Abort   bool   `json:"abort,omitempty"`
	// Image makes an upload an image archive imported under this name
	// (layer_upload; Name and Version are then unused).
	Image string `json:"image,omitempty"`
	// Disk, with Image, makes the upload a VM disk image of this format
	// ("qcow2" or "raw") for the vm tier.
	Disk string `json:"disk,omitempty"`
}

// UploadResult answers a non-final upload chunk.
type UploadResult struct {
	Handle string `json:"handle"`
	Bytes  int64  `json:"bytes"`
}

// CreateBatchRequest asks an edge for many sandboxes at once.
type CreateBatchRequest struct {
	Items []CreateRequest `json:"items"`
}

// CreateBatchResult answers item by item, in order.
type CreateBatchResult struct {
	Items []CreateBatchItem `json:"items"`
}

// CreateBatchItem is one sandbox of a batch, or why it was not made.
type CreateBatchItem struct {
	Sandbox *api.Sandbox `json:"sandbox,omitempty"`
	Error   *api.Error   `json:"error,omitempty"`
}

// PoolNameRequest names one warm pool.
type PoolNameRequest struct {
	Name    string `json:"name"`
	Project string `json:"project,omitempty"` // pool names are per project
}

// PauseMatchingRequest pauses (or, with Resume, resumes) every sandbox of
// the node whose labels all match.
type PauseMatchingRequest struct {
	Labels map[string]string `json:"labels"`
	Resume bool              `json:"resume,omitempty"`
}

// CreateRequest asks an edge for a sandbox. ID is chosen by the caller (it
// encodes this node); a repeated create with the same ID returns the
// existing sandbox, which makes creates safe to retry.
type CreateRequest struct {
	ID   string                   `json:"id"`
	Spec api.CreateSandboxRequest `json:"spec"`
	// FromStep: a trajectory rebuilt (resume) from a snapshot of another
	// trajectory's log (a branch from its parent's checkpoint) starts
	// after this step.
	FromStep int64 `json:"from_step,omitempty"`
}

// OpForkMemory starts sandboxes from a memory snapshot of a running one
// (tiers api.MemoryForkTiers): ForkMemoryRequest -> ForkMemoryResult.
const OpForkMemory = "fork_memory"

// ForkMemoryRequest names the source and the children's ids (of the
// source's node, made by the apiserver, which reserved their place).
type ForkMemoryRequest struct {
	ID       string   `json:"id"`
	Children []string `json:"children"`
}

// ForkMemoryResult is the new sandboxes, in Children's order.
type ForkMemoryResult struct {
	Sandboxes []api.Sandbox `json:"sandboxes"`
}

// IDRequest names one sandbox.
type IDRequest struct {
	ID string `json:"id"`
}

// TimeoutRequest sets when a sandbox expires (TTL seconds from now) and
// its idle timeout.
type TimeoutRequest struct {
	ID          string `json:"id"`
	TTL         int64  `json:"ttl,omitempty"`          // 0 = unchanged
	IdleTimeout *int64 `json:"idle_timeout,omitempty"` // nil = unchanged, 0 = none
}

// ResumeSandboxRequest names a sandbox to resume.
type ResumeSandboxRequest struct {
	ID         string `json:"id"`
	NoPrefetch bool   `json:"no_prefetch,omitempty"` // leave swapped memory to page faults
}

// ListRequest filters the sandboxes of a node.
type ListRequest struct {
	Labels  map[string]string `json:"labels,omitempty"`
	State   string            `json:"state,omitempty"`
	Project string            `json:"project,omitempty"` // this project and below
	// Scope and Scoped come from the request's scope header, not the body.
	Scope  string `json:"-"`
	Scoped bool   `json:"-"`
}

// ExecRequest runs a command in a sandbox; output arrives as chunks on the
// streams "stdout" and "stderr", the answer is an api.ExecResult without them.
type ExecRequest struct {
	ID   string          `json:"id"`
	Exec api.ExecRequest `json:"exec"`
}

// CommandRequest addresses a background command.
type CommandRequest struct {
	ID        string `json:"id"`
	CommandID string `json:"command_id"`
	Wait      bool   `json:"wait,omitempty"`
	Signal    int    `json:"signal,omitempty"`
}

// FileRequest is every file operation's body; which fields matter depends
// on the op.
type FileRequest struct {
	ID        string `json:"id"`
	Path      string `json:"path,omitempty"`
	To        string `json:"to,omitempty"` // rename
	Mode      uint32 `json:"mode,omitempty"`
	Parents   bool   `json:"parents,omitempty"`
	Recursive bool   `json:"recursive,omitempty"`
	Append    bool   `json:"append,omitempty"`
	Data      []byte `json:"data,omitempty"`
	Handle    string `json:"handle,omitempty"` // tar_put
	Final     bool   `json:"final,omitempty"`  // tar_put
	Abort     bool   `json:"abort,omitempty"`  // tar_put: the upload broke, extract nothing
}

// TarPutResult answers tar_put.
type TarPutResult struct {
	Handle string `json:"handle"`
	Files  int    `json:"files"`
}

// SnapshotRequest is the body of OpSnapshot (and OpFork's snapshot step).
type SnapshotRequest struct {
	ID   string `json:"id"`
	Name string `json:"name,omitempty"`
	Stop bool   `json:"stop,omitempty"`
}

// SnapshotGetRequest names a snapshot (OpSnapshotGet).
type SnapshotGetRequest struct {
	Snapshot string `json:"snapshot"`
}

// AuditRequest is the body of OpAudit.
type AuditRequest struct {
	ID string `json:"id"`
	// Step, when HasStep, keeps the records of that step only.
	Step    int64  `json:"step,omitempty"`
	HasStep bool   `json:"has_step,omitempty"`
	Kind    string `json:"kind,omitempty"`
	// Summary answers counts per step and kind instead of the records.
	Summary bool `json:"summary,omitempty"`
	// After keeps the records after this seq.
	After int64 `json:"after,omitempty"`
}

// FnCallRequest asks an edge to run one task.
type FnCallRequest struct {
	Call api.FnCallRequest `json:"call"`
	// Project is the caller's (the apiserver sets it from the token):
	// workers are per project and shape, so a worker that ran one
	// project's task never serves another's (the reset is thorough, but
	// what it may miss must not cross projects).
	Project string `json:"project,omitempty"`
}

// ResumeRequest is the body of OpTrajResume.
type ResumeRequest struct {
	ID         string `json:"id"`
	Trajectory string `json:"trajectory"`
	Branch     bool   `json:"branch,omitempty"`
	// Delegate: the API server replica that serves the fast-forward from
	// its own copy of the log; the edge's cursor stays put until it
	// reports how far the client got (OpTrajAdvance). Only when every
	// logged step is replayed (no re-execution, no branch).
	Delegate string `json:"delegate,omitempty"`
}

// AdvanceRequest (OpTrajAdvance) ends a delegated fast-forward: the client
// re-issued the first Cursor logged steps through the delegate.
type AdvanceRequest struct {
	ID       string `json:"id"`
	Delegate string `json:"delegate"`
	Cursor   int    `json:"cursor"`
}

// StepResult answers a recorded operation that has no other answer.
type StepResult struct {
	Step       int64  `json:"step,omitempty"`
	Replayed   bool   `json:"replayed,omitempty"`
	Sandbox    string `json:"sandbox,omitempty"`    // set when the operation branched
	Trajectory string `json:"trajectory,omitempty"` // the branch's trajectory
}

// ReplayRequest is the body of OpTrajReplay: re-execute a trajectory's log
// in the new sandbox ID, made from Spec (the trajectory's original state).
type ReplayRequest struct {
	ID         string                   `json:"id"`
	Trajectory string                   `json:"trajectory"`
	Project    string                   `json:"project,omitempty"` // the trajectory's owner: its log is TrajKey(Project, Trajectory)
	Spec       api.CreateSandboxRequest `json:"spec"`
	Keep       bool                     `json:"keep,omitempty"`
	// Masks and Ignore: as in api.ReplayRequest (checked by ReplayFilter).
	Masks  []string `json:"masks,omitempty"`
	Ignore []string `json:"ignore,omitempty"`
}
