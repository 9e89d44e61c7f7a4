package agent

// Commands with live input: a command on a pseudo-terminal (ExecRequest.PTY)
// or with its stdin left open (LiveStdin). They run like any foreground
// exec (the plan's user, cwd, environment, timeout and output cap; in the
// sandbox's namespaces and work cgroup through the spawner; killed when
// their call is withdrawn), and take their input from OpInput calls on the
// same connection, addressed by the exec call's id.
//
// Locks: inputs.mu is held alone; liveInput.mu is held alone (never while
// taking inputs.mu).

import (
	"context"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
)

// inputWait bounds how long an OpInput waits for its exec to start (the
// two calls are served by goroutines of their own: the input may come
// first).
const inputWait = 10 * time.Second

// liveInput is where a running exec's input goes.
type liveInput struct {
	mu      sync.Mutex // serialises writes, resizes and the close
	r       *running
	w       *os.File // the terminal's master, or the stdin pipe's write end
	pty     bool
	closed  bool
	started chan struct{} // closed once r and w are set, or the start failed
	failed  bool
}

// inputs are a connection's execs with live input, by call id.
type inputs struct {
	mu sync.Mutex
	m  map[uint64]*liveInput
}

func (t *inputs) add(id uint64) *liveInput {
	li := &liveInput{started: make(chan struct{})}
	t.mu.Lock()
	if t.m == nil {
		t.m = map[uint64]*liveInput{}
	}
	t.m[id] = li
	t.mu.Unlock()
	return li
}

func (t *inputs) drop(id uint64) {
	t.mu.Lock()
	delete(t.m, id)
	t.mu.Unlock()
}

