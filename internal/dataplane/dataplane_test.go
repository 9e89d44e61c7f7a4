package dataplane

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

func TestGrant(t *testing.T) {
	g := &Grant{Sandbox: "sb-n-1", Op: "exec", Scope: "p", Scoped: true, Expires: time.Now().Add(time.Minute).Unix()}
	tok := Sign(testKey, g)
	got, err := Verify(testKey, tok, time.Now())
	if err != nil || *got != *g {
		t.Fatalf("verify: %+v %v", got, err)
	}
	if _, err := Verify([]byte("another key, another key, 32 by"), tok, time.Now()); !errors.Is(err, ErrBadGrant) {
		t.Fatalf("another key: %v", err)
	}
	if _, err := Verify(testKey, tok, time.Now().Add(2*time.Minute)); !errors.Is(err, ErrBadGrant) {
		t.Fatalf("expired: %v", err)
	}
	// The payload changed (scope widened), the signature kept.
	g2 := *g
	g2.Scoped = false
	forged := strings.Split(Sign(testKey, &g2), ".")[0] + "." + strings.Split(tok, ".")[1]
	if _, err := Verify(testKey, forged, time.Now()); !errors.Is(err, ErrBadGrant) {
		t.Fatalf("forged: %v", err)
	}
	for _, bad := range []string{"", ".", "x.y", tok + "x"} {
		if _, err := Verify(testKey, bad, time.Now()); err == nil {
			t.Fatalf("%q verified", bad)
		}
	}
}

// serve starts a data server with h on loopback.
func serve(t testing.TB, h Handler) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Key: testKey, Handle: h, Ops: map[string]bool{"read": true}}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	return s, ln.Addr().String()
}

// serveUploads starts a data server whose one operation, "up", reads an
// upload, with h on loopback; it returns its address.
func serveUploads(t testing.TB, h Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Key: testKey, Ops: map[string]bool{"up": true}, Uploads: map[string]bool{"up": true}, Handle: h}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	return ln.Addr().String()
}

func TestCallStreamsAndAnswers(t *testing.T) {
	_, addr := serve(t, func(ctx context.Context, g *Grant, op string, body []byte, in io.Reader, chunk func(string, []byte) error) (any, error) {
		if g.Sandbox != "sb-n-1" || !g.Scoped || g.Scope != "p" || string(body) != `{"id":"sb-n-1"}` {
			return nil, &api.Error{Code: api.CodeInvalid, Message: "unexpected call"}
		}
		for i := 0; i < 100; i++ {
			if err := chunk("stdout", bytes.Repeat([]byte{'a'}, 1000)); err != nil {
				return nil, err
			}
		}
		_ = chunk("stderr", []byte("e"))
		return map[string]int{"n": 100}, nil
	})
	c := NewClient(testKey)
	var out struct{ N int }
	var stdout, stderr int
	err := c.Do(context.Background(), &Call{Addr: addr, Sandbox: "sb-n-1", Op: "read", Scope: "p", Scoped: true, Body: []byte(`{"id":"sb-n-1"}`)}, &out,
		func(stream string, b []byte) error {
			if stream == "stdout" {
				stdout += len(b)
			} else {
				stderr += len(b)
			}
			return nil
		})
	if err != nil || out.N != 100 || stdout != 100000 || stderr != 1 {
		t.Fatalf("call: %v %+v %d %d", err, out, stdout, stderr)
	}
	// An operation the server does not serve, and a grant by another key.
	err = c.Do(context.Background(), &Call{Addr: addr, Sandbox: "sb-n-1", Op: "exec", Body: []byte(`{}`)}, nil, nil)
	if ae := (*api.Error)(nil); !errors.As(err, &ae) || ae.Code != api.CodeForbidden {
		t.Fatalf("unserved op: %v", err)
	}
	err = NewClient([]byte("not the key, not the key, 32 byt")).Do(context.Background(), &Call{Addr: addr, Sandbox: "sb-n-1", Op: "read", Body: []byte(`{}`)}, nil, nil)
	if ae := (*api.Error)(nil); !errors.As(err, &ae) || ae.Code != api.CodeForbidden {
		t.Fatalf("foreign key: %v", err)
	}
}

