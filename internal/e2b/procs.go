package e2b

// The processes started through envd's process service (process.go).
//
// Lock order: procTable.mu before proc.mu (procTable.list); never the
// other way.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/api"
	eproc "github.com/warrenhq/warren/api/e2b/process"
	warren "github.com/warrenhq/warren/sdk/go"
)

const (
	// keepaliveEvery is how often an idle process stream carries a
	// keepalive event (the SDKs' proxies expect one at least every 50 s).
	keepaliveEvery = 30 * time.Second
	// firstPid is the first pid the front gives (low pids look like a
	// sandbox's own init and shells).
	firstPid = 1000
)

type procKey struct {
	sandbox string
	pid     uint32
}

// procTable holds the running processes by sandbox and pid.
type procTable struct {
	mu    sync.Mutex
	next  uint32
	procs map[procKey]*proc
}

// proc is one running process and the streams that follow it.
type proc struct {
	t   *procTable
	key procKey
	cfg *eproc.ProcessConfig
	tag string

	ctx    context.Context // the command's: cancelled by kill
	cancel context.CancelFunc

	// inMu orders a live command's input.
	inMu sync.Mutex

	mu sync.Mutex
	// term: the live command (stdin: true or a PTY), nil for the others;
	// set once, before the pid is handed out (liveTerm reads it).
	term   *warren.Terminal
	isPTY  bool
	subs   map[*procSub]struct{}
	ended  bool
	killed bool
}

// procItem is one event for a stream, or the error that ends it.
type procItem struct {
	ev  *eproc.ProcessEvent
	err error
}

// procSub is one stream following a process (Start or Connect).
type procSub struct {
	ch   chan procItem // closed after the last item
	done chan struct{} // closed when the stream goes away
}

func (t *procTable) add(sandbox string, cfg *eproc.ProcessConfig, tag string) *proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs == nil {
		t.procs = map[procKey]*proc{}
		t.next = firstPid
	}
	for {
		t.next++
		if t.next < firstPid {
			t.next = firstPid
		}
		if _, taken := t.procs[procKey{sandbox, t.next}]; !taken {
			break
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &proc{t: t, key: procKey{sandbox, t.next}, cfg: cfg, tag: tag, ctx: ctx, cancel: cancel, subs: map[*procSub]struct{}{}}
	t.procs[p.key] = p
	return p
}

// find is the running process of a sandbox with this pid, or this tag
// when pid is 0.
func (t *procTable) find(sandbox string, pid uint32, tag string) *proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	if pid != 0 {
		return t.procs[procKey{sandbox, pid}]
	}
	for k, p := range t.procs {
		if k.sandbox == sandbox && p.tag == tag {
			return p
		}
	}
	return nil
}

func (t *procTable) remove(p *proc) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.procs[p.key] == p {
		delete(t.procs, p.key)
	}
}

// list is a sandbox's running processes, by pid (killed ones are ending).
func (t *procTable) list(sandbox string) []*eproc.ProcessInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*eproc.ProcessInfo
	for k, p := range t.procs {
		p.mu.Lock()
		gone := p.killed || p.ended
		p.mu.Unlock()
		if k.sandbox != sandbox || gone {
			continue
		}
		info := &eproc.ProcessInfo{Config: p.cfg, Pid: k.pid}
		if p.tag != "" {
			tag := p.tag
			info.Tag = &tag
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return out
}

// run runs the command, hands its output to the streams as it arrives,
// then its end event, and forgets the process.
func (p *proc) run(ec *envdCaller, req api.ExecRequest) {
	defer p.t.remove(p)
	defer p.cancel()
	res, err := ec.cs.ExecStreamFunc(p.ctx, ec.id, req, func(ev api.ExecEvent) error {
		d := &eproc.ProcessEvent_DataEvent{}
		switch {
		case ev.Stdout != nil:
			d.Output = &eproc.ProcessEvent_DataEvent_Stdout{Stdout: []byte(*ev.Stdout)}
		case ev.Stderr != nil:
			d.Output = &eproc.ProcessEvent_DataEvent_Stderr{Stderr: []byte(*ev.Stderr)}
		default:
			return nil
		}
		p.publish(procItem{ev: &eproc.ProcessEvent{Event: &eproc.ProcessEvent_Data{Data: d}}})
		return nil
	})
	p.end(res, err)
}

// runLive waits for the end of a live command (its output reaches the
// streams through liveOut as it arrives), then ends the streams.
func (p *proc) runLive() {
	defer p.t.remove(p)
	defer p.cancel()
	t, _ := p.liveTerm()
	res, err := t.Wait(context.Background())
	p.end(res, err)
}

// end hands the command's end (or the error that ended it) to the streams.
func (p *proc) end(res *api.ExecResult, err error) {
	p.mu.Lock()
	killed := p.killed
	p.mu.Unlock()
	var last procItem
	switch {
	case killed:
		last.ev = &eproc.ProcessEvent{Event: &eproc.ProcessEvent_End{End: signalEnd("killed")}}
	case err != nil:
		last.err = rpcError(err)
	default:
		last.ev = &eproc.ProcessEvent{Event: &eproc.ProcessEvent_End{End: endOf(res)}}
	}
	p.finish(last)
}

// publish hands an item to every stream; a stream that went away is
// skipped. A slow stream holds the others back (and, through the data
// plane's flow control, the command's output).
func (p *proc) publish(it procItem) {
	p.mu.Lock()
	subs := make([]*procSub, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- it:
		case <-s.done:
		}
	}
}

