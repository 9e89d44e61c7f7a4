package agentproto

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
)

// ErrClosed is returned for calls on (or pending on) a closed connection.
var ErrClosed = errors.New("agentproto: channel closed")

// Client is the edge's side of one agent connection. It is safe for
// concurrent use; answers are matched to calls by id.
type Client struct {
	conn net.Conn

	wmu sync.Mutex // serialises frame writes

	proto atomic.Int32 // the agent's protocol version (Proto)

	mu      sync.Mutex
	next    uint64
	pending map[uint64]*call
	closed  bool
	err     error
	done    chan struct{}
}

// NewClient starts reading answers from conn.
func NewClient(conn net.Conn) *Client {
	c := &Client{conn: conn, pending: make(map[uint64]*call), done: make(chan struct{})}
	go c.readLoop()
	return c
}

// Done is closed when the connection is gone (the agent died or closed it).
func (c *Client) Done() <-chan struct{} { return c.done }

// Err tells why the connection ended.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection; pending calls fail with ErrClosed.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}

func (c *Client) readLoop() {
	var err error
	for {
		r := new(Response)
		if err = readResponsePooled(c.conn, r); err != nil {
			break
		}
		c.mu.Lock()
		cl := c.pending[r.ID]
		if r.Kind != KindChunk {
			delete(c.pending, r.ID)
		}
		c.mu.Unlock()
		if cl != nil {
			cl.put(r)
		}
	}
	c.mu.Lock()
	c.closed = true
	c.err = fmt.Errorf("%w: %v", ErrClosed, err)
	for id, cl := range c.pending {
		cl.end()
		delete(c.pending, id)
	}
	c.mu.Unlock()
	close(c.done)
}

// Call sends op with body and waits for its answer. Each chunk frame is
// passed to onChunk (which may be nil) in order. The "done" body is decoded
// into out when out is non-nil. An agent error comes back as *Error.
// Cancelling ctx abandons the wait and tells the agent to cancel the work
// (OpCancel).
func (c *Client) Call(ctx context.Context, op string, body any, out any, onChunk func(*Response) error) error {
	return c.CallPayload(ctx, op, body, nil, out, onChunk)
}

// Proto is the agent's protocol version, as its answer to OpSetup or
// OpPing said (0 until then, or for an agent that does not say).
func (c *Client) Proto() int { return int(c.proto.Load()) }

// CallPayload is Call with bulk data sent raw after the request (see
// Request.Payload). Only for an agent whose Proto is ProtoPayload or later.
func (c *Client) CallPayload(ctx context.Context, op string, body any, payload []byte, out any, onChunk func(*Response) error) error {
	return c.call(ctx, op, body, payload, out, onChunk, nil, false)
}

// CallBulk is Call for a consumer that keeps no chunk's Data after
// onChunk returns (it copies what it needs): the buffers of the chunks are
// reused, so a long read makes no garbage.
func (c *Client) CallBulk(ctx context.Context, op string, body any, out any, onChunk func(*Response) error) error {
	return c.call(ctx, op, body, nil, out, onChunk, nil, true)
}

// CallLive is Call for an exec with live input: started learns the call's
// id once its request is sent (before any chunk), for the OpInput calls
// that feed it.
func (c *Client) CallLive(ctx context.Context, op string, body any, out any, onChunk func(*Response) error, started func(id uint64)) error {
	return c.call(ctx, op, body, nil, out, onChunk, started, false)
}

// call sends op and waits for its answer (see Call): bulk reuses the
// chunks' buffers (CallBulk), started learns the id once the request is
// sent (CallLive).
func (c *Client) call(ctx context.Context, op string, body any, payload []byte, out any, onChunk func(*Response) error, started func(uint64), bulk bool) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("agentproto: encode %s: %w", op, err)
	}
	// A call that takes chunks is flow-controlled: the agent sends at most
	// Window bytes ahead, so its frames always fit the channel and the
	// read loop never waits for this call's consumer.
	var window int64
	size := 64
	if onChunk != nil {
		window, size = Window, Window/FrameCost+16
	}
	cl := newCall(size)
	defer close(cl.quit)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	c.next++
	id := c.next
	c.pending[id] = cl
	c.mu.Unlock()

	c.wmu.Lock()
	err = WriteRequestFrame(c.conn, &Request{ID: id, Op: op, Body: raw, Window: window, Binary: onChunk != nil, Payload: payload})
	c.wmu.Unlock()
	if err != nil {
		c.forget(id)
		return fmt.Errorf("agentproto: send %s: %w", op, err)
	}
	if started != nil {
		started(id)
	}
	return c.await(ctx, cl, id, op, out, onChunk, window, bulk)
}

