package e2e

// Connection limits (issue 19, problem 4): idle HTTP connections never take
// the descriptors that creates and execs need.

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// startServerWrapped is startServer with a command prefix (e.g. prlimit).
func startServerWrapped(t *testing.T, wrap []string, args ...string) *server {
	t.Helper()
	dataDir, err := os.MkdirTemp("", "wtest-data-")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, dataDir: dataDir, listen: freePort(t), args: args}
	t.Cleanup(func() {
		s.stop()
		os.RemoveAll(dataDir)
	})
	if err := s.launch(wrap, 60*time.Second); err != nil {
		t.Fatalf("start: %v\n%s", err, tail(s.logs.String(), 40))
	}
	return s
}

// openIdle opens n connections to addr from the local address from (""
// = any), each sending one GET /healthz and then staying idle; it returns
// them (closed at the end of the test) and how many got an answer.
func openIdle(t *testing.T, addr, from string, n int) []net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	var conns []net.Conn
	for i := 0; i < n; i++ {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Logf("dial %d of %d: %v", i, n, err)
			break
		}
		conns = append(conns, c)
		_, _ = fmt.Fprintf(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	}
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	return conns
}

// TestIdleConnectionsDoNotStopCreates: with 2,048 descriptors (prlimit),
// 2,000 idle connections that asked /healthz, from 8 client addresses other
// than the tenant's, leave room for the tenant's creates and execs:
// connections past the server's caps are closed, not held.
func TestIdleConnectionsDoNotStopCreates(t *testing.T) {
	s := startServerWrapped(t, []string{"prlimit", "--nofile=2048:2048", "--"})
	n := 0
	for i := 2; i < 10; i++ {
		n += len(openIdle(t, s.listen, fmt.Sprintf("127.0.0.%d", i), 250))
	}
	t.Logf("%d idle connections opened", n)
	time.Sleep(time.Second) // the server accepts them
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := 0; i < 3; i++ {
		sb, err := s.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox"})
		if err != nil {
			t.Fatalf("create %d with idle connections open: %v\n%s", i, err, tail(s.logs.String(), 20))
		}
		r, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo hi"})
		if err != nil || r.Stdout != "hi\n" {
			t.Fatalf("exec with idle connections open: %+v %v", r, err)
		}
		if _, err := s.C.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
}
