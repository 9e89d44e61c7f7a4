package dataplane

// Locks: Server.mu alone (srv, closed); the calls group's own lock is
// never taken under it.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/lifetime"
)

// Paths and headers of a call.
const (
	callPrefix     = "/v1/call/"
	hdrGrant       = "Warren-Grant"
	hdrDeadline    = "Warren-Deadline"
	contentType    = "application/vnd.warren.frames"
	maxRequestBody = 64 << 20
)

// Handler serves one call of op with its JSON request body, on behalf of
// the verified grant g. in is the call's upload (empty for most calls): it
// ends with io.EOF only when the caller sent all of it, with another error
// when the caller went away. chunk streams output; it blocks while the
// caller does not read (the flow control), and fails once the caller went
// away.
type Handler func(ctx context.Context, g *Grant, op string, body []byte, in io.Reader, chunk func(stream string, data []byte) error) (any, error)

// Server is an edge's data listener.
type Server struct {
	Key    []byte
	Handle Handler
	// Ops are the operations it serves; every other is refused. Uploads
	// are those that read an upload after their request.
	Ops, Uploads map[string]bool
	Logger       *slog.Logger

	mu     sync.Mutex
	srv    *http.Server // under mu
	closed bool         // under mu: Serve serves nothing more
	calls  lifetime.Group
}

// Serve answers calls on ln until Close.
func (s *Server) Serve(ln net.Listener) error {
	if s.Logger == nil {
		s.Logger = slog.Default()
	}
	mux := http.NewServeMux()
	mux.Handle("POST "+callPrefix+"{op}", s)
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		Protocols:         serverProtocols(),
		HTTP2:             h2config(),
		ErrorLog:          slog.NewLogLogger(s.Logger.Handler(), slog.LevelDebug),
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ln.Close()
	}
	s.srv = srv
	s.mu.Unlock()
	err := srv.Serve(ln)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops serving: calls in flight are reset (their callers see an
// error, their work is cancelled).
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	srv := s.srv
	s.mu.Unlock()
	s.calls.Close()
	if srv == nil {
		return nil
	}
	err := srv.Close()
	_ = s.calls.Wait(context.Background())
	return err
}

// Shutdown stops taking calls and lets those in flight finish until ctx
// ends; then it resets them (their work is cancelled) and waits for their
// handlers to return.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	srv := s.srv
	s.mu.Unlock()
	s.calls.Close()
	if srv == nil {
		return nil
	}
	err := srv.Shutdown(ctx)
	if err != nil {
		err = srv.Close()
	}
	_ = s.calls.Wait(context.Background())
	return err
}

// serverProtocols: the data listener takes HTTP/1.1 and HTTP/2 cleartext
// (with prior knowledge).
func serverProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

// clientProtocols: apiservers call over HTTP/1.1, one connection per call
// in flight (pooled): on loopback it carries twice the bytes of one HTTP/2
// connection for the same CPU, and TCP's own flow control and a closed
// connection give the backpressure and the cancellation. (An HTTP/2 client
// works the same: streams are reset instead.)
func clientProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	return p
}

// h2config sizes the flow-control windows: large enough that one stream
// fills a loopback or LAN link, small enough that a stalled reader holds
// little memory on each hop.
func h2config() *http.HTTP2Config {
	return &http.HTTP2Config{
		MaxReceiveBufferPerStream:     4 << 20,
		MaxReceiveBufferPerConnection: 64 << 20,
		MaxReadFrameSize:              1 << 20,
		SendPingTimeout:               10 * time.Second,
		PingTimeout:                   10 * time.Second,
	}
}

