package upload

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
)

// protoJSON is an agent that takes no payload (nor offsets).
const protoJSON = agentproto.ProtoPayload - 1

const target = "/work/out.bin"

// data is n bytes that do not repeat: a chunk written at another chunk's
// offset shows.
func data(n int) []byte {
	b := make([]byte, n)
	seed := [32]byte{byte(n), byte(n >> 8), byte(n >> 16)}
	_, _ = rand.NewChaCha8(seed).Read(b)
	return b
}

// lengths are the lengths of the data of ws.
func lengths(ws []*gotWrite) []int {
	var out []int
	for _, w := range ws {
		out = append(out, len(w.req.Data))
	}
	return out
}

// checkFile checks that sb's agent holds want at target and nothing else.
func checkFile(t *testing.T, sb *fakeSandbox, want []byte) {
	t.Helper()
	defer sb.lock()()
	if got, ok := sb.agent.files[target]; !ok || !bytes.Equal(got, want) {
		t.Errorf("%s: %d bytes (found %v), want the %d uploaded", target, len(got), ok, len(want))
	}
	if len(sb.agent.files) != 1 {
		t.Errorf("files left: %d, want only %s", len(sb.agent.files), target)
	}
}

// checkRemoved checks that sb's upload failed cleanly: its temporary
// file tmp removed after every write ended, nothing renamed or left.
func checkRemoved(t *testing.T, sb *fakeSandbox, tmp string) {
	t.Helper()
	defer sb.lock()()
	if want := []string{"remove " + tmp}; !slices.Equal(sb.ops, want) {
		t.Errorf("after the failure: %q, want %q", sb.ops, want)
	}
	if sb.inFlightAtRemove != 0 {
		t.Errorf("%d writes in flight when the temporary file was removed, want 0", sb.inFlightAtRemove)
	}
	if len(sb.agent.files) != 0 {
		t.Errorf("%d files left after a failed upload", len(sb.agent.files))
	}
}

// checkInOrder checks that the writes a received ran one at a time, appended
// in order after the first, none at an offset.
func checkInOrder(t *testing.T, a *fakeAgent) {
	t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.maxInFlight != 1 {
		t.Errorf("%d writes in flight at once, want 1", a.maxInFlight)
	}
	for i, w := range a.writes {
		if w.req.At || w.req.Append != (i > 0) {
			t.Errorf("write %d: at %v (offset %d), append %v; want appended after the first", i, w.req.At, w.req.Offset, w.req.Append)
		}
		if i > 0 && w.start < a.writes[i-1].end {
			t.Errorf("write %d began before write %d ended", i, i-1)
		}
	}
}

// TestFileTempThenRename: the upload is written to a temporary name
// beside the target, renamed into place once every write ended, and the
// file answered; an input that gives less than a chunk at a time still
// fills each chunk.
func TestFileTempThenRename(t *testing.T) {
	a := newAgent(agentproto.ProtoOffset)
	sb := newSandbox(a)
	want := data(2*Chunk + 123)
	fi, tmp, err := run(t, sb, target, iotest.HalfReader(bytes.NewReader(want)))
	if err != nil {
		t.Fatal(err)
	}
	if fi == nil || fi.Path != target || fi.Size != int64(len(want)) {
		t.Fatalf("answered %+v, want %s of %d bytes", fi, target, len(want))
	}
	if tmp == "" || tmp == target {
		t.Fatalf("written to %q, want a temporary name", tmp)
	}
	if want := []string{"rename " + tmp + " " + target, "stat " + target}; !slices.Equal(sb.ops, want) {
		t.Fatalf("after the writes: %q, want %q", sb.ops, want)
	}
	if sb.inFlightAtRename != 0 {
		t.Fatalf("%d writes in flight at the rename, want 0", sb.inFlightAtRename)
	}
	// The writes after the first run together: in any order.
	if got := lengths(a.writes); len(got) != 3 || got[0] != Chunk || !slices.Equal(slices.Sorted(slices.Values(got[1:])), []int{123, Chunk}) {
		t.Fatalf("writes of %v bytes, want full chunks", got)
	}
	checkFile(t, sb, want)
}

