package edge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/sandboxspec"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/dataplane"
	fileupload "github.com/warrenhq/warren/internal/edge/upload"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// dataUploads are the DataOps that read an upload.
var dataUploads = map[string]bool{OpFileUpload: true, OpTarUpload: true, OpPort: true, edgeproto.OpDisplay: true}

// duplexOps read an upload while their answer streams: the uploads, and
// the input of a command with live input.
var duplexOps = map[string]bool{OpFileUpload: true, OpTarUpload: true, OpExecLive: true, OpPort: true, edgeproto.OpDisplay: true, OpLayerUpload: true}

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
// the grant's sandbox: a grant for one sandbox reaches no other. A store
// upload (OpLayerUpload) names none, and its grant must not either.
func (e *Edge) handleData(ctx context.Context, g *dataplane.Grant, op string, body []byte, in io.Reader, chunk func(string, []byte) error) (any, error) {
	if op == OpLayerUpload {
		return e.uploadToStore(ctx, g, body, in)
	}
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

// uploadTar extracts the tar stream in into req.Path, 4 MiB per agent call
// (raw to an agent that takes a payload; the chunks of a file's upload,
// internal/edge/upload). A broken stream aborts the extraction (nothing
// of it is extracted) and fails the call.
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
	size := fileupload.Chunk
	if !raw {
		size = fileupload.ChunkJSON
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
