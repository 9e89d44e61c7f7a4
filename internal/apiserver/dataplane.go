package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/edgeproto"
)

type uploadKey struct{}

// withUpload makes the data-plane call made with ctx (callEdge, callData)
// stream in after its request.
func withUpload(ctx context.Context, in io.Reader) context.Context {
	return context.WithValue(ctx, uploadKey{}, in)
}

// canStream reports whether sandbox id's node takes op on its data listener.
func (s *Server) canStream(id, op string) bool {
	node := edgeproto.NodeOf(id)
	return node != "" && s.dataAddr(node, op) != ""
}

// dataAddr is where a call of op to node travels off the bus: the node's
// data listener, for the operations that stream ("" = on the bus: the
// operation does not stream, or the node has no data listener).
func (s *Server) dataAddr(node, op string) string {
	if s.data == nil || !edgeproto.DataOps[op] {
		return ""
	}
	return s.cfg.Watcher.DataAddr(node)
}

// callData makes a call over the data plane: the same request and answer as
// on the bus, with flow control from the client's socket to the agent's
// pipe, and cancelled on the edge and in the agent when ctx ends. h holds
// the headers a bus call would carry (the sandbox, the caller's scope);
// they go into the signed grant.
func (s *Server) callData(ctx context.Context, addr, id, op string, req, out any, onChunk func(bus.Chunk) error, h map[string]string) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("apiserver: encode %s: %w", op, err)
	}
	scope, scoped := h[bus.HeaderScope]
	c := &dataplane.Call{Addr: addr, Sandbox: id, Op: op, Scope: scope, Scoped: scoped, Body: body}
	c.Upload, _ = ctx.Value(uploadKey{}).(io.Reader)
	var fn func(string, []byte) error
	if onChunk != nil {
		fn = func(stream string, data []byte) error { return onChunk(bus.Chunk{Stream: stream, Data: data}) }
	}
	return s.data.Do(ctx, c, out, fn)
}
