package edge

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"testing"

	"github.com/warrenhq/warren/internal/dataplane"
)

// A port stream carries bytes both ways whole, with half closes passed
// on: an echo server that answers everything and then closes its side
// (splice against a real TCP connection, over a real data listener).
func TestPortStreamEcho(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
				_ = c.(*net.TCPConn).CloseWrite()
			}()
		}
	}()
	key := []byte("0123456789abcdef0123456789abcdef")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dataplane.Server{Key: key, Ops: map[string]bool{OpPort: true}, Uploads: map[string]bool{OpPort: true},
		Handle: func(ctx context.Context, g *dataplane.Grant, op string, body []byte, in io.Reader, chunk func(string, []byte) error) (any, error) {
			conn, err := net.Dial("tcp", echo.Addr().String())
			if err != nil {
				return nil, err
			}
			defer conn.Close()
			if err := chunk("data", nil); err != nil {
				return nil, err
			}
			return nil, splice(ctx, conn, in, chunk)
		}}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	cl := dataplane.NewClient(key)
	for round := 0; round < 3; round++ {
		st, err := cl.Open(context.Background(), &dataplane.Call{Addr: ln.Addr().String(), Sandbox: "s", Op: OpPort, Body: []byte(`{}`)})
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, 8<<20)
		_, _ = rand.Read(data)
		go func() {
			_, _ = st.Write(data)
			_ = st.CloseWrite()
		}()
		got, err := io.ReadAll(st)
		st.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("round %d: %d of %d bytes back, %v", round, len(got), len(data), err)
		}
	}
}