func refuse(w http.ResponseWriter, status int, code, msg string) {
	b, _ := json.Marshal(api.ErrorBody{Error: api.Error{Code: code, Message: msg}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// ServeHTTP serves one call: POST /v1/call/{op}, the grant in the
// Warren-Grant header, the JSON request as the body.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !s.calls.Enter() {
		refuse(w, http.StatusServiceUnavailable, api.CodeUnavailable, "data plane: the node is shutting down")
		return
	}
	defer s.calls.Done()
	op := strings.TrimPrefix(r.URL.Path, callPrefix)
	g, err := Verify(s.Key, r.Header.Get(hdrGrant), time.Now())
	if err != nil {
		refuse(w, http.StatusForbidden, api.CodeForbidden, "data plane: "+err.Error())
		return
	}
	if g.Op != op || !s.Ops[op] {
		refuse(w, http.StatusForbidden, api.CodeForbidden, fmt.Sprintf("data plane: the grant is not for %q", op))
		return
	}
	ctx := r.Context()
	if v := r.Header.Get(hdrDeadline); v != "" {
		d, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			refuse(w, http.StatusBadRequest, api.CodeBadRequest, "data plane: malformed deadline")
			return
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, d)
		defer cancel()
	}
	body, ok := readRequest(w, r)
	if !ok {
		return
	}
	var in io.Reader = http.NoBody
	if s.Uploads[op] {
		// The upload is read while the answer may already be written.
		_ = http.NewResponseController(w).EnableFullDuplex()
		in = r.Body
		// After the answer, what Handle left of the upload (it refused
		// it) is read to its end here, in the handler: net/http, full
		// duplex, would otherwise read it after the handler and panic on
		// the connection's next request ("invalid concurrent Body.Read
		// call", golang/go#68560), or end the connection after 256 KiB
		// while the caller, its upload sent, took it back to its pool:
		// its next call there broke. A caller that has not sent all of
		// its upload by the answer ends the connection (Client.Do).
		defer drainUpload(w, r.Body)
	} else if _, err := io.Copy(io.Discard, r.Body); err != nil {
		// Read to its end, so that HTTP/1.1 watches the connection: a
		// caller that goes away cancels ctx.
		return
	}
	w.Header().Set("Content-Type", contentType)
	w.WriteHeader(http.StatusOK)
	fw := &frameWriter{w: w, rc: http.NewResponseController(w)}
	out, err := s.Handle(ctx, g, op, body, in, fw.chunk)
	fw.answer(out, err)
}

// readRequest reads the JSON request at the start of r's body: its length
// (4 bytes, big-endian), then it; the upload, if any, follows. A request
// over maxRequestBody is refused; ok is false when there is none to serve
// (refused, or the caller went away).
func readRequest(w http.ResponseWriter, r *http.Request) (body []byte, ok bool) {
	var hdr [4]byte
	if _, err := io.ReadFull(r.Body, hdr[:]); err != nil {
		return nil, false // the caller went away
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxRequestBody {
		refuse(w, http.StatusRequestEntityTooLarge, api.CodeTooLarge, "data plane: request too large")
		return nil, false
	}
	body = make([]byte, n)
	if _, err := io.ReadFull(r.Body, body); err != nil {
		return nil, false
	}
	return body, true
}

// drainWait bounds reading the rest of an upload after the answer.
const drainWait = 30 * time.Second

// drainUpload sends the answer's last frame (frameWriter.last left it
// unflushed: a caller that streams its upload until it sees the answer,
// a terminal's input, would otherwise wait for it as long as this waits
// for the caller) and reads body to its end (see ServeHTTP).
func drainUpload(w http.ResponseWriter, body io.Reader) {
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	_ = rc.SetReadDeadline(time.Now().Add(drainWait))
	_, _ = io.Copy(io.Discard, body)
}

// frameWriter writes an answer's frames, each flushed at once.
type frameWriter struct {
	mu  sync.Mutex
	w   io.Writer
	rc  *http.ResponseController
	err error
}

// answer writes the answer's last frame: the error err (an *api.Error
// keeps its code), else out as JSON (a json.RawMessage as it is; none
// when out is nil).
func (f *frameWriter) answer(out any, err error) {
	if b, failed := api.AnswerBody(out, err); failed {
		_ = f.last(kindError, b)
	} else {
		_ = f.last(kindDone, b)
	}
}

func (f *frameWriter) chunk(stream string, data []byte) error {
	return f.end(streamKind(stream), data)
}

func (f *frameWriter) end(kind byte, b []byte) error {
	return f.write(kind, b, true)
}

// last writes the answer's last frame without flushing it: net/http
// flushes it with the end of the response when the handler returns, in
// one write (a flush here would cost a second write and wake the caller
// twice; an exec's round trip is mostly such wake-ups).
func (f *frameWriter) last(kind byte, b []byte) error {
	return f.write(kind, b, false)
}

func (f *frameWriter) write(kind byte, b []byte, flush bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return f.err
	}
	if err := writeFrame(f.w, kind, b); err != nil {
		f.err = err
		return err
	}
	if !flush {
		return nil
	}
	if err := f.rc.Flush(); err != nil {
		f.err = err
	}
	return f.err
}
