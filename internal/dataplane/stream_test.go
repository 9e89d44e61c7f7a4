package dataplane

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// An error the edge answers before the stream opens comes back as itself
// (not as the cancellation of the failed open), and closing an open stream
// breaks its upload on the edge (never a clean end of it).
func TestStreamOpenErrorAndClose(t *testing.T) {
	cancelled := make(chan struct{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Key: testKey, Ops: map[string]bool{"port": true}, Uploads: map[string]bool{"port": true},
		Handle: func(ctx context.Context, g *Grant, op string, body []byte, in io.Reader, chunk func(string, []byte) error) (any, error) {
			if string(body) == `{"port":1}` {
				return nil, &api.Error{Code: api.CodeBadGateway, Message: "nothing listens on port 1"}
			}
			if err := chunk("data", nil); err != nil {
				return nil, err
			}
			if err := chunk("data", []byte("hello")); err != nil {
				return nil, err
			}
			// An HTTP/1.1 server does not watch a connection whose request
			// body is still being read: the caller's end shows as a broken
			// upload (then as failing chunks), never as a clean end.
			if _, err := io.Copy(io.Discard, in); err != nil {
				close(cancelled)
			}
			return nil, nil
		}}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	c := NewClient(testKey)
	_, err = c.Open(context.Background(), &Call{Addr: ln.Addr().String(), Sandbox: "s", Op: "port", Body: []byte(`{"port":1}`)})
	if ae := (*api.Error)(nil); !errors.As(err, &ae) || ae.Code != api.CodeBadGateway {
		t.Fatalf("open of a port nobody listens on: %v", err)
	}
	st, err := c.Open(context.Background(), &Call{Addr: ln.Addr().String(), Sandbox: "s", Op: "port", Body: []byte(`{"port":2}`)})
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 5)
	if _, err := io.ReadFull(st, b); err != nil || string(b) != "hello" {
		t.Fatalf("read: %q %v", b, err)
	}
	st.Close()
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("closing the stream did not break its upload on the edge")
	}
	if _, err := st.Write([]byte("x")); err == nil {
		t.Fatal("a write to a closed stream succeeded")
	}
}
