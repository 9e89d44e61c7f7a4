package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"net"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/dataplane"
)

// DataOps are the operations the data listener serves: those that stream.
var DataOps = map[string]bool{OpExec: true, OpFileRead: true, OpTarGet: true}

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
	e.data = &dataplane.Server{Key: key, Handle: e.handleData, Ops: DataOps, Logger: e.log}
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
func (e *Edge) handleData(ctx context.Context, g *dataplane.Grant, op string, body []byte, chunk func(string, []byte) error) (any, error) {
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
	}
	return e.handle(bus.WithIncoming(ctx, h), op, body, bus.FuncReplier(chunk))
}
