package warren

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"
)

// InProcess serves h (an API server's http.Handler) to an HTTP client
// without a socket: each connection is an in-memory pipe served by a real
// http.Server, so streamed answers, full-duplex bodies and WebSocket
// upgrades (Client.Terminal) work as over TCP. Give the client to New
// with WithHTTPClient and any base URL; stop ends the server and its
// connections.
func InProcess(h http.Handler) (hc *http.Client, stop func()) {
	ln := &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	tr := &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return ln.dial(ctx) },
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &http.Client{Transport: tr}, func() {
		tr.CloseIdleConnections()
		_ = srv.Close()
	}
}

// pipeListener hands the server one end of each pipe its dial made.
type pipeListener struct {
	conns chan net.Conn
	once  sync.Once
	done  chan struct{}
}

var errListenerClosed = errors.New("warren: in-process listener closed")

func (l *pipeListener) dial(ctx context.Context) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-l.done:
		return nil, errListenerClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, errListenerClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "in-process" }