// A stream that breaks before its result is an error, never a short success.
func TestBrokenStreamIsAnError(t *testing.T) {
	srv, addr := serve(t, func(ctx context.Context, g *Grant, op string, body []byte, in io.Reader, chunk func(string, []byte) error) (any, error) {
		_ = chunk("data", []byte("part"))
		<-ctx.Done()
		return nil, ctx.Err()
	})
	c := NewClient(testKey)
	got := 0
	err := c.Do(context.Background(), &Call{Addr: addr, Sandbox: "s", Op: "read", Body: []byte(`{}`)}, nil, func(string, []byte) error {
		got++
		go srv.Close() // the edge goes away mid-stream
		return nil
	})
	if !errors.Is(err, ErrBroken) || got != 1 {
		t.Fatalf("want ErrBroken after one chunk, got %v after %d", err, got)
	}
	// Nothing listens any more: unreachable, at once.
	start := time.Now()
	err = c.Do(context.Background(), &Call{Addr: addr, Sandbox: "s", Op: "read", Body: []byte(`{}`)}, nil, nil)
	if !errors.Is(err, ErrUnreachable) || time.Since(start) > 2*time.Second {
		t.Fatalf("want ErrUnreachable within 2s, got %v after %v", err, time.Since(start))
	}
}

// A reader that stops reading stops the writer (flow control), and one that
// goes away cancels the handler.
func TestBackpressureAndCancel(t *testing.T) {
	var sent atomic.Int64
	cancelled := make(chan struct{})
	_, addr := serve(t, func(ctx context.Context, g *Grant, op string, body []byte, in io.Reader, chunk func(string, []byte) error) (any, error) {
		b := make([]byte, 256<<10)
		for {
			if err := chunk("data", b); err != nil {
				close(cancelled)
				return nil, err
			}
			sent.Add(int64(len(b)))
		}
	})
	c := NewClient(testKey)
	ctx, cancel := context.WithCancel(context.Background())
	stall := make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		errc <- c.Do(ctx, &Call{Addr: addr, Sandbox: "s", Op: "read", Body: []byte(`{}`)}, nil, func(string, []byte) error {
			<-stall // the client's socket is full
			return nil
		})
	}()
	time.Sleep(time.Second)
	a := sent.Load()
	time.Sleep(500 * time.Millisecond)
	if b := sent.Load(); b != a || b > 64<<20 {
		t.Fatalf("the writer went on while nobody read: %d then %d bytes", a, b)
	}
	t.Logf("a stalled reader holds %d bytes in flight", a)
	cancel()
	close(stall)
	select {
	case <-cancelled:
	case <-time.After(2 * time.Second):
		t.Fatal("the handler was not cancelled when its caller went away")
	}
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("call: %v", err)
	}
}

type failAfter struct {
	n   int
	err error
}

func (f *failAfter) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, f.err
	}
	k := min(len(p), f.n)
	f.n -= k
	return k, nil
}

// An upload arrives whole, or the handler sees it broken (never a clean
// end of a short upload).
func TestUpload(t *testing.T) {
	results := make(chan error, 1)
	var got atomic.Int64
	addr := serveUploads(t, func(ctx context.Context, g *Grant, op string, body []byte, in io.Reader, chunk func(string, []byte) error) (any, error) {
		n, err := io.Copy(io.Discard, in)
		got.Store(n)
		results <- err
		return map[string]int64{"n": n}, err
	})
	c := NewClient(testKey)
	var out struct{ N int64 }
	err := c.Do(context.Background(), &Call{Addr: addr, Sandbox: "s", Op: "up", Body: []byte(`{}`), Upload: &failAfter{n: 10 << 20, err: io.EOF}}, &out, nil)
	if err != nil || out.N != 10<<20 || <-results != nil {
		t.Fatalf("whole upload: %v %+v", err, out)
	}
	err = c.Do(context.Background(), &Call{Addr: addr, Sandbox: "s", Op: "up", Body: []byte(`{}`), Upload: &failAfter{n: 10 << 20, err: errors.New("client went away")}}, &out, nil)
	if herr := <-results; err == nil || herr == nil {
		t.Fatalf("broken upload: the caller got %v, the handler %v after %d bytes", err, herr, got.Load())
	}
}

// A call streams both ways at once: the caller sends a piece only after
// it got the echo of the one before (no WebSocket: one request, full
// duplex), as terminals and port forwards will.
func TestBidirectionalEcho(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Key: testKey, Ops: map[string]bool{"echo": true}, Uploads: map[string]bool{"echo": true},
		Handle: func(ctx context.Context, g *Grant, op string, body []byte, in io.Reader, chunk func(string, []byte) error) (any, error) {
			buf := make([]byte, 64)
			for {
				n, err := in.Read(buf)
				if n > 0 {
					if err := chunk("stdout", buf[:n]); err != nil {
						return nil, err
					}
				}
				if err == io.EOF {
					return nil, nil
				}
				if err != nil {
					return nil, err
				}
			}
		}}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	pr, pw := io.Pipe()
	echoed := make(chan string, 1)
	errc := make(chan error, 1)
	go func() {
		errc <- NewClient(testKey).Do(context.Background(), &Call{Addr: ln.Addr().String(), Sandbox: "s", Op: "echo", Body: []byte(`{}`), Upload: pr}, nil,
			func(stream string, b []byte) error {
				echoed <- string(b)
				return nil
			})
	}()
	for i := 0; i < 20; i++ {
		msg := "ping " + strings.Repeat("x", i)
		if _, err := pw.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-echoed:
			if got != msg {
				t.Fatalf("echo %d: %q, want %q", i, got, msg)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no echo of piece %d while the request is still open", i)
		}
	}
	pw.Close()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// Input frames: written and read in order; the upload's clean end between
