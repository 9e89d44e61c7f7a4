package apiserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// Terminals (api/terminal.go): GET /v1/sandboxes/{id}/pty upgrades to a
// WebSocket whose messages travel as one data-plane call (edgeproto.OpExecLive)
// in both directions: the client's binary messages and control messages
// become the call's input frames, the command's output its binary
// messages. Flow control holds end to end: a client that does not read
// stops the command's output at its terminal; one that types faster than
// the command reads waits on its socket. A client that goes away (the
// WebSocket closes or breaks) cancels the call, which kills the command's
// session.
//
// With tty=0 the command runs without a terminal and its stdin is fed
// the same way; each output message then starts with a stream byte (1
// stdout, 2 stderr), as Docker's and Kubernetes' attach protocols do.

// writeWait bounds writing a control message to a client.
const writeWait = 5 * time.Second

// Stream bytes of the output messages of a command without a terminal.
const (
	streamStdout = 1
	streamStderr = 2
)

// parseLive reads a terminal's query: cmd or argv (repeated), cols, rows,
// tty, user, cwd, env (repeated K=V), timeout (seconds).
func parseLive(r *http.Request) (*edgeproto.ExecLiveRequest, error) {
	q := r.URL.Query()
	req := &edgeproto.ExecLiveRequest{ID: r.PathValue("id")}
	x := &req.Exec
	x.Cmd, x.Argv, x.User, x.Cwd = q.Get("cmd"), q["argv"], q.Get("user"), q.Get("cwd")
	tty := true
	if v := q.Get("tty"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return nil, &api.Error{Code: api.CodeInvalid, Message: "tty must be true or false"}
		}
		tty = b
	}
	if tty {
		req.PTY = &api.TermSize{Cols: api.DefaultTermCols, Rows: api.DefaultTermRows}
		for name, dst := range map[string]*int{"cols": &req.PTY.Cols, "rows": &req.PTY.Rows} {
			if v := q.Get(name); v != "" {
				n, err := strconv.Atoi(v)
				if err != nil || n < 1 || n > api.MaxTermSize {
					return nil, &api.Error{Code: api.CodeInvalid, Message: fmt.Sprintf("%s must be a whole number between 1 and %d", name, api.MaxTermSize)}
				}
				*dst = n
			}
		}
	}
	for _, kv := range q["env"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, &api.Error{Code: api.CodeInvalid, Message: "env must be KEY=VALUE"}
		}
		if x.Env == nil {
			x.Env = map[string]string{}
		}
		x.Env[k] = v
	}
	if v := q.Get("timeout"); v != "" {
		t, err := strconv.ParseFloat(v, 64)
		if err != nil || t < 0 || t > 1e9 {
			return nil, &api.Error{Code: api.CodeInvalid, Message: "timeout must be a number of seconds"}
		}
		x.Timeout = t
	}
	if err := edgeproto.CheckLive(req); err != nil {
		return nil, err
	}
	return req, nil
}

func (s *Server) pty(w http.ResponseWriter, r *http.Request) error {
	req, err := parseLive(r)
	if err != nil {
		return err
	}
	// Whose it is and whether it runs are answered before the upgrade,
	// as plain HTTP errors.
	var sb api.Sandbox
	if err := s.callEdge(r.Context(), req.ID, edgeproto.OpGet, &edgeproto.IDRequest{ID: req.ID}, &sb, nil); err != nil {
		return err
	}
	if sb.State != api.StateRunning && sb.State != api.StatePaused {
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s is %s", req.ID, sb.State)}
	}
	if !s.canStream(req.ID, edgeproto.OpExecLive) {
		return &api.Error{Code: api.CodeConflict, Message: "the sandbox's node has no data listener: terminals need one"}
	}
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		return &api.Error{Code: api.CodeBadRequest, Message: "this endpoint is a WebSocket: send an Upgrade: websocket request"}
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return nil // Accept answered the client
	}
	c.SetReadLimit(dataplane.MaxInputFrame)
	s.runLive(r.Context(), c, req)
	return nil
}

