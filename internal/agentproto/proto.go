// Package agentproto is the wire protocol between the edge and the agent
// (warren-agent, PID 1 inside a sandbox). Frames are a 4-byte big-endian
// length followed by one JSON object. Requests carry an id; the agent answers
// each with zero or more "chunk" frames and then exactly one "done" or
// "error" frame. Many requests run at once over one connection.
package agentproto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// MaxFrame bounds one frame; larger frames are a protocol error.
const MaxFrame = 8 << 20

// ChunkSize is the most data one chunk frame carries.
const ChunkSize = 256 << 10

// BulkChunkSize is the chunk of file and tar reads: fewer frames (and
// syscalls, and buffers) per byte on every hop to the client. Command
// output keeps ChunkSize (a buffer per stream of every command).
const BulkChunkSize = 1 << 20

// Operations.
const (
	OpSetup      = "setup"     // SetupConfig -> SetupResult; first request, once
	OpPing       = "ping"      // -> nothing
	OpExec       = "exec"      // ExecRequest -> chunks (stdout/stderr) + ExecResult
	OpProcGet    = "proc.get"  // ProcRequest -> ProcStatus
	OpProcKill   = "proc.kill" // ProcRequest -> nothing
	OpFileRead   = "file.read" // PathRequest -> chunks (data) + FileInfo
	OpFileWrite  = "file.write"
	OpFileList   = "file.list"   // PathRequest -> FileList
	OpFileStat   = "file.stat"   // PathRequest -> FileInfo
	OpFileMkdir  = "file.mkdir"  // MkdirRequest -> FileInfo
	OpFileRemove = "file.remove" // RemoveRequest -> nothing
	OpFileRename = "file.rename" // RenameRequest -> nothing
	OpTarGet     = "tar.get"     // PathRequest -> chunks (data, a tar stream) + nothing
	OpTarPut     = "tar.put"     // TarPutRequest (repeated, same Handle) -> TarPutResult
	// OpReset returns a Stateless sandbox to its initial state: every
	// process but the agent killed, the stateless directories and POSIX
	// message queues emptied, SysV IPC objects removed, sessions,
	// background commands and their environment forgotten. -> ResetResult
	OpReset = "reset"
	// OpWipe readies a sandbox's container for reuse by another sandbox:
	// every process but the agent killed, SysV IPC objects removed,
	// sessions, background commands and their environment forgotten, and
	// the agent's own scheduling and limits checked against what they were
	// after setup (a process of the sandbox may change them; they would
	// pass to the next sandbox's processes). It answers ErrUnusable when
	// the container must not be reused. Until OpResume the agent serves
	// nothing else. -> nothing
	OpWipe = "wipe"
	// OpReroot moves a wiped agent to the fresh root the edge has pivoted
	// the sandbox into (and lets the old root go). The agent still serves
	// nothing else. RerootRequest -> nothing
	OpReroot = "reroot"
	// OpResume makes a wiped and rerooted agent serve again, as the agent
	// of a new sandbox with its environment and default user.
	// ResumeRequest -> nothing
	OpResume = "resume"
	// OpCancel withdraws a call: the agent cancels its context (a
	// foreground command's process group is killed, a read or tar stops at
	// its next chunk). It is sent with frame id 0 and the call's id in its
	// body (CancelRequest) and answered by nothing; an agent that does not
	// know it answers an error to id 0, which no call waits for.
	OpCancel = "cancel"
	// OpCredit lets a call with a Window send more: the agent may send
	// Bytes more of it (CreditRequest, frame id 0, answered by nothing).
	OpCredit = "credit"
	// OpInput feeds a running exec that has live input (a PTY or
	// LiveStdin): InputRequest (+ payload) -> nothing.
	OpInput = "input"
	// OpIdentity gives a VM restored from another's memory (a fork, or a
	// memory template) an identity of its own: hostname, /etc/hostname,
	// /etc/machine-id, the kernel's random pool reseeded with the host's
	// bytes (the restored pool is every sibling's) and the clock set to the
	// host's. IdentityRequest -> nothing
	OpIdentity = "identity"
	// OpClock sets a VM's clock to the host's: a VM restored from a memory
	// snapshot (a pause) runs on with the clock it had when it was saved.
	// With OwnRAM it also turns free page reporting (back) on, which a VM
	// whose RAM was shared (a template's, a fork's child) ran without. The
	// agent of a container, which shares the host's clock, does nothing.
	// ClockRequest -> nothing
	OpClock = "clock"
	// OpUpperTar streams a VM's writable changes (the guest overlay's
	// upper directory on the sandbox's writable disk) as an OCI layer tar:
	// overlay whiteouts as ".wh.NAME", opaque directories with
	// ".wh..wh..opq". The disk's filesystem is frozen (FIFREEZE) while the
	// tar is read, so it is one moment's state; writers in the guest wait.
	// Only the agent of a VM answers it. -> chunks (data) + UpperTarResult
	OpUpperTar = "upper.tar"
)