// await takes the answer of call id (op, mailbox cl): each chunk goes to
// onChunk (until it fails) and, with a window, its credit back to the
// agent; the done body is decoded into out. Cancelling ctx forgets the
// call and tells the agent to cancel it.
func (c *Client) await(ctx context.Context, cl *call, id uint64, op string, out any, onChunk func(*Response) error, window int64, bulk bool) error {
	var chunkErr error
	var owed int64 // credit taken by the consumer, not yet returned
	for {
		// ctx first, also while answers keep coming.
		if ctx.Err() != nil {
			c.forget(id)
			c.cancel(id)
			return ctx.Err()
		}
		r, ended := cl.take()
		if r == nil {
			if ended {
				return c.Err()
			}
			select {
			case <-ctx.Done():
			case <-cl.ready:
			}
			continue
		}
		switch r.Kind {
		case KindChunk:
			if onChunk != nil && chunkErr == nil {
				chunkErr = onChunk(r)
			}
			if bulk && r.pooled != nil {
				chunkBufs.Put(r.pooled)
			}
			if window > 0 {
				if owed += int64(len(r.Data)) + FrameCost; owed >= window/4 {
					c.control(OpCredit, &CreditRequest{ID: id, Bytes: owed})
					owed = 0
				}
			}
		case KindError:
			if r.Error == nil {
				return &Error{Code: ErrInternal, Message: "error without detail"}
			}
			return r.Error
		default:
			if chunkErr != nil {
				return chunkErr
			}
			return c.answer(op, r, out)
		}
	}
}

// answer takes op's final answer r: its body is decoded into out (when out
// is non-nil), and an answer to OpSetup or OpPing tells the agent's
// protocol version.
func (c *Client) answer(op string, r *Response, out any) error {
	if out != nil && len(r.Body) > 0 {
		if err := json.Unmarshal(r.Body, out); err != nil {
			return fmt.Errorf("agentproto: decode %s answer: %w", op, err)
		}
	}
	if op == OpSetup || op == OpPing {
		var v PingResult
		if json.Unmarshal(r.Body, &v) == nil {
			c.proto.Store(int32(v.Proto))
		}
	}
	return nil
}

// cancel asks the agent to cancel call id (best effort: a closed channel
// has cancelled it already).
func (c *Client) cancel(id uint64) { c.control(OpCancel, &CancelRequest{ID: id}) }

// control sends a frame about a call (OpCancel, OpCredit): id 0, answered
// by nothing (an agent that does not know op answers an error to id 0,
// which no call waits for).
func (c *Client) control(op string, body any) {
	raw, _ := json.Marshal(body)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = WriteFrame(c.conn, &Request{ID: 0, Op: op, Body: raw})
}

func (c *Client) forget(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// call is one call's mailbox. The read loop appends the call's responses
// in order and waits only while limit of them are queued (the call's
// window's worth of frames: for a call that follows its window, never),
// until the caller takes one or gives up. The queue grows only as far as
// the agent sends: a channel of the limit's capacity cost 8 KiB per call
// (most answer with one frame), a third of the bytes an exec allocated.
type call struct {
	mu    sync.Mutex
	q     []*Response
	head  int  // q[head:] are queued
	ended bool // the connection ended: nothing more comes
	limit int

	ready chan struct{} // a response was queued, or the connection ended (capacity 1)
	space chan struct{} // the caller took a response (capacity 1)
	quit  chan struct{} // closed when the caller returns
}

func newCall(limit int) *call {
	return &call{limit: limit, ready: make(chan struct{}, 1), space: make(chan struct{}, 1), quit: make(chan struct{})}
}

// notify leaves a token in a channel of capacity 1, if it has none.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// put queues r (the read loop); r goes nowhere when the caller gave up
// meanwhile.
func (cl *call) put(r *Response) {
	cl.mu.Lock()
	for len(cl.q)-cl.head >= cl.limit {
		cl.mu.Unlock()
		select {
		case <-cl.space:
		case <-cl.quit:
			return
		}
		cl.mu.Lock()
	}
	cl.q = append(cl.q, r)
	cl.mu.Unlock()
	notify(cl.ready)
}

// end marks the connection ended (the read loop's last word).
func (cl *call) end() {
	cl.mu.Lock()
	cl.ended = true
	cl.mu.Unlock()
	notify(cl.ready)
}

// take returns the next queued response; nil when none is, with ended
// true once none ever will be.
func (cl *call) take() (r *Response, ended bool) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.head == len(cl.q) {
		return nil, cl.ended
	}
	r = cl.q[cl.head]
	cl.q[cl.head] = nil
	if cl.head++; cl.head == len(cl.q) {
		cl.q, cl.head = cl.q[:0], 0
	}
	notify(cl.space)
	return r, false
}
