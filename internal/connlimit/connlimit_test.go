package connlimit

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serve runs an HTTP server on loopback behind l; it returns its address.
func serve(t *testing.T, l *Limiter) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }),
		ConnState: l.ConnState, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l.Listen(ln)) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// dial connects from the loopback address from and, with get, asks for /
// and reads the answer (the connection then stays idle). It returns the
// connection and the status line.
func dial(t *testing.T, addr, from string, get bool) (net.Conn, string) {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 2 * time.Second}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if !get {
		return c, ""
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	r := bufio.NewReader(c)
	line, _ := r.ReadString('\n')
	resp, err := http.ReadResponse(bufio.NewReader(io.MultiReader(strings.NewReader(line), r)), nil)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	return c, strings.TrimSpace(line)
}

func waitOpen(t *testing.T, l *Limiter, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for l.Open() != n {
		if time.Now().After(deadline) {
			t.Fatalf("open connections %d, want %d", l.Open(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestPerClientCap(t *testing.T) {
	l, err := New(Config{Max: 100, PerClient: 3})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, l)
	for i := 0; i < 3; i++ {
		if _, st := dial(t, addr, "127.0.0.1", true); st != "HTTP/1.1 200 OK" {
			t.Fatalf("connection %d: %q", i, st)
		}
	}
	if _, st := dial(t, addr, "127.0.0.1", true); st != "HTTP/1.1 503 Service Unavailable" {
		t.Fatalf("past the client's cap: %q", st)
	}
	// Another client is not held back by the first.
	if _, st := dial(t, addr, "127.0.0.2", true); st != "HTTP/1.1 200 OK" {
		t.Fatalf("another client: %q", st)
	}
	waitOpen(t, l, 4)
	if l.Refused() != 1 {
		t.Errorf("refused %d", l.Refused())
	}
}

func TestGlobalCapEvictsIdle(t *testing.T) {
	l, err := New(Config{Max: 8, PerClient: 8})
	if err != nil {
		t.Fatal(err)
	}
	if _, per := l.Caps(); per != 2 {
		t.Fatalf("per-client cap %d, want a quarter of the total", per)
	}
	addr := serve(t, l)
	// Four clients fill the budget with idle keep-alive connections.
	var idle []net.Conn
	for i := 0; i < 8; i++ {
		c, st := dial(t, addr, fmt.Sprintf("127.0.0.%d", 2+i/2), true)
		if st != "HTTP/1.1 200 OK" {
			t.Fatalf("connection %d: %q", i, st)
		}
		idle = append(idle, c)
	}
	waitOpen(t, l, 8)
	// A new client still gets through: an idle connection makes room.
	c, st := dial(t, addr, "127.0.0.1", true)
	if st != "HTTP/1.1 200 OK" {
		t.Fatalf("new client at the cap: %q", st)
	}
	idle = append(idle, c)
	if l.Evicted() != 1 || l.Open() != 8 {
		t.Errorf("evicted %d, open %d", l.Evicted(), l.Open())
	}
	// Connections that never sent a request are not idle: with the budget
	// full of them, a new one is refused.
	for _, c := range idle {
		c.Close()
	}
	waitOpen(t, l, 0)
	for i := 0; i < 8; i++ {
		dial(t, addr, fmt.Sprintf("127.0.1.%d", 2+i/2), false)
	}
	waitOpen(t, l, 8)
	if _, st := dial(t, addr, "127.0.0.9", true); st != "HTTP/1.1 503 Service Unavailable" {
		t.Fatalf("past the cap with nothing idle: %q", st)
	}
}

func TestBudgetKeepsDescriptors(t *testing.T) {
	n, err := RaiseNoFile()
	if err != nil {
		t.Fatal(err)
	}
	b := Budget()
	if b <= 0 || uint64(b) > n/2 || (n > 2*MinReserve && uint64(b) > n-MinReserve) {
		t.Fatalf("budget %d of %d descriptors", b, n)
	}
}