// finish hands the last item to every stream and closes them.
func (p *proc) finish(last procItem) {
	p.mu.Lock()
	p.ended = true
	subs := p.subs
	p.subs = nil
	p.mu.Unlock()
	for s := range subs {
		select {
		case s.ch <- last:
		case <-s.done:
		}
		close(s.ch)
	}
}

// subscribe adds a stream; one that comes after the end gets not_found.
func (p *proc) subscribe() *procSub {
	s := &procSub{ch: make(chan procItem, 16), done: make(chan struct{})}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		s.ch <- procItem{err: connect.NewError(connect.CodeNotFound, errors.New("the process has ended"))}
		close(s.ch)
		return s
	}
	p.subs[s] = struct{}{}
	return s
}

func (p *proc) unsubscribe(s *procSub) {
	close(s.done)
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.subs, s)
}

// liveOut is one output stream of a live command: each write becomes a
// data event (pty, stdout or stderr).
type liveOut struct {
	p    *proc
	kind int
}

const (
	outStdout = iota
	outStderr
	outPTY
)

func (o liveOut) Write(b []byte) (int, error) {
	c := bytes.Clone(b)
	d := &eproc.ProcessEvent_DataEvent{}
	switch o.kind {
	case outPTY:
		d.Output = &eproc.ProcessEvent_DataEvent_Pty{Pty: c}
	case outStderr:
		d.Output = &eproc.ProcessEvent_DataEvent_Stderr{Stderr: c}
	default:
		d.Output = &eproc.ProcessEvent_DataEvent_Stdout{Stdout: c}
	}
	o.p.publish(procItem{ev: &eproc.ProcessEvent{Event: &eproc.ProcessEvent_Data{Data: d}}})
	return len(b), nil
}

// liveTerm is the live command, nil for a process without one.
func (p *proc) liveTerm() (*warren.Terminal, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.term, p.isPTY
}

// errEnded answers input to a process that has ended.
func errEnded() error {
	return connect.NewError(connect.CodeNotFound, errors.New("the process has ended"))
}

// input sends b to a live command's stdin (or terminal).
func (p *proc) input(ctx context.Context, b []byte) error {
	t, _ := p.liveTerm()
	if t == nil {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d was started without stdin: start it with stdin: true (or as a PTY) to send it input", p.key.pid))
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if _, err := t.Write(b); err != nil {
		return p.liveErr(t, err)
	}
	return nil
}

// closeInput ends a live command's stdin (a terminal gets its EOF
// character); a command without live stdin already has it closed.
func (p *proc) closeInput(ctx context.Context) error {
	t, _ := p.liveTerm()
	if t == nil {
		return nil
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if err := t.CloseInput(ctx); err != nil {
		return p.liveErr(t, err)
	}
	return nil
}

// resize changes a PTY's size.
func (p *proc) resize(ctx context.Context, cols, rows uint32) error {
	t, isPTY := p.liveTerm()
	if t == nil || !isPTY {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d is not a PTY: only a PTY has a size", p.key.pid))
	}
	sz := api.TermSize{Cols: int(cols), Rows: int(rows)}
	if !sz.Valid() {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("pty size %dx%d: cols and rows are 1..%d", cols, rows, api.MaxTermSize))
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if err := t.Resize(ctx, sz.Cols, sz.Rows); err != nil {
		return p.liveErr(t, err)
	}
	return nil
}

// signal sends sig to a live command; false when it is not live.
func (p *proc) signal(ctx context.Context, sig int) (bool, error) {
	t, _ := p.liveTerm()
	if t == nil {
		return false, nil
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if err := t.Signal(ctx, sig); err != nil {
		return true, p.liveErr(t, err)
	}
	return true, nil
}

// liveErr is the answer to input that could not reach the command.
func (p *proc) liveErr(t *warren.Terminal, err error) error {
	select {
	case <-t.Done():
		return errEnded()
	case <-p.ctx.Done():
		return errEnded()
	default:
	}
	return connect.NewError(connect.CodeUnavailable, err)
}

// kill ends the command (SIGKILL: the exec is cancelled, and warren kills
// a cancelled command); its streams end with "signal: killed".
func (p *proc) kill() {
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	p.cancel()
}

// follow sends the process's events to one stream, with keepalives while
// it is idle, until the end (nil) or the stream's context ends.
func (s *procSub) follow(ctx context.Context, send func(*eproc.ProcessEvent) error) error {
	tick := time.NewTicker(keepaliveEvery)
	defer tick.Stop()
	for {
		select {
		case it, ok := <-s.ch:
			if !ok {
				return nil
			}
			if it.err != nil {
				return it.err
			}
			if err := send(it.ev); err != nil {
				return err
			}
		case <-tick.C:
			if err := send(&eproc.ProcessEvent{Event: &eproc.ProcessEvent_Keepalive{Keepalive: &eproc.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the call outlived its deadline (Connect-Timeout-Ms)"))
			}
			return ctx.Err()
		}
	}
}
