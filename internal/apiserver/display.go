package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/coder/websocket"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// A sandbox's screen (tier vm with display: true; issue 17, item 9):
// GET …/screenshot is a PNG, POST …/display/input one keyboard or mouse
// event, and GET …/display upgrades to a WebSocket whose binary messages
// carry RFB both ways to the screen's VNC server (a stock noVNC client
// opens it), over one data-plane stream (edgeproto.OpDisplay) as a port's
// raw stream does.

func displayRoutes(s *Server) []route {
	return []route{
		{pattern: "GET /v1/sandboxes/{id}/screenshot", handler: s.screenshot, role: api.RoleViewer},
		{pattern: "GET /v1/sandboxes/{id}/display", handler: s.display},
		{pattern: "POST /v1/sandboxes/{id}/display/input", handler: s.displayInput},
	}
}

// screenshot answers the sandbox's screen as a PNG.
func (s *Server) screenshot(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var res edgeproto.ScreenshotResult
	if err := s.callEdge(r.Context(), id, edgeproto.OpScreenshot, &edgeproto.IDRequest{ID: id}, &res, nil); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "image/png")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(res.PNG)
	return nil
}

// displayInput sends one input event to the sandbox's screen.
func (s *Server) displayInput(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	var in api.DisplayInput
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	if err := s.callEdge(r.Context(), id, edgeproto.OpDisplayInput, &edgeproto.DisplayInputRequest{ID: id, Input: in}, nil, nil); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// display upgrades to a WebSocket carrying RFB to the sandbox's screen.
func (s *Server) display(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if _, err := s.ownSandbox(r.Context(), id); err != nil {
		return err
	}
	project, scoped := callerScope(r)
	// The stream outlives r's context (hijacked), as a raw port stream.
	octx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	st, err := s.openDisplay(octx, id, project, scoped)
	if err != nil {
		return err
	}
	defer st.Close()
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{"binary"}, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return nil // Accept answered the client
	}
	c.SetReadLimit(1 << 20)
	conn := websocket.NetConn(octx, c, websocket.MessageBinary)
	defer conn.Close()
	spliceConns(conn, conn, st)
	return nil
}

// openDisplay opens a stream to sandbox id's VNC server on its node.
func (s *Server) openDisplay(ctx context.Context, id, project string, scoped bool) (*dataplane.Stream, error) {
	node, err := nodeOf(id)
	if err != nil {
		return nil, err
	}
	addr := s.dataAddr(node, edgeproto.OpDisplay)
	if addr == "" {
		return nil, &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("node %s of sandbox %s has no data listener, which the display needs", node, id)}
	}
	body := fmt.Appendf(nil, `{"id":%q}`, id)
	st, err := s.data.Open(ctx, &dataplane.Call{Addr: addr, Sandbox: id, Op: edgeproto.OpDisplay, Scope: project, Scoped: scoped, Body: body})
	if errors.Is(err, dataplane.ErrUnreachable) {
		return nil, &api.Error{Code: api.CodeUnavailable, Message: fmt.Sprintf("node %s of sandbox %s is not available", node, id)}
	}
	return st, err
}
