// Package connlimit caps the connections an HTTP server holds, in all and
// per client address, so that idle or slow clients can never take the
// descriptors the node needs for its sandboxes (agent channels, pipes,
// fork/exec). At the cap of all connections, a new one takes the place of
// an idle keep-alive connection (closed: its client reconnects when it
// needs to); when none is idle, and past a client's own cap, it is
// answered 503 and closed at once: it holds a descriptor for microseconds,
// not until it times out. Slow clients are bounded by the server's
// header timeout, idle ones by its idle timeout.
package connlimit

// Lock order: Limiter.mu is a leaf (an evicted connection is closed after
// it is released).

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Defaults of Config.
const (
	// DefaultPerClient is the default cap of one client address.
	DefaultPerClient = 1024
	// MinReserve is the fewest descriptors kept out of the HTTP budget.
	MinReserve = 256
)

// Config configures a Limiter.
type Config struct {
	// Max is the most connections held at once over every listener of the
	// limiter; 0 = Budget(): half the process's descriptor limit.
	Max int
	// PerClient is the most connections of one client (remote IP); 0 =
	// DefaultPerClient. Always at most a quarter of Max.
	PerClient int
	Logger    *slog.Logger
}

// Limiter counts the connections of one or more listeners.
type Limiter struct {
	max, perClient int
	log            *slog.Logger

	mu     sync.Mutex
	total  int
	byAddr map[string]int
	idle   map[*conn]struct{} // keep-alive connections between requests (ConnState)

	refused   atomic.Int64
	evicted   atomic.Int64
	lastWarnN atomic.Int64 // unix seconds of the last warning
}

// New makes a limiter.
func New(cfg Config) (*Limiter, error) {
	if cfg.Max < 0 || cfg.PerClient < 0 {
		return nil, errors.New("connlimit: connection caps must be 0 (the default) or more")
	}
	if cfg.Max == 0 {
		cfg.Max = Budget()
	}
	if cfg.PerClient == 0 {
		cfg.PerClient = DefaultPerClient
	}
	// One client can never fill the whole budget on its own.
	cfg.PerClient = min(cfg.PerClient, max(1, cfg.Max/4))
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Limiter{max: cfg.Max, perClient: cfg.PerClient, log: cfg.Logger, byAddr: map[string]int{}, idle: map[*conn]struct{}{}}, nil
}

// Caps are the limiter's caps: in all and per client.
func (l *Limiter) Caps() (max, perClient int) { return l.max, l.perClient }

// Open is how many connections are held now.
func (l *Limiter) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Refused is how many connections were refused so far.
func (l *Limiter) Refused() int64 { return l.refused.Load() }

// Evicted is how many idle connections were closed to make room.
func (l *Limiter) Evicted() int64 { return l.evicted.Load() }

// RaiseNoFile raises the soft RLIMIT_NOFILE of the process to its hard
// limit (Go does it at start since 1.19; this makes it explicit and
// reports it) and returns the limit.
func RaiseNoFile() (uint64, error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, fmt.Errorf("connlimit: getrlimit: %w", err)
	}
	if r.Cur < r.Max {
		r.Cur = r.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
			return r.Cur, fmt.Errorf("connlimit: setrlimit: %w", err)
		}
	}
	return r.Cur, nil
}

// Budget is the default cap of HTTP connections: half of the process's
// descriptor limit (the other half, and at least MinReserve, is kept for
// sandboxes, NATS and files).
func Budget() int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil || r.Cur == 0 {
		return 512
	}
	n := int(min(r.Cur, 1<<30))
	return max(16, min(n/2, n-MinReserve))
}

// Listen wraps ln so that its connections count against l.
func (l *Limiter) Listen(ln net.Listener) net.Listener { return &listener{Listener: ln, l: l} }

type listener struct {
	net.Listener
	l *Limiter
}

func (ln *listener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		addr := remoteIP(c)
		if ln.l.take(addr) {
			return &conn{Conn: c, l: ln.l, addr: addr}, nil
		}
		ln.l.refuse(c, addr)
	}
}

func remoteIP(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return c.RemoteAddr().String()
}

func (l *Limiter) take(addr string) bool {
	var evict *conn
	defer func() {
		if evict != nil {
			_ = evict.Close()
		}
	}()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.byAddr[addr] >= l.perClient {
		return false
	}
	if l.total >= l.max {
		for c := range l.idle {
			evict = c
			break
		}
		if evict == nil {
			return false
		}
		// Counted out now, so the new connection has its place.
		delete(l.idle, evict)
		evict.once.Do(func() { l.releaseLocked(evict) })
		l.evicted.Add(1)
	}
	l.total++
	l.byAddr[addr]++
	return true
}

func (l *Limiter) release(c *conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.releaseLocked(c)
}

func (l *Limiter) releaseLocked(c *conn) {
	c.released = true
	delete(l.idle, c)
	l.total--
	if l.byAddr[c.addr]--; l.byAddr[c.addr] <= 0 {
		delete(l.byAddr, c.addr)
	}
}

// ConnState is the http.Server's ConnState hook: it tells the limiter which
// connections are idle between requests (those it may close for room).
func (l *Limiter) ConnState(nc net.Conn, st http.ConnState) {
	c, ok := nc.(*conn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.released {
		return
	}
	if st == http.StateIdle {
		l.idle[c] = struct{}{}
	} else {
		delete(l.idle, c)
	}
}

// refusal is the whole answer to a connection past a cap.
var refusal = func() []byte {
	body := `{"error":{"code":"unavailable","message":"too many connections: this server's cap is reached"}}` + "\n"
	return []byte(fmt.Sprintf("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nRetry-After: 1\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
}()

// refuse answers c 503 and closes it. The answer fits the socket buffer of
// a new connection, so the write does not wait on the client.
func (l *Limiter) refuse(c net.Conn, addr string) {
	_ = c.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	_, _ = c.Write(refusal)
	_ = c.Close()
	n := l.refused.Add(1)
	now := time.Now().Unix()
	if last := l.lastWarnN.Load(); now-last >= 10 && l.lastWarnN.CompareAndSwap(last, now) {
		l.log.Warn("refusing connections past the cap", "client", addr, "refused_total", n, "max", l.max, "per_client", l.perClient)
	}
}

type conn struct {
	net.Conn
	l        *Limiter
	addr     string
	once     sync.Once
	released bool // under Limiter.mu
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}
