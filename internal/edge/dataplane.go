package edge

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/sandboxspec"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// dataUploads are the DataOps that read an upload.
var dataUploads = map[string]bool{OpFileUpload: true, OpTarUpload: true, OpPort: true, edgeproto.OpDisplay: true}

// duplexOps read an upload while their answer streams: the uploads, and
// the input of a command with live input.
var duplexOps = map[string]bool{OpFileUpload: true, OpTarUpload: true, OpExecLive: true, OpPort: true, edgeproto.OpDisplay: true}

// startData opens the data listener (Config.DataListen) and serves the
// streaming operations on it with the same handler, and the same scope
// check, as bus calls; the scope comes from the verified grant.
func (e *Edge) startData(ctx context.Context) error {
	if e.cfg.DataListen == "" {
		return nil
	}
	key, err := e.cfg.Bus.DataPlaneKey(ctx)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", e.cfg.DataListen)
	if err != nil {
		return fmt.Errorf("edge: data listener: %w", err)
	}
	e.dataAddr = e.cfg.DataAdvertise
	if e.dataAddr == "" {
		e.dataAddr = ln.Addr().String()
	}
	e.data = &dataplane.Server{Key: key, Handle: e.handleData, Ops: DataOps, Uploads: duplexOps, Logger: e.log}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		if err := e.data.Serve(ln); err != nil {
			e.log.Error("edge: data listener", "err", err)
		}
	}()
	e.log.Info("edge data listener", "addr", e.dataAddr)
	return nil
}

// handleData serves one data-plane call through handle. The body must name
// the grant's sandbox: a grant for one sandbox reaches no other.
func (e *Edge) handleData(ctx context.Context, g *dataplane.Grant, op string, body []byte, in io.Reader, chunk func(string, []byte) error) (any, error) {
	var id IDRequest
	if err := json.Unmarshal(body, &id); err != nil {
		return nil, badRequest("malformed request: %v", err)
	}
	if id.ID != g.Sandbox {
		return nil, &api.Error{Code: api.CodeForbidden, Message: fmt.Sprintf("the grant is for sandbox %s, not %s", g.Sandbox, id.ID)}
	}
	h := map[string]string{bus.HeaderSandbox: g.Sandbox}
	if g.Scoped {
		h[bus.HeaderScope] = g.Scope
	} else {
		h[bus.HeaderRoot] = "1" // the signed grant says so
	}
	if op == OpExecLive {
		var req ExecLiveRequest
		if err := decode(body, &req); err != nil {
			return nil, err
		}
		if err := e.inScope(g); err != nil {
			return nil, err
		}
		return e.execLive(ctx, &req, in, chunk)
	}
	if op == OpPort {
		return e.servePort(ctx, g, body, in, chunk)
	}
	if op == edgeproto.OpDisplay {
		return e.serveDisplay(ctx, g, body, in, chunk)
	}
	if dataUploads[op] {
		var req FileRequest
		if err := decode(body, &req); err != nil {
			return nil, err
		}
		if err := e.inScope(g); err != nil {
			return nil, err
		}
		if op == OpTarUpload {
			return e.uploadTar(ctx, &req, in)
		}
		return e.uploadFile(ctx, &req, in)
	}
	return e.handle(bus.WithIncoming(ctx, h), op, body, bus.FuncReplier(chunk))
}

// inScope checks a scoped grant's sandbox against its scope, as handle
// does for bus calls.
func (e *Edge) inScope(g *dataplane.Grant) error {
	sb, err := e.lookup(g.Sandbox)
	if err != nil {
		return err
	}
	if g.Scoped && !sandboxspec.Within(sb.rec.Spec.Project, g.Scope) {
		return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("sandbox %s not found", g.Sandbox)}
	}
	return nil
}

// Upload chunks: what one agent write carries (raw, or base64 in JSON to
// an agent that takes no payload), and how many writes of one upload may
// be in flight at once (each at its offset, to an agent of ProtoOffset).
const (
	uploadChunk     = 4 << 20
	uploadChunkJSON = 1 << 20
	uploadDepth     = 3
)

