package agent

// Locks in this file: conn.wmu (frame writes), callTable.mu (the calls of
// a connection) and window.mu (a call's credit) are never held together.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"syscall"

	"github.com/warrenhq/warren/internal/agentproto"
)

// conn is one edge connection. Frame writes are serialised by wmu.
type conn struct {
	c    net.Conn
	ctx  context.Context // cancelled when the connection ends
	wmu  sync.Mutex
	werr error
	// inputs are the execs with live input (pty.go); calls the calls
	// being served.
	inputs inputs
	calls  *callTable
}

// send writes one frame; after the first write error every send fails fast.
func (c *conn) send(r *agentproto.Response) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return c.werr
	}
	if err := agentproto.WriteFrame(c.c, r); err != nil {
		c.werr = err
		c.c.Close()
		return err
	}
	return nil
}

// sendChunk writes one binary chunk frame, as send.
func (c *conn) sendChunk(id uint64, stream string, data []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return c.werr
	}
	if err := agentproto.WriteChunk(c.c, id, stream, data); err != nil {
		c.werr = err
		c.c.Close()
		return err
	}
	return nil
}

// call is one request being served.
type call struct {
	id   uint64
	conn *conn
	// ctx ends when the edge cancels the call (OpCancel) or the connection
	// ends: chunk then fails.
	ctx context.Context
	// withdrawn ends only when the edge cancels the call: a foreground
	// command is then killed. (One whose connection ends lives on: a new
	// edge, after an upgrade, connects again.)
	withdrawn context.Context
	// win, when set, bounds the chunk bytes sent ahead of the edge's
	// credit (agentproto.Window).
	win *window
	// binary sends the chunks as binary frames (the edge asked).
	binary bool
	// after runs once the answer is sent (an exec's ResetAfter).
	after func()
}

// chunk sends one chunk frame of stream; it fails once the call is
// cancelled, so that a read or tar stops at its next chunk.
func (r *call) chunk(stream string, data []byte) error {
	if err := r.ctx.Err(); err != nil {
		return err
	}
	if r.win != nil {
		if err := r.win.take(r.ctx, int64(len(data))+agentproto.FrameCost); err != nil {
			return err
		}
	}
	if r.binary {
		return r.conn.sendChunk(r.id, stream, data)
	}
	return r.conn.send(&agentproto.Response{ID: r.id, Kind: agentproto.KindChunk, Stream: stream, Data: data})
}

func (r *call) done(v any) {
	resp := &agentproto.Response{ID: r.id, Kind: agentproto.KindDone}
	if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			r.fail(errf(agentproto.ErrInternal, "encode answer: %v", err))
			return
		}
		if len(b) > agentproto.MaxFrame-256 {
			r.fail(errf(agentproto.ErrTooLarge, "answer of %d bytes exceeds one frame", len(b)))
			return
		}
		resp.Body = b
	}
	_ = r.conn.send(resp)
}

func (r *call) fail(err error) {
	var pe *agentproto.Error
	if !errors.As(err, &pe) {
		code := agentproto.ErrInternal
		if errors.Is(err, syscall.EAGAIN) {
			// Starting a process failed at the sandbox's pids limit.
			code = agentproto.ErrPidsLimit
		}
		pe = &agentproto.Error{Code: code, Message: err.Error()}
	}
	_ = r.conn.send(&agentproto.Response{ID: r.id, Kind: agentproto.KindError, Error: pe})
}