// TestFileBrokenInputRemovesTemp: an input that fails midway (its caller
// went away, cancelling the call) fails the upload as a bad request once
// the write in flight ended, and removes the temporary file on a context
// of its own.
func TestFileBrokenInputRemovesTemp(t *testing.T) {
	a := newAgent(agentproto.ProtoOffset)
	a.delay = 30 * time.Millisecond
	sb := newSandbox(a)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	in := &brokenReader{r: bytes.NewReader(data(2*Chunk + 100)), err: io.ErrUnexpectedEOF, before: cancel}
	fi, tmp, err := runCtx(ctx, t, sb, target, in)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeBadRequest || ae.Message != "upload broken: unexpected EOF" {
		t.Fatalf("upload with a broken input: %v, want a bad request \"upload broken: unexpected EOF\"", err)
	}
	if fi != nil {
		t.Fatalf("answered %+v with the error", fi)
	}
	if len(a.writes) != 2 {
		t.Fatalf("%d writes, want the 2 full chunks read before the input broke", len(a.writes))
	}
	checkRemoved(t, sb, tmp)
	if sb.removeCtxErr != nil || sb.removeDeadline <= 0 || sb.removeDeadline > removeWait {
		t.Fatalf("removal's context: %v, deadline in %v; want a live one of at most %v", sb.removeCtxErr, sb.removeDeadline, removeWait)
	}
}

// TestFileFailedWrite: a write that fails fails the upload with the
// agent's error as the core turns it; every write is waited for and the
// temporary file removed.
func TestFileFailedWrite(t *testing.T) {
	for _, tc := range []struct {
		name      string
		failWrite int
	}{{"first", 1}, {"third", 3}} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAgent(agentproto.ProtoOffset)
			a.delay, a.failWrite = 10*time.Millisecond, tc.failWrite
			sb := newSandbox(a)
			_, tmp, err := run(t, sb, target, bytes.NewReader(data(10*Chunk)))
			var ae *agentErr
			if !errors.As(err, &ae) || !errors.Is(err, a.failErr) {
				t.Fatalf("upload with a failing write: %v, want the agent's error through AgentError", err)
			}
			if tc.failWrite == 1 && len(a.writes) != 1 {
				t.Fatalf("%d writes after the first failed, want none", len(a.writes)-1)
			}
			if len(a.writes) == 10 {
				t.Fatal("every chunk was written after a write failed")
			}
			checkRemoved(t, sb, tmp)
		})
	}
}

// TestFileNoAgent: a sandbox without a running agent fails the upload
// with the core's error, and the (never written) temporary name is
// removed all the same.
func TestFileNoAgent(t *testing.T) {
	a := newAgent(agentproto.ProtoOffset)
	sb := newSandbox(a)
	sb.acquireErr = &api.Error{Code: api.CodeConflict, Message: "sandbox sb-1 is stopped"}
	_, _, err := run(t, sb, target, bytes.NewReader(data(100)))
	if err != sb.acquireErr {
		t.Fatalf("upload to a stopped sandbox: %v, want %v", err, sb.acquireErr)
	}
	if len(sb.ops) != 1 || !strings.HasPrefix(sb.ops[0], "remove /work/.warren-upload-") {
		t.Fatalf("after the failure: %q, want the temporary name removed", sb.ops)
	}
}