// frames is io.EOF, one inside a frame is broken; oversized and unknown
// frames are refused.
func TestInputFrames(t *testing.T) {
	var b bytes.Buffer
	for _, f := range []struct {
		kind byte
		data string
	}{{InputData, "ls -l\r"}, {InputResize, `{"cols":120,"rows":40}`}, {InputSignal, `{"signal":2}`}, {InputEOF, ""}} {
		if err := WriteInput(&b, f.kind, []byte(f.data)); err != nil {
			t.Fatal(err)
		}
	}
	whole := b.Bytes()
	r := bytes.NewReader(whole)
	var got []string
	for {
		k, d, err := ReadInput(r, nil)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, string(k)+":"+string(d))
	}
	if want := []string{"i:ls -l\r", `r:{"cols":120,"rows":40}`, `s:{"signal":2}`, "c:"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("frames %q, want %q", got, want)
	}
	for cut := 1; cut < 11; cut++ { // inside the first frame
		if _, _, err := ReadInput(bytes.NewReader(whole[:cut]), nil); !errors.Is(err, ErrBroken) {
			t.Fatalf("cut at %d: %v", cut, err)
		}
	}
	if err := WriteInput(io.Discard, InputData, make([]byte, MaxInputFrame+1)); err == nil {
		t.Fatal("an oversized input frame was written")
	}
	var big bytes.Buffer
	_ = writeFrame(&big, InputData, make([]byte, MaxInputFrame+1))
	if _, _, err := ReadInput(&big, nil); err == nil || errors.Is(err, ErrBroken) {
		t.Fatalf("an oversized input frame: %v", err)
	}
	var odd bytes.Buffer
	_ = writeFrame(&odd, 'z', []byte("x"))
	if _, _, err := ReadInput(&odd, nil); err == nil {
		t.Fatal("a frame of an unknown kind was read")
	}
}

// TestRefusedUpload: an upload the handler refuses without reading it
// (the sandbox is not the caller's) reaches the caller as the handler's
// error, never as a broken stream, whatever the size of the upload and
// however often. A 503 "the stream broke" for another project's sandbox
// failed TestOwnership once in a clean-clone run.
func TestRefusedUpload(t *testing.T) {
	addr := serveUploads(t, func(ctx context.Context, g *Grant, op string, body []byte, in io.Reader, chunk func(string, []byte) error) (any, error) {
		return nil, &api.Error{Code: api.CodeNotFound, Message: "sandbox s not found"}
	})
	c := NewClient(testKey)
	for _, size := range []int{0, 1, 64 << 10, 1 << 20, 16 << 20} {
		for i := range 200 {
			if size >= 1<<20 && i >= 20 {
				break
			}
			err := c.Do(context.Background(), &Call{Addr: addr, Sandbox: "s", Op: "up", Body: []byte(`{}`),
				Upload: &failAfter{n: size, err: io.EOF}}, nil, nil)
			var ae *api.Error
			if !errors.As(err, &ae) || ae.Code != api.CodeNotFound {
				t.Fatalf("upload of %d bytes, call %d: %v, want the handler's not_found", size, i, err)
			}
		}
	}
}

// TestAnswerWhileUploadOpen: an operation that answers before its upload
// ends (a terminal whose program exited while its input stays open) gets
// its answer to the caller at once, not when the caller ends the upload.
func TestAnswerWhileUploadOpen(t *testing.T) {
	addr := serveUploads(t, func(ctx context.Context, g *Grant, op string, body []byte, in io.Reader, chunk func(string, []byte) error) (any, error) {
		buf := make([]byte, 4)
		if _, err := io.ReadFull(in, buf); err != nil {
			return nil, err
		}
		return map[string]string{"got": string(buf)}, nil
	})
	pr, pw := io.Pipe()
	defer pw.Close()
	go func() {
		// The caller's input stays open until the answer arrives.
		_, _ = pw.Write([]byte("exit"))
	}()
	done := make(chan error, 1)
	var out map[string]string
	go func() {
		done <- NewClient(testKey).Do(context.Background(), &Call{Addr: addr, Sandbox: "s", Op: "up", Body: []byte(`{}`), Upload: pr}, &out, nil)
	}()
	select {
	case err := <-done:
		if err != nil || out["got"] != "exit" {
			t.Fatalf("answer %v, %v", out, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no answer in 5 s while the upload stays open")
	}
}