// find waits (up to inputWait, while ctx lasts) for call id's live input to
// be registered and started. A call that is not being served (running
// says) has none: the connection's reader adds a call to its table before
// it reads the next request, so an input never overtakes its exec there.
func (t *inputs) find(ctx context.Context, id uint64, running func(uint64) bool) (*liveInput, error) {
	deadline := time.Now().Add(inputWait)
	for {
		t.mu.Lock()
		li := t.m[id]
		t.mu.Unlock()
		if li != nil {
			select {
			case <-li.started:
				if li.failed {
					return nil, errf(agentproto.ErrNotFound, "input: call %d did not start", id)
				}
				return li, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if time.Now().After(deadline) || !running(id) {
			return nil, errf(agentproto.ErrNotFound, "input: no running command with live input for call %d", id)
		}
		select {
		case <-time.After(2 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// input serves OpInput.
func (a *Agent) input(ctx context.Context, c *conn, req *agentproto.InputRequest) error {
	if req.Resize != nil && !validSize(req.Resize) {
		return errf(agentproto.ErrInvalid, "input: a terminal's size is 1..%d columns and rows", maxTermSize)
	}
	if req.Signal < 0 || req.Signal > 64 {
		return errf(agentproto.ErrInvalid, "input: signal must be between 1 and 64")
	}
	li, err := c.inputs.find(ctx, req.Call, c.calls.has)
	if err != nil {
		return err
	}
	li.mu.Lock()
	defer li.mu.Unlock()
	if li.closed && (len(req.Data) > 0 || req.EOF) {
		return errf(agentproto.ErrInvalid, "input: stdin is closed")
	}
	if len(req.Data) > 0 {
		if _, err := li.w.Write(req.Data); err != nil {
			return errf(agentproto.ErrNotFound, "input: the command ended: %v", err)
		}
	}
	if req.Resize != nil {
		if !li.pty {
			return errf(agentproto.ErrInvalid, "input: resize needs a terminal")
		}
		if err := pty.Setsize(li.w, &pty.Winsize{Cols: req.Resize.Cols, Rows: req.Resize.Rows}); err != nil {
			return errf(agentproto.ErrNotFound, "input: resize: %v", err)
		}
	}
	if req.Signal > 0 {
		li.r.kill(unix.Signal(req.Signal))
	}
	if req.EOF {
		if li.pty {
			// A terminal's end of input is its EOF character (^D).
			if _, err := li.w.Write([]byte{4}); err != nil {
				return errf(agentproto.ErrNotFound, "input: the command ended: %v", err)
			}
		} else {
			li.closed = true
			li.w.Close()
		}
	}
	return nil
}

// maxTermSize bounds a terminal's columns and rows.
const maxTermSize = 4096

func validSize(s *agentproto.WinSize) bool {
	return s.Cols >= 1 && s.Rows >= 1 && s.Cols <= maxTermSize && s.Rows <= maxTermSize
}

// execLive runs a foreground command with live input (p.req.PTY or
// LiveStdin) and answers its result once it ended.
func (a *Agent) execLive(cl *call, p *execPlan) (any, error) {
	req := p.req
	if req.Background || req.Trusted || req.Collect || req.ResetAfter {
		return nil, errf(agentproto.ErrInvalid, "exec: live input is for plain foreground commands")
	}
	if req.PTY != nil && !validSize(req.PTY) {
		return nil, errf(agentproto.ErrInvalid, "exec: a terminal's size is 1..%d columns and rows", maxTermSize)
	}
	li := cl.conn.inputs.add(cl.id)
	defer cl.conn.inputs.drop(cl.id)
	emit := func(stream string, b []byte) { _ = cl.chunk(stream, b) }
	var (
		r   *running
		err error
	)
	if req.PTY != nil {
		r, li.w, err = a.startPTY(p, emit)
		li.pty = true
	} else {
		r, err = a.startArgvLive(p, emit)
		if r != nil {
			li.w = r.stdin
		}
	}
	if err != nil {
		li.failed = true
		close(li.started)
		return nil, err
	}
	li.r = r
	// The request's stdin goes first, before any input call, without
	// holding up the answer: a program that does not read it must not
	// keep the call from being withdrawn.
	li.mu.Lock()
	close(li.started)
	go func(data []byte) {
		defer li.mu.Unlock()
		if len(data) > 0 {
			_, _ = li.w.Write(data)
		}
	}(req.Stdin)
	// A caller that goes away (OpCancel) takes the command with it.
	stop := context.AfterFunc(cl.withdrawn, r.abort)
	defer stop()
	res := a.finish(p, r)
	if li.pty {
		// Hang up: what the command left on the terminal gets SIGHUP, and
		// the output reader ends. (Not under li.mu: a write blocked on a
		// terminal nobody reads ends with the close.) finish closed a
		// stdin pipe already.
		li.w.Close()
	}
	li.mu.Lock()
	li.closed = true
	li.mu.Unlock()
	return res, nil
}

// startPTY starts p on a new pseudo-terminal: the command leads a new
// session whose controlling terminal it is. It returns the master, which
// the output stream reads.
func (a *Agent) startPTY(p *execPlan, emit func(string, []byte)) (*running, *os.File, error) {
	argv := p.req.Argv
	if p.req.Cmd != "" {
		argv = []string{a.shell, "-c", p.req.Cmd}
	}
	bin, err := lookPath(argv[0], p.env["PATH"])
	if err != nil {
		return nil, nil, err
	}
	master, slave, err := pty.Open()
	if err != nil {
		return nil, nil, fsErr("exec", "/dev/ptmx", err)
	}
	defer slave.Close()
	if err := pty.Setsize(master, &pty.Winsize{Cols: p.req.PTY.Cols, Rows: p.req.PTY.Rows}); err != nil {
		master.Close()
		return nil, nil, fsErr("exec", "/dev/ptmx", err)
	}
	if p.cred != nil {
		// The terminal is its user's, as login makes it.
		_ = slave.Chown(int(p.cred.uid), -1)
	}
	env := p.env
	if _, ok := env["TERM"]; !ok {
		env = make(map[string]string, len(p.env)+1)
		for k, v := range p.env {
			env[k] = v
		}
		env["TERM"] = "xterm-256color"
	}
	sys := &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if p.cred != nil {
		sys.Credential = &syscall.Credential{Uid: p.cred.uid, Gid: p.cred.gid, Groups: p.cred.groups}
	}
	sfd := slave.Fd()
	attr := &syscall.ProcAttr{Dir: p.cwd, Env: envList(env), Files: []uintptr{sfd, sfd, sfd}, Sys: sys}
	pid, exit, err := a.spawnFork(func() (int, error) { return syscall.ForkExec(bin, argv, attr) })
	if err != nil {
		master.Close()
		return nil, nil, fsErr("exec", bin, err)
	}
	r := &running{pid: pid, exit: exit, start: time.Now(), session: true}
	r.armTimeout(p.req.Timeout)
	// The output stream reads (and at its end closes) a duplicate, so that
	// the input side can close its master (the hangup) on its own.
	out, err := dupFile(master, "pty")
	if err != nil {
		r.abort()
		master.Close()
		return nil, nil, fsErr("exec", "/dev/ptmx", err)
	}
	r.outs = []*outStream{newOutStream(agentproto.StreamStdout, out, p.limit, emit, false)}
	return r, master, nil
}

// dupFile duplicates f's descriptor (close-on-exec, non-blocking, polled).
func dupFile(f *os.File, name string) (*os.File, error) {
	sc, err := f.SyscallConn()
	if err != nil {
		return nil, err
	}
	var nfd int
	var derr error
	if err := sc.Control(func(fd uintptr) { nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	return pollFile(nfd, name), nil
}

// startArgvLive starts p (argv, or cmd through the shell) with pipes, its
// stdin left open for OpInput (execLive writes the request's Stdin).
func (a *Agent) startArgvLive(p *execPlan, emit func(string, []byte)) (*running, error) {
	q := *p
	rq := *p.req
	if rq.Cmd != "" {
		rq.Argv, rq.Cmd = []string{a.shell, "-c", rq.Cmd}, ""
	}
	rq.Stdin = nil
	q.req = &rq
	return a.startArgvOpen(&q, p.limit, emit)
}

// killSession kills every process of session sid (the terminal's): a
// shell's jobs live in process groups of their own.
func killSession(sid int) {
	_ = unix.Kill(-sid, unix.SIGKILL)
	// state ppid pgrp session ...
	killMatching(func(f []string) bool {
		if len(f) < 4 {
			return false
		}
		s, _ := strconv.Atoi(f[3])
		return s == sid
	})
}
