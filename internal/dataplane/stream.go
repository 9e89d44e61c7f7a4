package dataplane

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
)

// Streams: a call that is a byte stream both ways (a port of a sandbox,
// issue 16). The caller's bytes are the call's upload; the edge's are
// data frames. The edge answers an empty data frame first, once it has
// connected (or an error frame: nothing listens there), then the bytes
// from the sandbox, an "eof" frame when the sandbox closed its side of
// the connection, and the done frame when both directions ended. A half
// close works both ways: CloseWrite ends the upload, which the edge passes
// on as a shutdown of its connection's write side.

// Stream is an open stream call, usable as a net.Conn. Read and Write may
// be called from one goroutine each; Close from any.
type Stream struct {
	cancel context.CancelFunc
	body   io.ReadCloser // the answer's frames
	pw     *io.PipeWriter
	op     string

	buf     []byte // the frame being read
	pending []byte // what of it Read has not returned yet
	rerr    error  // the read side's end

	closeOnce sync.Once
}

// Open starts stream call c and returns once the edge has connected: an
// error the edge answered (nothing listens on the port, say) comes back
// as *api.Error, as from Do. The stream lives until Close, or until ctx
// ends.
func (cl *Client) Open(ctx context.Context, c *Call) (*Stream, error) {
	ctx, cancel := context.WithCancel(ctx)
	ok := false
	defer func() {
		if !ok {
			cancel()
		}
	}()
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(c.Body)))
	pr, pw := io.Pipe()
	body := io.MultiReader(bytes.NewReader(hdr[:]), bytes.NewReader(c.Body), pr)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.Addr+callPrefix+c.Op, body)
	if err != nil {
		return nil, fmt.Errorf("dataplane: %w", err)
	}
	g := &Grant{Sandbox: c.Sandbox, Op: c.Op, Scope: c.Scope, Scoped: c.Scoped, Expires: time.Now().Add(GrantTTL).Unix()}
	req.Header.Set(hdrGrant, Sign(cl.key, g))
	resp, err := cl.hc.Do(req)
	if err != nil {
		pw.Close()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
		}
		return nil, fmt.Errorf("%w: %s: %w", ErrBroken, c.Op, err)
	}
	s := &Stream{cancel: cancel, body: resp.Body, pw: pw, op: c.Op}
	if resp.StatusCode != http.StatusOK {
		defer s.Close()
		var eb api.ErrorBody
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
			return nil, &eb.Error
		}
		return nil, fmt.Errorf("dataplane: %s: status %d", c.Op, resp.StatusCode)
	}
	kind, b, err := readFrame(resp.Body, nil)
	if err == nil && kind == kindError {
		err = frameError(b)
	} else if err == nil && (kind != kindData || len(b) != 0) {
		err = fmt.Errorf("dataplane: %s: stream opened with a frame of kind %q", c.Op, kind)
	}
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		s.Close()
		return nil, err
	}
	ok = true
	return s, nil
}

func frameError(b []byte) error {
	e := new(api.Error)
	if err := json.Unmarshal(b, e); err != nil || e.Code == "" {
		return &api.Error{Code: api.CodeInternal, Message: "malformed error answer"}
	}
	return e
}

// Read reads the sandbox's bytes: io.EOF once the sandbox closed its side,
// ErrBroken when the stream broke first.
func (s *Stream) Read(p []byte) (int, error) {
	for len(s.pending) == 0 {
		if s.rerr != nil {
			return 0, s.rerr
		}
		kind, b, err := readFrame(s.body, s.buf)
		if err != nil {
			s.rerr = err
			return 0, err
		}
		s.buf = b
		switch kind {
		case kindData:
			s.pending = b
		case kindEOF, kindDone:
			s.rerr = io.EOF
		case kindError:
			s.rerr = frameError(b)
		default:
			s.rerr = fmt.Errorf("dataplane: %s: frame of unexpected kind %q", s.op, kind)
		}
	}
	n := copy(p, s.pending)
	s.pending = s.pending[n:]
	return n, nil
}

// Write sends bytes to the sandbox; it blocks while they cannot go on
// (flow control all the way to the sandbox's socket).
func (s *Stream) Write(p []byte) (int, error) {
	n, err := s.pw.Write(p)
	if errors.Is(err, io.ErrClosedPipe) {
		err = net.ErrClosed
	}
	return n, err
}

// CloseWrite ends the bytes to the sandbox (its reader sees an end of
// stream); reading goes on.
func (s *Stream) CloseWrite() error { return s.pw.Close() }

// Close ends the stream both ways: the request is reset, and the edge's
// handler sees its upload broken (an HTTP/1.1 server does not watch a
// connection while it reads the request's body, so its context may end
// only later) and closes its connection.
func (s *Stream) Close() error {
	s.closeOnce.Do(func() {
		s.pw.CloseWithError(net.ErrClosed)
		s.cancel()
		s.body.Close()
	})
	return nil
}

type streamAddr string

func (a streamAddr) Network() string { return "warren" }
func (a streamAddr) String() string  { return string(a) }

// LocalAddr and RemoteAddr name the stream's operation (net.Conn).
func (s *Stream) LocalAddr() net.Addr  { return streamAddr("apiserver") }
func (s *Stream) RemoteAddr() net.Addr { return streamAddr(s.op) }

// SetDeadline and its kin are not supported: a stream ends with Close or
// its context (net.Conn needs them; net/http's transport never calls them
// for plain HTTP).
func (s *Stream) SetDeadline(time.Time) error      { return errors.ErrUnsupported }
func (s *Stream) SetReadDeadline(time.Time) error  { return errors.ErrUnsupported }
func (s *Stream) SetWriteDeadline(time.Time) error { return errors.ErrUnsupported }
