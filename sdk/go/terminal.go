package warren

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/coder/websocket"

	"github.com/warrenhq/warren/api"
)

// TerminalOptions says what a terminal runs (GET /v1/sandboxes/{id}/pty).
type TerminalOptions struct {
	// Cmd (through the sandbox's shell) or Argv; neither: the sandbox's
	// shell, interactive.
	Cmd  string
	Argv []string
	// Cols and Rows: the terminal's size (0: 80x24).
	Cols, Rows int
	User, Cwd  string
	Env        map[string]string
	Timeout    float64 // seconds; 0 = none
	// NoTTY runs the command without a terminal, its stdin fed live;
	// its stdout and stderr then come apart (Stderr).
	NoTTY bool
	// Stdout and Stderr, when set, receive the output as it comes;
	// otherwise read it from the Terminal (Read; StderrReader with NoTTY).
	// Without NoTTY everything is stdout.
	Stdout, Stderr io.Writer
}

// Terminal is a command with live input in a sandbox: a terminal (or,
// with NoTTY, a command whose stdin stays open). Write sends input, Read
// reads output; Resize, Signal and CloseInput control it; Wait returns its
// result once it ended. Close (or cancelling the context it was opened
// with) ends it: the command is killed. Output must be read (or go to
// TerminalOptions.Stdout): a terminal whose output nobody reads stops its
// command, as a real one does.
type Terminal struct {
	ws     *websocket.Conn
	ctx    context.Context
	cancel context.CancelFunc
	noTTY  bool

	outR, errR *io.PipeReader
	outW, errW *io.PipeWriter
	stdout     io.Writer
	stderr     io.Writer

	done   chan struct{}
	mu     sync.Mutex
	result *api.ExecResult
	err    error
}

// Terminal opens a terminal in sandbox id.
func (c *Client) Terminal(ctx context.Context, id string, opt TerminalOptions) (*Terminal, error) {
	q := url.Values{}
	if opt.Cmd != "" {
		q.Set("cmd", opt.Cmd)
	}
	for _, a := range opt.Argv {
		q.Add("argv", a)
	}
	if opt.NoTTY {
		q.Set("tty", "false")
	} else {
		if opt.Cols > 0 {
			q.Set("cols", strconv.Itoa(opt.Cols))
		}
		if opt.Rows > 0 {
			q.Set("rows", strconv.Itoa(opt.Rows))
		}
	}
	if opt.User != "" {
		q.Set("user", opt.User)
	}
	if opt.Cwd != "" {
		q.Set("cwd", opt.Cwd)
	}
	for k, v := range opt.Env {
		q.Add("env", k+"="+v)
	}
	if opt.Timeout > 0 {
		q.Set("timeout", strconv.FormatFloat(opt.Timeout, 'f', -1, 64))
	}
	u := c.URL() + "/v1/sandboxes/" + url.PathEscape(id) + "/pty?" + q.Encode()
	h := http.Header{}
	h.Set("Authorization", "Bearer "+c.token)
	h.Set("User-Agent", UserAgent)
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.hc, HTTPHeader: h, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, readError(resp)
		}
		return nil, fmt.Errorf("warren: terminal: %w", err)
	}
	ws.SetReadLimit(16 << 20)
	tctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	t := &Terminal{ws: ws, ctx: tctx, cancel: cancel, noTTY: opt.NoTTY, stdout: opt.Stdout, stderr: opt.Stderr, done: make(chan struct{})}
	if t.stdout == nil {
		t.outR, t.outW = io.Pipe()
		t.stdout = t.outW
	}
	if t.stderr == nil {
		if opt.NoTTY {
			t.errR, t.errW = io.Pipe()
			t.stderr = t.errW
		} else {
			t.stderr = t.stdout
		}
	}
	// Cancelling ctx ends the terminal, as it ends any call.
	stop := context.AfterFunc(ctx, func() { t.Close() })
	go func() {
		defer stop()
		t.readLoop()
	}()
	return t, nil
}