// uploadFile writes req.Path from in: written to a temporary name beside
// it, then renamed into place; a broken upload (in fails: the caller went
// away) removes the temporary file. In a trajectory sandbox every write
// goes through fileRecorded, as the chunks of an upload over the bus do.
func (e *Edge) uploadFile(ctx context.Context, req *FileRequest, in io.Reader) (any, error) {
	if req.Path == "" || req.Path == "/" || !strings.HasPrefix(req.Path, "/") {
		return nil, badRequest("upload: a file path is required")
	}
	sb, err := e.lookup(req.ID)
	if err != nil {
		return nil, err
	}
	<-sb.ready
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := path.Join(path.Dir(req.Path), ".warren-upload-"+hex.EncodeToString(rnd[:]))
	fail := func(err error) (any, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = e.fileRecorded(cctx, OpFileRemove, &FileRequest{ID: req.ID, Path: tmp}, nil)
		return nil, err
	}
	size, depth := uploadChunk, e.uploadDepth(req.ID, sb)
	if sb.traj != nil {
		size = uploadChunkJSON
	}
	up := newUploadWrites(size, depth)
	var off int64
	for first := true; ; first = false {
		buf := up.buffer()
		n, rerr := dataplane.ReadChunk(in, buf)
		if rerr != nil && rerr != io.EOF {
			up.wait()
			return fail(&api.Error{Code: api.CodeBadRequest, Message: "upload broken: " + rerr.Error()})
		}
		if err := up.err(); err != nil {
			up.wait()
			return fail(err)
		}
		switch {
		case first:
			// The first write creates the file, alone: the others
			// append to it or write into it.
			w := &FileRequest{ID: req.ID, Path: tmp, Mode: req.Mode, Data: buf[:n]}
			up.start(func() error { return e.uploadWrite(ctx, sb, w, -1) }, buf)
			up.wait()
			if err := up.err(); err != nil {
				return fail(err)
			}
		case n > 0:
			w := &FileRequest{ID: req.ID, Path: tmp, Mode: req.Mode, Data: buf[:n], Append: true}
			at := off
			if depth == 1 {
				at = -1 // appended, in order: one write at a time
			}
			up.start(func() error { return e.uploadWrite(ctx, sb, w, at) }, buf)
		default:
			up.release(buf)
		}
		off += int64(n)
		if rerr != nil {
			break
		}
	}
	up.wait()
	if err := up.err(); err != nil {
		return fail(err)
	}
	if _, err := e.fileRecorded(ctx, OpFileRename, &FileRequest{ID: req.ID, Path: tmp, To: req.Path}, nil); err != nil {
		return fail(err)
	}
	return e.file(ctx, OpFileStat, &FileRequest{ID: req.ID, Path: req.Path}, nil)
}

// uploadDepth is how many writes of an upload to sb may be in flight: one
// (appended in order) in a trajectory sandbox, whose writes are recorded
// in order, and to an agent that cannot write at an offset.
func (e *Edge) uploadDepth(id string, sb *sandbox) int {
	if sb.traj != nil {
		return 1
	}
	_, agent, release, err := e.acquire(id)
	if err != nil {
		return 1 // the first write answers the error
	}
	defer release()
	if agent.Proto() < agentproto.ProtoOffset {
		return 1
	}
	return uploadDepth
}

// uploadWrites are the agent writes of one upload in flight: at most
// depth at once, and one more buffer being filled from the upload
// meanwhile. Every write is waited for before the upload ends or fails,
// so none outlives the removal of the temporary file.
type uploadWrites struct {
	free  chan []byte   // buffers not in use
	slots chan struct{} // one per write in flight
	wg    sync.WaitGroup
	mu    sync.Mutex
	first error // the first write that failed
}

func newUploadWrites(size, depth int) *uploadWrites {
	u := &uploadWrites{free: make(chan []byte, depth+1), slots: make(chan struct{}, depth)}
	for range depth + 1 {
		u.free <- make([]byte, size)
	}
	return u
}

// buffer waits for a buffer no write uses.
func (u *uploadWrites) buffer() []byte { return <-u.free }

func (u *uploadWrites) release(buf []byte) { u.free <- buf }

// start runs write once a slot is free; its buffer is released after it.
func (u *uploadWrites) start(write func() error, buf []byte) {
	u.slots <- struct{}{}
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		err := write()
		if err != nil {
			u.mu.Lock()
			if u.first == nil {
				u.first = err
			}
			u.mu.Unlock()
		}
		<-u.slots
		u.release(buf)
	}()
}

func (u *uploadWrites) wait() { u.wg.Wait() }

func (u *uploadWrites) err() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.first
}