// errf builds a protocol error.
func errf(code, format string, args ...any) *agentproto.Error {
	return &agentproto.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func (a *Agent) serveConn(nc net.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := &callTable{calls: map[uint64]tableEntry{}}
	c := &conn{c: nc, ctx: ctx, calls: calls}
	br := bufio.NewReaderSize(nc, 64<<10)
	for {
		req := new(agentproto.Request)
		if err := agentproto.ReadRequestPooled(br, req); err != nil {
			break
		}
		switch req.Op {
		case agentproto.OpCancel:
			var cr agentproto.CancelRequest
			if decode(req, &cr) == nil {
				calls.cancel(cr.ID)
			}
			continue
		case agentproto.OpCredit:
			var cr agentproto.CreditRequest
			if decode(req, &cr) == nil {
				calls.credit(cr.ID, cr.Bytes)
			}
			continue
		}
		if req.Op == agentproto.OpSetup {
			// Served in line: later requests must see the agent set up.
			a.serve(ctx, &call{id: req.ID, conn: c, ctx: ctx, withdrawn: context.Background()}, req)
			continue
		}
		var win *window
		if req.Window > 0 {
			win = &window{avail: req.Window, more: make(chan struct{}, 1)}
		}
		cctx, withdrawn, done := calls.add(ctx, req.ID, win)
		go func() {
			defer done()
			a.serve(cctx, &call{id: req.ID, conn: c, ctx: cctx, withdrawn: withdrawn, win: win, binary: req.Binary}, req)
			if req.Op == agentproto.OpFileWrite {
				req.Release() // written: an upload's next write reuses its buffer
			}
		}()
	}
	nc.Close()
}

// callTable holds the calls being served on one connection, by id: their
// cancel functions and flow-control windows.
type callTable struct {
	mu    sync.Mutex
	calls map[uint64]tableEntry
}

type tableEntry struct {
	cancel context.CancelFunc
	win    *window
}

// add makes call id's contexts: ctx ends with parent (the connection) or a
// cancel, withdrawn with a cancel only; done forgets the call.
func (t *callTable) add(parent context.Context, id uint64, win *window) (ctx, withdrawn context.Context, done func()) {
	withdrawn, withdraw := context.WithCancel(context.Background())
	ctx, cancel := context.WithCancel(parent)
	stop := context.AfterFunc(withdrawn, cancel)
	t.mu.Lock()
	t.calls[id] = tableEntry{cancel: withdraw, win: win}
	t.mu.Unlock()
	return ctx, withdrawn, func() {
		t.mu.Lock()
		delete(t.calls, id)
		t.mu.Unlock()
		stop()
		cancel()
		withdraw()
	}
}

// has says whether call id is being served.
func (t *callTable) has(id uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.calls[id]
	return ok
}

func (t *callTable) cancel(id uint64) {
	t.mu.Lock()
	e := t.calls[id]
	t.mu.Unlock()
	if e.cancel != nil {
		e.cancel()
	}
}

func (t *callTable) credit(id uint64, n int64) {
	t.mu.Lock()
	e := t.calls[id]
	t.mu.Unlock()
	if e.win != nil {
		e.win.give(n)
	}
}

// window is a call's credit: the chunk bytes it may still send.
type window struct {
	mu    sync.Mutex
	avail int64
	more  chan struct{} // signalled when credit arrives
}

// take waits for credit and spends n of it (a chunk may overdraw: any
// credit left lets one through).
func (w *window) take(ctx context.Context, n int64) error {
	for {
		w.mu.Lock()
		if w.avail > 0 {
			w.avail -= n
			w.mu.Unlock()
			return nil
		}
		w.mu.Unlock()
		select {
		case <-w.more:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (w *window) give(n int64) {
	w.mu.Lock()
	w.avail += n
	w.mu.Unlock()
	select {
	case w.more <- struct{}{}:
	default:
	}
}

// decode unmarshals a request body.
func decode(req *agentproto.Request, v any) error {
	if len(req.Body) == 0 {
		return nil
	}
	if err := json.Unmarshal(req.Body, v); err != nil {
		return errf(agentproto.ErrInvalid, "%s: bad body: %v", req.Op, err)
	}
	return nil
}

func (a *Agent) serve(ctx context.Context, cl *call, req *agentproto.Request) {
	v, err := a.dispatch(ctx, cl, req)
	if err != nil {
		cl.fail(err)
	} else {
		cl.done(v)
	}
	if cl.after != nil {
		cl.after()
	}
}

// dispatch runs one request as its op's registration (ops.go) says.
func (a *Agent) dispatch(ctx context.Context, cl *call, req *agentproto.Request) (any, error) {
	op, known := agentOps[req.Op]
	if known && op.phase == phaseAny {
		return op.run(a, ctx, cl, req)
	}
	if !a.isSetup() {
		return nil, errf(agentproto.ErrInvalid, "%s: agent is not set up", req.Op)
	}
	if known && op.phase == phaseSetUp {
		return op.run(a, ctx, cl, req)
	}
	if err := a.enterRequest(req.Op); err != nil {
		return nil, err
	}
	defer a.leaveRequest()
	if err := a.waitReset(ctx); err != nil {
		return nil, err
	}
	if !known {
		return nil, errf(agentproto.ErrInvalid, "unknown op %q", req.Op)
	}
	return op.run(a, ctx, cl, req)
}