// runLive carries one terminal (or live command) until its command ends
// or its client goes away.
func (s *Server) runLive(parent context.Context, c *websocket.Conn, req *edgeproto.ExecLiveRequest) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	pr, pw := io.Pipe()
	defer pw.Close()
	bad := make(chan string, 1)
	go func() {
		err := s.readLive(ctx, c, pw)
		var be *badControl
		if errors.As(err, &be) {
			bad <- be.msg
		}
		// A client that leaves ends the command; one that sent nonsense too.
		pw.CloseWithError(err)
		cancel()
	}()
	var res api.ExecResult
	tty := req.PTY != nil
	err := s.callEdge(withUpload(ctx, pr), req.ID, edgeproto.OpExecLive, req, &res, func(ch bus.Chunk) error {
		data := ch.Data
		if !tty {
			b := byte(streamStdout)
			if ch.Stream == "stderr" {
				b = streamStderr
			}
			data = append([]byte{b}, ch.Data...)
		}
		return c.Write(ctx, websocket.MessageBinary, data)
	})
	select {
	case msg := <-bad:
		c.Close(websocket.StatusPolicyViolation, clip(msg, 120))
		return
	default:
	}
	if parent.Err() != nil || (err != nil && ctx.Err() != nil) {
		c.CloseNow() // the client went away
		return
	}
	if err != nil {
		ae := s.toAPIError(err)
		s.sendControl(c, &api.TermMessage{Type: api.TermError, Error: ae})
		c.Close(websocket.StatusInternalError, clip(ae.Message, 120))
		return
	}
	code := res.ExitCode
	s.sendControl(c, &api.TermMessage{Type: api.TermExit, Code: &code, Result: &res})
	c.Close(websocket.StatusNormalClosure, "")
}

func (s *Server) sendControl(c *websocket.Conn, m *api.TermMessage) {
	b, _ := json.Marshal(m)
	ctx, cancel := context.WithTimeout(context.Background(), writeWait)
	defer cancel()
	_ = c.Write(ctx, websocket.MessageText, b)
}

// badControl is a control message the server does not take.
type badControl struct{ msg string }

func (e *badControl) Error() string { return e.msg }

// readLive turns the client's messages into input frames on w until the
// client goes away (or sends a bad control message, *badControl).
func (s *Server) readLive(ctx context.Context, c *websocket.Conn, w io.Writer) error {
	for {
		typ, b, err := c.Read(ctx)
		if err != nil {
			return err
		}
		if typ == websocket.MessageBinary {
			if err := dataplane.WriteInput(w, dataplane.InputData, b); err != nil {
				return err
			}
			continue
		}
		var m api.TermMessage
		if err := json.Unmarshal(b, &m); err != nil {
			return &badControl{"a text message must be a JSON control message: " + err.Error()}
		}
		var kind byte
		var body []byte
		switch m.Type {
		case api.TermResize:
			size := api.TermSize{Cols: m.Cols, Rows: m.Rows}
			if !size.Valid() {
				return &badControl{fmt.Sprintf("resize: cols and rows must be between 1 and %d", api.MaxTermSize)}
			}
			kind, body = dataplane.InputResize, mustJSON(size)
		case api.TermSignal:
			if m.Signal < 1 || m.Signal > 64 {
				return &badControl{"signal must be between 1 and 64"}
			}
			kind, body = dataplane.InputSignal, mustJSON(map[string]int{"signal": m.Signal})
		case api.TermEOF:
			kind = dataplane.InputEOF
		default:
			return &badControl{fmt.Sprintf("unknown control message type %q", clip(m.Type, 32))}
		}
		if err := dataplane.WriteInput(w, kind, body); err != nil {
			return err
		}
	}
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}

// Hijack lets a route take over the connection (a WebSocket upgrade); the
// status is then 101.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.code == 0 {
		w.code = http.StatusSwitchingProtocols
	}
	return conn, brw, err
}