// uploadWrite writes one chunk of an upload: recorded in a trajectory
// sandbox, else straight to the agent (raw when it takes a payload); at
// its offset at (pwrite) unless at is negative.
//
// A write is not cancelled with its upload: a short one that the agent
// finished after the edge stopped waiting would recreate the temporary
// file that the upload's failure removes.
func (e *Edge) uploadWrite(ctx context.Context, sb *sandbox, req *FileRequest, at int64) error {
	ctx = context.WithoutCancel(ctx)
	if sb.traj != nil {
		_, err := e.fileRecorded(ctx, OpFileWrite, req, nil)
		return err
	}
	sb, agent, release, err := e.acquire(req.ID)
	if err != nil {
		return err
	}
	defer release()
	w := &agentproto.WriteRequest{Path: req.Path, Mode: req.Mode, Append: req.Append}
	if at >= 0 {
		w.At, w.Offset, w.Append = true, at, false
	}
	if agent.Proto() >= agentproto.ProtoPayload {
		err = agent.CallPayload(ctx, agentproto.OpFileWrite, w, req.Data, nil, nil)
	} else {
		for data := req.Data; err == nil && (len(data) > 0 || !w.Append); {
			c := data[:min(len(data), uploadChunkJSON)]
			w.Data = c
			err = agent.Call(ctx, agentproto.OpFileWrite, w, nil, nil)
			w.Append, data = true, data[len(c):]
		}
	}
	if err != nil {
		return e.agentError(sb, err)
	}
	return nil
}

// uploadTar extracts the tar stream in into req.Path, 4 MiB per agent call
// (raw to an agent that takes a payload). A broken stream aborts the
// extraction (nothing of it is extracted) and fails the call.
func (e *Edge) uploadTar(ctx context.Context, req *FileRequest, in io.Reader) (any, error) {
	sb, agent, release, err := e.acquire(req.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	if sb.traj != nil {
		return nil, &api.Error{Code: api.CodeConflict, Message: "archive uploads are not recorded in a trajectory; upload files one by one"}
	}
	raw := agent.Proto() >= agentproto.ProtoPayload
	size := uploadChunk
	if !raw {
		size = uploadChunkJSON
	}
	// Each call is let finish (the extraction is the agent's to end: the
	// final call below), also when the stream broke.
	wctx := context.WithoutCancel(ctx)
	put := func(data []byte, final, abort bool, handle string) (*TarPutResult, error) {
		var res TarPutResult
		var err error
		tr := &agentproto.TarPutRequest{Path: req.Path, Handle: handle, Final: final, Abort: abort}
		if raw {
			err = agent.CallPayload(wctx, agentproto.OpTarPut, tr, data, &res, nil)
		} else {
			tr.Data = data
			err = agent.Call(wctx, agentproto.OpTarPut, tr, &res, nil)
		}
		if err != nil {
			return nil, e.agentError(sb, err)
		}
		return &res, nil
	}
	buf := make([]byte, size)
	handle := ""
	for {
		n, rerr := dataplane.ReadChunk(in, buf)
		if rerr != nil && rerr != io.EOF {
			if handle != "" { // nothing of it is extracted
				_, _ = put(nil, false, true, handle)
			}
			return nil, &api.Error{Code: api.CodeBadRequest, Message: "archive upload broken: " + rerr.Error()}
		}
		res, err := put(buf[:n], rerr != nil, false, handle)
		if err != nil {
			return nil, err
		}
		if rerr != nil {
			return &TarPutResult{Files: res.Files}, nil
		}
		handle = res.Handle
	}
}

// checkSandboxHeader refuses a request whose Warren-Sandbox header (the
// sandbox its scope was checked against) names another sandbox than its
// body (the sandbox it acts on).
func checkSandboxHeader(ctx context.Context, op string, body []byte) error {
	hid, ok := bus.HeaderOf(ctx, bus.HeaderSandbox)
	if !ok || !(edgeOps[op].sandboxBody || duplexOps[op]) {
		return nil
	}
	bid, err := bodyID(body)
	if err != nil {
		return badRequest("malformed request: %v", err)
	}
	if bid != hid {
		return badRequest("the request is about sandbox %q but addressed to sandbox %q", bid, hid)
	}
	return nil
}

// bodyID reads the top-level "id" of a JSON object ("" when it has none),
// without decoding more than it must (the id comes first in the requests
// that have one; an upload chunk's data follows it).
func bodyID(body []byte) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return "", fmt.Errorf("not a JSON object")
	}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return "", err
		}
		if k, _ := t.(string); k == "id" {
			var id string
			err := dec.Decode(&id)
			return id, err
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return "", err
		}
	}
	return "", nil
}