// readLoop delivers output until the command's end (or the connection's).
func (t *Terminal) readLoop() {
	var res *api.ExecResult
	var err error
	defer func() {
		t.mu.Lock()
		t.result, t.err = res, err
		t.mu.Unlock()
		end := io.EOF
		if err != nil {
			end = err
		}
		for _, w := range []*io.PipeWriter{t.outW, t.errW} {
			if w != nil {
				w.CloseWithError(end)
			}
		}
		close(t.done)
		t.ws.CloseNow()
	}()
	for {
		typ, b, rerr := t.ws.Read(t.ctx)
		if rerr != nil {
			err = fmt.Errorf("warren: terminal ended without its result: %w", rerr)
			return
		}
		if typ == websocket.MessageBinary {
			w := t.stdout
			if t.noTTY {
				if len(b) == 0 {
					continue
				}
				if b[0] == 2 {
					w = t.stderr
				}
				b = b[1:]
			}
			if _, werr := w.Write(b); werr != nil {
				err = fmt.Errorf("warren: terminal output: %w", werr)
				return
			}
			continue
		}
		var m api.TermMessage
		if jerr := json.Unmarshal(b, &m); jerr != nil {
			continue
		}
		switch m.Type {
		case api.TermExit:
			res = m.Result
			if res == nil {
				res = &api.ExecResult{}
				if m.Code != nil {
					res.ExitCode = *m.Code
				}
			}
			return
		case api.TermError:
			if m.Error != nil {
				err = &APIError{Status: statusForCode(m.Error.Code), Code: m.Error.Code, Message: m.Error.Message}
			} else {
				err = errors.New("warren: terminal failed")
			}
			return
		}
	}
}

// Read reads the terminal's output (stdout without a terminal); io.EOF
// once the command ended.
func (t *Terminal) Read(p []byte) (int, error) {
	if t.outR == nil {
		return 0, errors.New("warren: the output goes to TerminalOptions.Stdout")
	}
	return t.outR.Read(p)
}

// StderrReader is the command's stderr (NoTTY, without Stderr set).
func (t *Terminal) StderrReader() io.Reader {
	if t.errR == nil {
		return strings.NewReader("")
	}
	return t.errR
}

// inputMessage bounds one input message (the server takes at most 1 MiB).
const inputMessage = 64 << 10

// Write sends input (keystrokes) to the command.
func (t *Terminal) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m := min(len(p)-n, inputMessage)
		if err := t.ws.Write(t.ctx, websocket.MessageBinary, p[n:n+m]); err != nil {
			return n, fmt.Errorf("warren: terminal input: %w", err)
		}
		n += m
	}
	return n, nil
}

func (t *Terminal) control(ctx context.Context, m *api.TermMessage) error {
	b, _ := json.Marshal(m)
	if err := t.ws.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("warren: terminal %s: %w", m.Type, err)
	}
	return nil
}

// Resize changes the terminal's size: the command gets SIGWINCH.
func (t *Terminal) Resize(ctx context.Context, cols, rows int) error {
	return t.control(ctx, &api.TermMessage{Type: api.TermResize, Cols: cols, Rows: rows})
}

// Signal sends sig to the command's process group.
func (t *Terminal) Signal(ctx context.Context, sig int) error {
	return t.control(ctx, &api.TermMessage{Type: api.TermSignal, Signal: sig})
}

// CloseInput ends the command's input (a terminal gets its EOF character).
func (t *Terminal) CloseInput(ctx context.Context) error {
	return t.control(ctx, &api.TermMessage{Type: api.TermEOF})
}

// Wait waits for the command's end and returns its result.
func (t *Terminal) Wait(ctx context.Context) (*api.ExecResult, error) {
	select {
	case <-t.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.result, t.err
}

// Done is closed once the command ended (or the connection did).
func (t *Terminal) Done() <-chan struct{} { return t.done }

// Close ends the terminal: the command is killed if it still runs.
func (t *Terminal) Close() error {
	t.cancel()
	return t.ws.CloseNow()
}