// Flow control of a call's chunks. A request with a Window may have at most
// that many bytes of chunk frames unacknowledged, each frame counting its
// data plus FrameCost; the edge returns credit (OpCredit) as its consumer
// takes them. A slow consumer thus stalls its own call only, never the
// connection that the sandbox's other calls share. A request without a
// Window is not flow-controlled (an older edge).
const (
	Window    = 4 << 20
	FrameCost = 4 << 10
)

// CreditRequest is OpCredit's body.
type CreditRequest struct {
	ID    uint64 `json:"id"`
	Bytes int64  `json:"bytes"`
}

// CancelRequest is OpCancel's body.
type CancelRequest struct {
	ID uint64 `json:"id"`
}

// Response kinds.
const (
	KindChunk = "chunk"
	KindDone  = "done"
	KindError = "error"
)

// Streams of a chunk.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
	StreamData   = "data"
)

// Error codes the agent answers with.
const (
	ErrNotFound   = "not_found"
	ErrInvalid    = "invalid"
	ErrExists     = "exists"
	ErrNotDir     = "not_dir"
	ErrIsDir      = "is_dir"
	ErrNotEmpty   = "not_empty"
	ErrPermission = "permission"
	ErrTooLarge   = "too_large"
	ErrNoSpace    = "no_space"
	ErrInternal   = "internal"
	// ErrPidsLimit: a process could not be started because the sandbox is
	// at its pids limit (fork or clone answered EAGAIN).
	ErrPidsLimit = "pids_limit"
	// ErrUnusable: a stateless sandbox's reset failed; it serves nothing
	// more (the request was not carried out).
	ErrUnusable = "unusable"
)

// Request is one call from the edge.
type Request struct {
	ID   uint64          `json:"id"`
	Op   string          `json:"op"`
	Body json.RawMessage `json:"body,omitempty"`
	// Window, when set, flow-controls the call's chunks (see Window).
	Window int64 `json:"window,omitempty"`
	// Binary asks for the call's chunks as binary frames (binary.go).
	Binary bool `json:"binary,omitempty"`
	// Payload is bulk data sent after the JSON in a binary request frame
	// (an agent of ProtoPayload or later; a file.write takes it as Data).
	Payload []byte `json:"-"`

	pooled *[]byte // the frame's buffer (ReadRequestPooled)
}

// Response is one frame of an answer.
type Response struct {
	ID     uint64          `json:"id"`
	Kind   string          `json:"kind"`
	Stream string          `json:"stream,omitempty"`
	Data   []byte          `json:"data,omitempty"`
	Body   json.RawMessage `json:"body,omitempty"`
	Error  *Error          `json:"error,omitempty"`

	// pooled is the buffer holding a binary chunk's Data (Client), which
	// a bulk call returns to chunkBufs once its consumer is done with it.
	pooled *[]byte
}

// Error is an operation's failure as the agent reports it.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// IsCode reports whether err is an agent Error with the given code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// WriteFrame writes v as one frame. Callers serialise writers.
func WriteFrame(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("agentproto: encode: %w", err)
	}
	if len(b) > MaxFrame {
		return fmt.Errorf("agentproto: frame of %d bytes exceeds %d", len(b), MaxFrame)
	}
	buf := make([]byte, 4+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)))
	copy(buf[4:], b)
	_, err = w.Write(buf)
	return err
}

// ReadFrame reads one frame into v.
func ReadFrame(r io.Reader, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxFrame {
		return fmt.Errorf("agentproto: frame of %d bytes exceeds %d", n, MaxFrame)
	}
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return fmt.Errorf("agentproto: short frame: %w", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("agentproto: decode: %w", err)
	}
	return nil
}
