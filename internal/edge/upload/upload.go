// Package upload writes a file of a sandbox from a streamed upload (the
// data plane's OpFileUpload). The file is written to a temporary name
// beside it, then renamed into place; a broken upload (its input fails:
// the caller went away) or a failed write removes the temporary file, so
// the target is either the whole upload or untouched.
//
// The upload is read in chunks (Chunk bytes; ChunkJSON in a sandbox that
// records a trajectory), each one agent write. To an agent that can write
// at an offset (agentproto.ProtoOffset) up to Depth writes are in flight
// at once, each at its offset, while the next chunk is read; otherwise,
// and in a sandbox that records a trajectory (whose writes are recorded
// in order), one at a time, appended in order. A write goes to the agent
// raw when it takes a payload (agentproto.ProtoPayload), else as base64
// in JSON, ChunkJSON bytes per call. Every write is waited for before the
// upload ends or fails: none outlives the removal of the temporary file.
//
// The lifecycle core (package edge) keeps the sandboxes and hands the one
// an upload writes to over as a Sandbox (Host.Lookup); it never shows the
// package its records or locks.
//
// # Locks
//
// The only lock of the package is a leaf: one upload's writes' record of
// the first write that failed, held over nothing else. The core's Host
// and Sandbox methods are called holding no lock of the package.
package upload

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"path"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/dataplane"
)

// Upload chunks: what one agent write carries (raw, or base64 in JSON to
// an agent that takes no payload), and how many writes of one upload may
// be in flight at once (each at its offset, to an agent of ProtoOffset).
const (
	Chunk     = 4 << 20
	ChunkJSON = 1 << 20
	Depth     = 3
)

// removeWait bounds the removal of a failed upload's temporary file.
const removeWait = 10 * time.Second

// Agent is a sandbox's agent as an upload writes to it (an
// *agentproto.Client).
type Agent interface {
	// Proto is the protocol version the agent speaks (agentproto.Proto*).
	Proto() int
	Call(ctx context.Context, op string, body any, out any, onChunk func(*agentproto.Response) error) error
	// CallPayload is Call with payload sent raw after the request (an
	// agent of ProtoPayload or later).
	CallPayload(ctx context.Context, op string, body any, payload []byte, out any, onChunk func(*agentproto.Response) error) error
}

// Write is one write of an upload: Data into Path, which the first write
// creates with Mode; the others append to it (Append) or, to an agent of
// ProtoOffset, write at their offsets.
type Write struct {
	Path   string
	Mode   uint32
	Data   []byte
	Append bool
}

// Sandbox is the sandbox an upload writes to, as the core hands it over.
type Sandbox interface {
	// Wait returns once its creation finished (either way).
	Wait()
	// Recorded reports whether it records a trajectory: its writes then
	// go through Record, one at a time.
	Recorded() bool
	// Acquire is its agent for one call or more, the sandbox marked in
	// use until release is called; a sandbox that does not run is an
	// error (an *api.Error).
	Acquire() (agent Agent, release func(), err error)
	// AgentError turns the error of a call through its agent into the
	// API's.
	AgentError(err error) error
	// Record writes w as a recorded step of its trajectory.
	Record(ctx context.Context, w *Write) error
	// Remove removes the file at path, Rename renames from to to (each
	// recorded in a trajectory sandbox), Stat answers the file at path.
	Remove(ctx context.Context, path string) error
	Rename(ctx context.Context, from, to string) error
	Stat(ctx context.Context, path string) (*api.FileInfo, error)
}

// Host is what an upload needs of the lifecycle core.
type Host interface {
	// Lookup finds sandbox id; none is an *api.Error.
	Lookup(id string) (Sandbox, error)
}

// File writes the file target of sandbox id, with mode, from in, and
// answers the file written. A broken upload is a bad request ("upload
// broken: ...").
func File(ctx context.Context, h Host, id, target string, mode uint32, in io.Reader) (*api.FileInfo, error) {
	if target == "" || target == "/" || !strings.HasPrefix(target, "/") {
		return nil, &api.Error{Code: api.CodeBadRequest, Message: "upload: a file path is required"}
	}
	sb, err := h.Lookup(id)
	if err != nil {
		return nil, err
	}
	sb.Wait()
	tmp := tempName(target)
	if err := writeAll(ctx, sb, tmp, mode, in); err != nil {
		return nil, removeTemp(ctx, sb, tmp, err)
	}
	if err := sb.Rename(ctx, tmp, target); err != nil {
		return nil, removeTemp(ctx, sb, tmp, err)
	}
	return sb.Stat(ctx, target)
}

// tempName is a new temporary name beside target.
func tempName(target string) string {
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	return path.Join(path.Dir(target), ".warren-upload-"+hex.EncodeToString(rnd[:]))
}

// removeTemp removes the temporary file of an upload that failed with
// err, also when ctx ended (its caller went away), and returns err.
func removeTemp(ctx context.Context, sb Sandbox, tmp string, err error) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeWait)
	defer cancel()
	_ = sb.Remove(cctx, tmp)
	return err
}

// depth is how many writes of an upload to sb may be in flight: one
// (appended in order) in a trajectory sandbox, whose writes are recorded
// in order, and to an agent that cannot write at an offset.
func depth(sb Sandbox) int {
	if sb.Recorded() {
		return 1
	}
	agent, release, err := sb.Acquire()
	if err != nil {
		return 1 // the first write answers the error
	}
	defer release()
	if agent.Proto() < agentproto.ProtoOffset {
		return 1
	}
	return Depth
}

// writeAll writes the upload in into tmp and returns once every write
// ended: nil when all succeeded, else the broken input's error or the
// first write's that failed.
func writeAll(ctx context.Context, sb Sandbox, tmp string, mode uint32, in io.Reader) error {
	size, depth := Chunk, depth(sb)
	if sb.Recorded() {
		size = ChunkJSON
	}
	up := newWrites(size, depth)
	var off int64
	for first := true; ; first = false {
		buf := up.buffer()
		n, rerr := dataplane.ReadChunk(in, buf)
		if rerr != nil && rerr != io.EOF {
			up.wait()
			return &api.Error{Code: api.CodeBadRequest, Message: "upload broken: " + rerr.Error()}
		}
		if err := up.err(); err != nil {
			up.wait()
			return err
		}
		switch {
		case first:
			// The first write creates the file, alone: the others
			// append to it or write into it.
			w := &Write{Path: tmp, Mode: mode, Data: buf[:n]}
			up.start(func() error { return writeChunk(ctx, sb, w, -1) }, buf)
			up.wait()
			if err := up.err(); err != nil {
				return err
			}
		case n > 0:
			w := &Write{Path: tmp, Mode: mode, Data: buf[:n], Append: true}
			at := off
			if depth == 1 {
				at = -1 // appended, in order: one write at a time
			}
			up.start(func() error { return writeChunk(ctx, sb, w, at) }, buf)
		default:
			up.release(buf)
		}
		off += int64(n)
		if rerr != nil {
			break
		}
	}
	up.wait()
	return up.err()
}
