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
	"sync/atomic"
	"time"

	"github.com/warrenhq/warren/api"
)

// ErrUnreachable means the edge's data listener could not be reached at
// all (nothing listens there: its process is gone). Nothing was sent.
var ErrUnreachable = errors.New("dataplane: edge unreachable")

// DialTimeout bounds connecting to an edge: a call to a node that is gone
// fails within it.
var DialTimeout = 2 * time.Second

// Client makes calls to edges' data listeners (one HTTP/2 connection per
// edge, shared by its calls).
type Client struct {
	key []byte
	hc  *http.Client
}

// NewClient makes a client that signs its grants with key.
func NewClient(key []byte) *Client {
	d := &net.Dialer{Timeout: DialTimeout, KeepAlive: 15 * time.Second}
	tr := &http.Transport{
		DialContext: d.DialContext,
		Protocols:   clientProtocols(),
		// One connection per call in flight: keep enough of them.
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     2 * time.Minute,
		HTTP2:               h2config(),
		// The frames are already compact; never gzip.
		DisableCompression: true,
	}
	return &Client{key: key, hc: &http.Client{Transport: tr}}
}

// Call is one operation on one sandbox.
type Call struct {
	Addr    string // the edge's data listener (host:port)
	Sandbox string
	Op      string
	Scope   string
	Scoped  bool
	Body    []byte // the JSON request
	// Upload, when set, is streamed after the request (with the flow
	// control of the stream); an error reading it resets the stream, and
	// the edge sees the upload broken, never complete.
	Upload io.Reader
}

// Do runs c: chunks go to onChunk in order (its error ends the call and
// cancels it on the edge), the result is decoded into out. An error the
// edge answered comes back as *api.Error; a stream that ends before its
// result is ErrBroken; an edge that cannot be reached is ErrUnreachable.
// Cancelling ctx resets the stream, which cancels the work on the edge and
// in the agent.
func (cl *Client) Do(ctx context.Context, c *Call, out any, onChunk func(stream string, data []byte) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // an unfinished stream is reset
	body, up := callBody(c)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.Addr+callPrefix+c.Op, body)
	if err != nil {
		return fmt.Errorf("dataplane: %w", err)
	}
	g := &Grant{Sandbox: c.Sandbox, Op: c.Op, Scope: c.Scope, Scoped: c.Scoped, Expires: time.Now().Add(GrantTTL).Unix()}
	req.Header.Set(hdrGrant, Sign(cl.key, g))
	if d, ok := ctx.Deadline(); ok {
		req.Header.Set(hdrDeadline, d.UTC().Format(time.RFC3339Nano))
	}
	resp, err := cl.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var op *net.OpError
		if errors.As(err, &op) && op.Op == "dial" {
			return fmt.Errorf("%w: %w", ErrUnreachable, err)
		}
		// Sent, and the connection ended before the answer's head (the
		// edge holds it back until the first frame).
		return fmt.Errorf("%w: %s: %w", ErrBroken, c.Op, err)
	}
	defer resp.Body.Close()
	// drain reads the answer's end, so that the connection goes back to
	// the pool; not while the upload is still being sent (the edge
	// answered before it read it all): then the connection ends.
	drain := func() {
		if up == nil || up.ended.Load() {
			_, _ = io.Copy(io.Discard, resp.Body)
		}
	}
	if resp.StatusCode != http.StatusOK {
		var eb api.ErrorBody
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
			return &eb.Error
		}
		return fmt.Errorf("dataplane: %s: status %d", c.Op, resp.StatusCode)
	}
	return readAnswer(ctx, resp.Body, c.Op, drain, out, onChunk)
}

// callBody is c's request body: the request as one buffer (its length,
// then it), then c's upload, if any (up, which tells when it was sent
// whole).
func callBody(c *Call) (body io.Reader, up *uploadBody) {
	// A plain bytes.Reader, which the transport sends without a copy
	// buffer of its own (an io.MultiReader's WriteTo took 32 KiB per call:
	// 42 % of the bytes allocated in a loop of exec calls).
	framed := make([]byte, 4+len(c.Body))
	binary.BigEndian.PutUint32(framed, uint32(len(c.Body)))
	copy(framed[4:], c.Body)
	body = bytes.NewReader(framed)
	if c.Upload != nil {
		up = &uploadBody{r: io.MultiReader(body, c.Upload)}
		body = up
	}
	return body, up
}

// readAnswer reads the frames of op's answer from r until its end: the
// chunks go to onChunk (its error ends the call), the result is decoded
// into out, an error answered comes back as *api.Error. drain runs at the
// answer's end, before it is decoded.
func readAnswer(ctx context.Context, r io.Reader, op string, drain func(), out any, onChunk func(stream string, data []byte) error) error {
	var buf []byte
	for {
		kind, b, err := readFrame(r, buf)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		buf = b
		switch kind {
		case kindDone:
			drain()
			if out != nil && len(b) > 0 {
				if err := json.Unmarshal(b, out); err != nil {
					return fmt.Errorf("dataplane: decode %s answer: %w", op, err)
				}
			}
			return nil
		case kindError:
			drain()
			e := new(api.Error)
			if err := json.Unmarshal(b, e); err != nil || e.Code == "" {
				return &api.Error{Code: api.CodeInternal, Message: "malformed error answer"}
			}
			return e
		case kindStdout, kindStderr, kindData, kindEOF:
			if onChunk != nil {
				if err := onChunk(kindStream(kind), b); err != nil {
					return err
				}
			}
		default:
			return fmt.Errorf("dataplane: frame of unknown kind %q", kind)
		}
	}
}

// uploadChunk is the most one write of an upload carries to the edge.
const uploadChunk = 256 << 10

var uploadBufs = sync.Pool{New: func() any { b := make([]byte, uploadChunk); return &b }}

// uploadBody is an upload as a request body. The transport copies a body
// through its WriteTo: each read (up to 256 KiB, what the caller has sent
// so far) goes on as one write, one HTTP/1.1 chunk, instead of io.Copy's
// 32 KiB pieces. A read is passed on as it is, never held back to fill a
// buffer, so live input is not delayed.
type uploadBody struct {
	r     io.Reader
	ended atomic.Bool // the whole upload was written
}

func (u *uploadBody) Read(p []byte) (int, error) {
	n, err := u.r.Read(p)
	if err == io.EOF {
		u.ended.Store(true)
	}
	return n, err
}

func (u *uploadBody) WriteTo(w io.Writer) (int64, error) {
	bp := uploadBufs.Get().(*[]byte)
	defer uploadBufs.Put(bp)
	var total int64
	for {
		n, err := u.r.Read(*bp)
		if n > 0 {
			k, werr := w.Write((*bp)[:n])
			total += int64(k)
			if werr != nil {
				return total, werr
			}
		}
		if err == io.EOF {
			u.ended.Store(true)
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
