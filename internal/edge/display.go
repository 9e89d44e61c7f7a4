package edge

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/runtime"
)

// A sandbox's screen (tier vm with display: true; issue 17, item 9):
// screenshots and input are bus calls answered through the runtime's
// runtime.Display; the VNC stream is a data-plane stream spliced with the
// screen's VNC socket, as a port's (ports.go). Each counts as an operation
// in flight (acquire): a paused sandbox is resumed, its idle timer waits.

// withDisplay runs fn on sandbox id's handle and the node's display
// capability, the sandbox held as an operation in flight.
func (e *Edge) withDisplay(id string, fn func(runtime.Display, runtime.Handle) error) error {
	d, ok := e.cfg.Runtime.(runtime.Display)
	if !ok {
		return displayError(id, runtime.ErrNoDisplay)
	}
	sb, _, release, err := e.acquire(id)
	if err != nil {
		return err
	}
	defer release()
	sb.mu.Lock()
	h := sb.inst.Handle
	sb.mu.Unlock()
	return displayError(id, fn(d, h))
}

// displayError is err as the API says it.
func displayError(id string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, runtime.ErrNoDisplay):
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s has no display (create it with tier vm and display: true)", id)}
	case errors.Is(err, runtime.ErrBadInput):
		return &api.Error{Code: api.CodeInvalid, Message: err.Error()}
	case errors.Is(err, runtime.ErrGone):
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s is stopping", id)}
	}
	var ae *api.Error
	if errors.As(err, &ae) {
		return err
	}
	return fmt.Errorf("sandbox %s: display: %w", id, err)
}

// screenshot answers OpScreenshot.
func (e *Edge) screenshot(ctx context.Context, id string) (*edgeproto.ScreenshotResult, error) {
	var res edgeproto.ScreenshotResult
	err := e.withDisplay(id, func(d runtime.Display, h runtime.Handle) (err error) {
		res.PNG, err = d.Screenshot(ctx, h)
		return err
	})
	if err != nil {
		return nil, err
	}
	return &res, nil
}

// displayInput answers OpDisplayInput.
func (e *Edge) displayInput(ctx context.Context, req *edgeproto.DisplayInputRequest) (struct{}, error) {
	return struct{}{}, e.withDisplay(req.ID, func(d runtime.Display, h runtime.Handle) error { return d.SendInput(ctx, h, req.Input) })
}

// serveDisplay serves one stream to a sandbox's VNC server.
func (e *Edge) serveDisplay(ctx context.Context, g *dataplane.Grant, body []byte, in io.Reader, chunk func(string, []byte) error) (any, error) {
	var req IDRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	if err := e.inScope(g); err != nil {
		return nil, err
	}
	// The stream is an operation in flight while it lasts.
	return nil, e.withDisplay(req.ID, func(d runtime.Display, h runtime.Handle) error {
		conn, err := d.DialDisplay(ctx, h)
		if err != nil {
			return err
		}
		defer conn.Close()
		stop := context.AfterFunc(ctx, func() { conn.Close() }) // the caller went away
		defer stop()
		if err := chunk("data", nil); err != nil { // connected
			return err
		}
		return splice(ctx, conn, in, chunk)
	})
}
