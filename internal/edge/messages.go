package edge

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
	OpPause       = "pause"          // IDRequest -> api.Sandbox
	OpResume      = "resume"         // IDRequest -> api.Sandbox
	OpPauseMatch  = "pause_matching" // PauseMatchingRequest -> api.PauseResult
	OpPoolPut     = "pool_put"       // api.PoolRequest -> api.Pool
	OpPoolList    = "pool_list"      // {} -> api.PoolList
	OpPoolDelete  = "pool_delete"    // PoolNameRequest -> api.Pool
	OpFnCall      = "fncall"         // FnCallRequest -> api.ExecResult
)

// PoolNameRequest names one warm pool.
type PoolNameRequest struct {
	Name string `json:"name"`
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
}

// IDRequest names one sandbox.
type IDRequest struct {
	ID string `json:"id"`
}

// ListRequest filters the sandboxes of a node.
type ListRequest struct {
	Labels map[string]string `json:"labels,omitempty"`
	State  string            `json:"state,omitempty"`
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
}

// TarPutResult answers tar_put.
type TarPutResult struct {
	Handle string `json:"handle"`
	Files  int    `json:"files"`
}
