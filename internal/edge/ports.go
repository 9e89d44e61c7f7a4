package edge

import (
	"context"
	"errors"
	"fmt"
	"github.com/warrenhq/warren/internal/edgeproto"
	"io"
	"net"
	"syscall"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/runtime"
)

// Ports in (issue 16, item 6): a stream call that connects to a port on
// the sandbox's loopback and splices it with the call's two directions
// (dataplane.Stream). The connection is made by the runtime from inside
// the sandbox's network namespace, so a sandbox without a network is
// reachable too and no rule of its policy is involved. While a connection
// is open it counts as an operation in flight (acquire): the sandbox's CPU
// gate is open and its idle timer does not run; a paused sandbox is
// resumed by it.

// OpPort and PortRequest: see internal/edgeproto.
const OpPort = edgeproto.OpPort

// PortRequest names a port of a sandbox's loopback (edgeproto).
type PortRequest = edgeproto.PortRequest

// portChunk is the most one data frame carries.
const portChunk = 256 << 10

// servePort serves one port stream.
func (e *Edge) servePort(ctx context.Context, g *dataplane.Grant, body []byte, in io.Reader, chunk func(string, []byte) error) (any, error) {
	var req PortRequest
	if err := decode(body, &req); err != nil {
		return nil, err
	}
	if req.Port < 1 || req.Port > 65535 {
		return nil, badRequest("port %d is out of range (1-65535)", req.Port)
	}
	if err := e.inScope(g); err != nil {
		return nil, err
	}
	d, ok := e.cfg.Runtime.(runtime.PortDialer)
	if !ok {
		return nil, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("the %s tier does not forward ports", e.cfg.Runtime.Name())}
	}
	sb, _, release, err := e.acquire(req.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	sb.mu.Lock()
	h := sb.inst.Handle
	sb.mu.Unlock()
	conn, err := d.DialPort(ctx, h, req.Port)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, &api.Error{Code: api.CodeBadGateway, Message: fmt.Sprintf("nothing listens on port %d in sandbox %s (a server must listen on its loopback, 127.0.0.1, ::1 or any address)", req.Port, req.ID)}
		}
		if errors.Is(err, runtime.ErrGone) {
			return nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s is stopping", req.ID)}
		}
		return nil, &api.Error{Code: api.CodeBadGateway, Message: fmt.Sprintf("connect to port %d in sandbox %s: %v", req.Port, req.ID, err)}
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() }) // the caller went away
	defer stop()
	if err := chunk("data", nil); err != nil { // connected
		return nil, err
	}
	return nil, splice(ctx, conn, in, chunk)
}

// splice copies in to conn and conn to chunk until both directions ended.
// The end of in (the caller's half close) shuts conn's write side; the end
// of conn's read side (the sandbox's) is an eof frame. A failure of either
// direction ends both.
func splice(ctx context.Context, conn net.Conn, in io.Reader, chunk func(string, []byte) error) error {
	upErr := make(chan error, 1)
	go func() {
		_, err := io.Copy(conn, in)
		if err == nil {
			if cw, ok := conn.(interface{ CloseWrite() error }); ok {
				err = cw.CloseWrite()
			}
		}
		if err != nil {
			conn.Close() // ends the other direction too
		}
		upErr <- err
	}()
	buf := make([]byte, portChunk)
	var downErr error
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if cerr := chunk("data", buf[:n]); cerr != nil {
				downErr = cerr
				break
			}
		}
		if err == io.EOF {
			downErr = chunk("eof", nil)
			break
		}
		if err != nil {
			downErr = err
			break
		}
	}
	if downErr != nil {
		conn.Close()
	}
	err := <-upErr
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if downErr != nil {
		return fmt.Errorf("port stream: %w", downErr)
	}
	if err != nil {
		return fmt.Errorf("port stream: %w", err)
	}
	return nil
}