// TestFileTrajectoryInOrder: in a sandbox that records a trajectory every
// write is recorded (never straight to the agent), of at most ChunkJSON
// bytes, one at a time, appended in order.
func TestFileTrajectoryInOrder(t *testing.T) {
	a := newAgent(agentproto.ProtoOffset) // could write at offsets
	a.delay = 5 * time.Millisecond
	sb := newSandbox(a)
	sb.recorded = true
	want := data(3*ChunkJSON + 5)
	if _, _, err := run(t, sb, target, bytes.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if got := lengths(a.writes); !slices.Equal(got, []int{ChunkJSON, ChunkJSON, ChunkJSON, 5}) {
		t.Fatalf("writes of %v bytes, want ChunkJSON each", got)
	}
	for i, w := range a.writes {
		if !w.recorded {
			t.Errorf("write %d went straight to the agent, not recorded", i)
		}
	}
	if sb.acquired != 0 {
		t.Errorf("the agent was acquired %d times: a recorded upload goes through Record only", sb.acquired)
	}
	checkInOrder(t, a)
	checkFile(t, sb, want)
}

// TestFileNoOffsetsInOrder: to an agent that cannot write at an offset,
// the writes go one at a time, appended in order.
func TestFileNoOffsetsInOrder(t *testing.T) {
	a := newAgent(agentproto.ProtoPayload)
	a.delay = 10 * time.Millisecond
	sb := newSandbox(a)
	want := data(3*Chunk + 7)
	if _, _, err := run(t, sb, target, bytes.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if got := lengths(a.writes); !slices.Equal(got, []int{Chunk, Chunk, Chunk, 7}) {
		t.Fatalf("writes of %v bytes, want Chunk each", got)
	}
	checkInOrder(t, a)
	checkFile(t, sb, want)
}

// TestFileParallelAtOffsets: to an agent of ProtoOffset the first write
// creates the file alone, then up to Depth writes are in flight at once,
// each at its offset; the file arrives whole, also when they end out of
// order (the second write is slow: its buffer is not read into while it
// is in flight).
func TestFileParallelAtOffsets(t *testing.T) {
	a := newAgent(agentproto.ProtoOffset)
	a.delay = 30 * time.Millisecond
	a.slowWrite, a.slowDelay = 2, 200*time.Millisecond
	sb := newSandbox(a)
	want := data(5*Chunk + 99)
	if _, _, err := run(t, sb, target, bytes.NewReader(want)); err != nil {
		t.Fatal(err)
	}
	if len(a.writes) != 6 {
		t.Fatalf("%d writes, want 6", len(a.writes))
	}
	first, rest := a.writes[0], slices.Clone(a.writes[1:])
	if first.req.At || first.req.Append || len(first.req.Data) != Chunk {
		t.Fatalf("first write: at %v, append %v, %d bytes; want the file created with the first chunk", first.req.At, first.req.Append, len(first.req.Data))
	}
	if rest[0].start < first.end {
		t.Fatal("a write began before the first (which creates the file) ended")
	}
	slices.SortFunc(rest, func(x, y *gotWrite) int { return int(x.req.Offset - y.req.Offset) })
	for i, w := range rest {
		n := Chunk
		if i == len(rest)-1 {
			n = 99
		}
		if !w.req.At || w.req.Append || w.req.Offset != int64((i+1)*Chunk) || len(w.req.Data) != n {
			t.Errorf("write at %v offset %d append %v of %d bytes; want at offset %d, %d bytes", w.req.At, w.req.Offset, w.req.Append, len(w.req.Data), (i+1)*Chunk, n)
		}
	}
	if a.maxInFlight < 2 || a.maxInFlight > Depth {
		t.Errorf("%d writes in flight at once, want 2 to %d", a.maxInFlight, Depth)
	}
	checkFile(t, sb, want)
}

// TestFileRawOrBase64: to an agent that takes a payload each chunk goes
// raw, outside the request's JSON; to one that does not, as base64 in
// the JSON, ChunkJSON bytes per call.
func TestFileRawOrBase64(t *testing.T) {
	want := data(Chunk + 10)
	t.Run("raw", func(t *testing.T) {
		a := newAgent(agentproto.ProtoPayload)
		sb := newSandbox(a)
		if _, _, err := run(t, sb, target, bytes.NewReader(want)); err != nil {
			t.Fatal(err)
		}
		if got := lengths(a.writes); !slices.Equal(got, []int{Chunk, 10}) {
			t.Fatalf("writes of %v bytes, want [Chunk 10]", got)
		}
		for i, w := range a.writes {
			if !w.raw || strings.Contains(w.json, `"data"`) {
				t.Errorf("write %d: raw %v, request %.80s; want the data as a payload only", i, w.raw, w.json)
			}
		}
		checkFile(t, sb, want)
	})
	t.Run("base64", func(t *testing.T) {
		a := newAgent(protoJSON)
		sb := newSandbox(a)
		if _, _, err := run(t, sb, target, bytes.NewReader(want)); err != nil {
			t.Fatal(err)
		}
		if got := lengths(a.writes); !slices.Equal(got, []int{ChunkJSON, ChunkJSON, ChunkJSON, ChunkJSON, 10}) {
			t.Fatalf("writes of %v bytes, want ChunkJSON per call", got)
		}
		off := 0
		for i, w := range a.writes {
			piece := want[off : off+len(w.req.Data)]
			off += len(w.req.Data)
			if w.raw || !strings.Contains(w.json, `"data":"`+base64.StdEncoding.EncodeToString(piece)+`"`) {
				t.Errorf("write %d: raw %v; want its data as base64 in the JSON", i, w.raw)
			}
		}
		checkInOrder(t, a)
		checkFile(t, sb, want)
	})
}

// TestFileEmpty: an empty upload makes an empty file: one write that
// creates it, then the rename.
func TestFileEmpty(t *testing.T) {
	for _, tc := range []struct {
		name     string
		proto    int
		recorded bool
	}{{"json", protoJSON, false}, {"payload", agentproto.ProtoPayload, false}, {"offset", agentproto.ProtoOffset, false}, {"trajectory", agentproto.ProtoOffset, true}} {
		t.Run(tc.name, func(t *testing.T) {
			a := newAgent(tc.proto)
			sb := newSandbox(a)
			sb.recorded = tc.recorded
			fi, tmp, err := run(t, sb, target, bytes.NewReader(nil))
			if err != nil {
				t.Fatal(err)
			}
			if len(a.writes) != 1 || a.writes[0].req.Append || a.writes[0].req.At || len(a.writes[0].req.Data) != 0 {
				t.Fatalf("%d writes (%v bytes), want one that creates the file empty", len(a.writes), lengths(a.writes))
			}
			if want := []string{"rename " + tmp + " " + target, "stat " + target}; !slices.Equal(sb.ops, want) {
				t.Fatalf("after the write: %q, want %q", sb.ops, want)
			}
			if fi == nil || fi.Size != 0 {
				t.Fatalf("answered %+v, want an empty file", fi)
			}
			checkFile(t, sb, []byte{})
		})
	}
}

// TestFileRefused: a path that is not absolute or names the root, and an
// unknown sandbox, are refused before anything is written.
func TestFileRefused(t *testing.T) {
	for _, p := range []string{"", "/", "work/out.bin"} {
		sb := newSandbox(newAgent(agentproto.ProtoOffset))
		_, err := File(context.Background(), fakeHost{sb}, "sb-1", p, 0, bytes.NewReader(data(10)))
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Code != api.CodeBadRequest || ae.Message != "upload: a file path is required" {
			t.Errorf("upload to %q: %v, want a bad request", p, err)
		}
		if sb.waited || len(sb.ops) != 0 || len(sb.agent.writes) != 0 {
			t.Errorf("upload to %q: the sandbox was used", p)
		}
	}
	sb := newSandbox(newAgent(agentproto.ProtoOffset))
	_, err := File(context.Background(), fakeHost{sb}, "sb-2", target, 0, bytes.NewReader(data(10)))
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeNotFound {
		t.Fatalf("upload to an unknown sandbox: %v, want not found", err)
	}
	if len(sb.ops) != 0 || len(sb.agent.writes) != 0 {
		t.Fatal("an upload to an unknown sandbox wrote")
	}
}
