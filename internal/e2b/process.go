package e2b

// envd's process service over warren's exec. Every process.Process/Start
// runs a native command whose NDJSON output stream (over the data plane)
// becomes E2B's data events as it arrives. The front keeps a table of the
// processes it started (procs.go: pid, tag, subscribers), so Connect,
// List and SendSignal reach them; the command runs on even when the
// client that started it goes away, until it ends, is killed, or its
// Connect-Timeout-Ms passes. A process started with stdin: true or a PTY
// is a live command instead (the native terminal, edge op exec_live, over
// an in-process WebSocket): SendInput/StreamInput are its input,
// CloseStdin its EOF, Update its size, SendSignal its signals.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/warrenhq/warren/api"
	eproc "github.com/warrenhq/warren/api/e2b/process"
	"github.com/warrenhq/warren/api/e2b/process/processconnect"
	warren "github.com/warrenhq/warren/sdk/go"
)

type procService struct {
	processconnect.UnimplementedProcessHandler
	s *Server
}

// basicUser is the user of an "Authorization: Basic base64(user:)" header.
func basicUser(h http.Header) string {
	v, ok := strings.CutPrefix(h.Get("Authorization"), "Basic ")
	if !ok {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
	if err != nil {
		return ""
	}
	u, _, _ := strings.Cut(string(b), ":")
	return u
}

func (p *procService) caller(h http.Header) (*envdCaller, error) {
	ec, err := p.s.envdCaller(h)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, err)
	}
	return ec, nil
}

func (p *procService) Start(ctx context.Context, req *connect.Request[eproc.StartRequest], stream *connect.ServerStream[eproc.StartResponse]) error {
	ec, err := p.caller(req.Header())
	if err != nil {
		return err
	}
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	ptySize := api.TermSize{Cols: api.DefaultTermCols, Rows: api.DefaultTermRows}
	if sz := req.Msg.GetPty().GetSize(); sz != nil {
		ptySize = api.TermSize{Cols: int(sz.GetCols()), Rows: int(sz.GetRows())}
		if !ptySize.Valid() {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("pty size %dx%d: cols and rows are 1..%d", sz.GetCols(), sz.GetRows(), api.MaxTermSize))
		}
	}
	facts, err := p.s.facts.get(ctx, ec)
	if err != nil {
		return rpcError(err)
	}
	user := basicUser(req.Header())
	er := api.ExecRequest{Argv: facts.argv(append([]string{cfg.GetCmd()}, cfg.GetArgs()...)), Env: cfg.GetEnvs(), User: user, Timeout: MaxTimeout}
	if cfg.Cwd != nil {
		er.Cwd = cfg.GetCwd()
	} else if user != "" {
		er.Cwd = homeOf(user)
	} else {
		er.Cwd = homeOf(facts.user)
	}
	// Connect-Timeout-Ms is the process's lifetime (envd kills it then);
	// without one it runs until it ends or is killed.
	if dl, ok := ctx.Deadline(); ok {
		er.Timeout = math.Max(1, math.Ceil(time.Until(dl).Seconds()))
	}
	pr := p.s.procs.add(ec.id, cfg, req.Msg.GetTag())
	sub := pr.subscribe()
	defer pr.unsubscribe(sub)
	if req.Msg.Pty != nil || req.Msg.GetStdin() {
		if err := pr.startLive(ec, er, req.Msg.Pty != nil, ptySize); err != nil {
			return err
		}
		go pr.runLive()
	} else {
		go pr.run(ec, er)
	}
	send := func(ev *eproc.ProcessEvent) error { return stream.Send(&eproc.StartResponse{Event: ev}) }
	if err := send(&eproc.ProcessEvent{Event: &eproc.ProcessEvent_Start{Start: &eproc.ProcessEvent_StartEvent{Pid: pr.key.pid}}}); err != nil {
		return err
	}
	err = sub.follow(ctx, send)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		pr.kill() // as envd: the deadline ends the process (a client that goes away does not)
	}
	return err
}

func (p *procService) Connect(ctx context.Context, req *connect.Request[eproc.ConnectRequest], stream *connect.ServerStream[eproc.ConnectResponse]) error {
	ec, err := p.caller(req.Header())
	if err != nil {
		return err
	}
	pr, err := p.find(ctx, ec, req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub := pr.subscribe()
	defer pr.unsubscribe(sub)
	send := func(ev *eproc.ProcessEvent) error { return stream.Send(&eproc.ConnectResponse{Event: ev}) }
	if err := send(&eproc.ProcessEvent{Event: &eproc.ProcessEvent_Start{Start: &eproc.ProcessEvent_StartEvent{Pid: pr.key.pid}}}); err != nil {
		return err
	}
	return sub.follow(ctx, send)
}

// find is the running process a selector names, after checking that the
// caller reaches the sandbox (another project's key finds nothing).
func (p *procService) find(ctx context.Context, ec *envdCaller, sel *eproc.ProcessSelector) (*proc, error) {
	if sel.GetPid() == 0 && sel.GetTag() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process.pid or process.tag is required"))
	}
	if _, err := ec.c.Get(ctx, ec.id); err != nil {
		return nil, rpcError(err)
	}
	if pr := p.s.procs.find(ec.id, sel.GetPid(), sel.GetTag()); pr != nil {
		return pr, nil
	}
	if sel.GetTag() != "" {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", sel.GetTag()))
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", sel.GetPid()))
}

// bashPath is the shell the SDKs run every command with (/bin/bash -l -c
// CMD); shPath stands in for it in a sandbox without bash (busybox).
const (
	bashPath = "/bin/bash"
	shPath   = "/bin/sh"
	// maxSandboxCache bounds the per-sandbox facts kept.
	maxSandboxCache = 10_000
)

// sandboxFacts is what Start needs of a sandbox besides the command.
type sandboxFacts struct {
	user    string // its default user (the cwd is that user's home)
	hasBash bool
}

// factCache remembers, per sandbox, its default user and whether its
// image has /bin/bash, looked up once per sandbox (through the caller's
// own native calls): a sandbox that installs bash later keeps running
// the SDK's commands under /bin/sh.
type factCache struct {
	mu    sync.Mutex
	facts map[string]sandboxFacts
}

// get answers the facts of the caller's sandbox; its errors are the
// native API's.
func (fc *factCache) get(ctx context.Context, ec *envdCaller) (sandboxFacts, error) {
	fc.mu.Lock()
	f, ok := fc.facts[ec.id]
	fc.mu.Unlock()
	if ok {
		return f, nil
	}
	sb, err := ec.c.Get(ctx, ec.id)
	if err != nil {
		return f, err
	}
	f.user = sb.User
	switch _, err := ec.c.Stat(ctx, ec.id, bashPath); {
	case err == nil:
		f.hasBash = true
	case !warren.IsNotFound(err):
		return f, err
	}
	fc.mu.Lock()
	if fc.facts == nil || len(fc.facts) >= maxSandboxCache {
		fc.facts = map[string]sandboxFacts{}
	}
	fc.facts[ec.id] = f
	fc.mu.Unlock()
	return f, nil
}

// argv is the command to run for E2B's argv: /bin/bash becomes /bin/sh in
// a sandbox that has no bash (busybox's sh takes -l and -c alike).
func (f sandboxFacts) argv(argv []string) []string {
	if argv[0] != bashPath || f.hasBash {
		return argv
	}
	return append([]string{shPath}, argv[1:]...)
}

// endOf is the end event of a finished command, worded as envd (Go's
// os/exec) words it.
func endOf(res *api.ExecResult) *eproc.ProcessEvent_EndEvent {
	if res.Signal != "" || res.TimedOut {
		word := map[string]string{"SIGKILL": "killed", "SIGTERM": "terminated", "SIGINT": "interrupt", "SIGHUP": "hangup"}[res.Signal]
		if word == "" {
			word = strings.ToLower(strings.TrimPrefix(res.Signal, "SIG"))
		}
		if word == "" {
			word = "killed"
		}
		return signalEnd(word)
	}
	st := fmt.Sprintf("exit status %d", res.ExitCode)
	end := &eproc.ProcessEvent_EndEvent{ExitCode: int32(res.ExitCode), Exited: true, Status: st}
	if res.ExitCode != 0 {
		end.Error = &st
	}
	return end
}

// signalEnd is the end event of a process a signal ended.
func signalEnd(word string) *eproc.ProcessEvent_EndEvent {
	st := "signal: " + word
	return &eproc.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: st, Error: &st}
}

func (p *procService) SendSignal(ctx context.Context, req *connect.Request[eproc.SendSignalRequest]) (*connect.Response[eproc.SendSignalResponse], error) {
	ec, err := p.caller(req.Header())
	if err != nil {
		return nil, err
	}
	switch req.Msg.GetSignal() {
	case eproc.Signal_SIGNAL_SIGKILL, eproc.Signal_SIGNAL_SIGTERM:
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v: SIGNAL_SIGKILL or SIGNAL_SIGTERM", req.Msg.GetSignal()))
	}
	pr, err := p.find(ctx, ec, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.GetSignal() == eproc.Signal_SIGNAL_SIGTERM {
		// A live command gets the signal itself (a shell may ignore it,
		// as under envd); the others are ended.
		if live, err := pr.signal(ctx, sigTERM); live {
			if err != nil {
				return nil, err
			}
			return connect.NewResponse(&eproc.SendSignalResponse{}), nil
		}
	}
	pr.kill()
	return connect.NewResponse(&eproc.SendSignalResponse{}), nil
}

// CloseStdin ends a live command's stdin (a PTY gets its EOF character);
// for any other process it succeeds at once, its stdin being closed
// already (/dev/null), as envd gives stdin:false.
func (p *procService) CloseStdin(ctx context.Context, req *connect.Request[eproc.CloseStdinRequest]) (*connect.Response[eproc.CloseStdinResponse], error) {
	ec, err := p.caller(req.Header())
	if err != nil {
		return nil, err
	}
	pr, err := p.find(ctx, ec, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := pr.closeInput(ctx); err != nil {
		return nil, err
	}
	return connect.NewResponse(&eproc.CloseStdinResponse{}), nil
}

// inputOf is the bytes of a ProcessInput (stdin or pty alike).
func inputOf(in *eproc.ProcessInput) []byte {
	if b := in.GetPty(); b != nil {
		return b
	}
	return in.GetStdin()
}

// SendInput sends input to a live command (started with stdin: true or a
// PTY).
func (p *procService) SendInput(ctx context.Context, req *connect.Request[eproc.SendInputRequest]) (*connect.Response[eproc.SendInputResponse], error) {
	ec, err := p.caller(req.Header())
	if err != nil {
		return nil, err
	}
	pr, err := p.find(ctx, ec, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := pr.input(ctx, inputOf(req.Msg.GetInput())); err != nil {
		return nil, err
	}
	return connect.NewResponse(&eproc.SendInputResponse{}), nil
}

// StreamInput is SendInput as a client stream: a start event naming the
// process, then data events (and keepalives).
func (p *procService) StreamInput(ctx context.Context, stream *connect.ClientStream[eproc.StreamInputRequest]) (*connect.Response[eproc.StreamInputResponse], error) {
	ec, err := p.caller(stream.RequestHeader())
	if err != nil {
		return nil, err
	}
	var pr *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *eproc.StreamInputRequest_Start:
			if pr, err = p.find(ctx, ec, ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *eproc.StreamInputRequest_Data:
			if pr == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("the first StreamInput event must be start (naming the process)"))
			}
			if err := pr.input(ctx, inputOf(ev.Data.GetInput())); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&eproc.StreamInputResponse{}), nil
}

// Update resizes a PTY.
func (p *procService) Update(ctx context.Context, req *connect.Request[eproc.UpdateRequest]) (*connect.Response[eproc.UpdateResponse], error) {
	ec, err := p.caller(req.Header())
	if err != nil {
		return nil, err
	}
	sz := req.Msg.GetPty().GetSize()
	if sz == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("pty.size is required (Update changes a PTY's size)"))
	}
	pr, err := p.find(ctx, ec, req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := pr.resize(ctx, sz.GetCols(), sz.GetRows()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&eproc.UpdateResponse{}), nil
}

// sigTERM is SIGTERM's number (the native terminal takes numbers).
const sigTERM = 15

// startLive opens the live command of a process started with stdin: true
// or a PTY: a native terminal (GET /v1/sandboxes/{id}/pty over an
// in-process connection), whose output becomes the process's data events.
// It lives as long as the process (p.ctx: kill ends it).
func (p *proc) startLive(ec *envdCaller, er api.ExecRequest, isPTY bool, size api.TermSize) error {
	opt := warren.TerminalOptions{Argv: er.Argv, User: er.User, Cwd: er.Cwd, Env: er.Env, Timeout: er.Timeout, NoTTY: !isPTY}
	if isPTY {
		opt.Cols, opt.Rows = size.Cols, size.Rows
		opt.Stdout = liveOut{p: p, kind: outPTY}
		opt.Stderr = opt.Stdout
	} else {
		opt.Stdout = liveOut{p: p, kind: outStdout}
		opt.Stderr = liveOut{p: p, kind: outStderr}
	}
	t, err := ec.live().Terminal(p.ctx, ec.id, opt)
	if err != nil {
		p.t.remove(p)
		p.cancel()
		return rpcError(err)
	}
	p.mu.Lock()
	p.term, p.isPTY = t, isPTY
	p.mu.Unlock()
	return nil
}

// List answers the running processes started through envd.
func (p *procService) List(ctx context.Context, req *connect.Request[eproc.ListRequest]) (*connect.Response[eproc.ListResponse], error) {
	ec, err := p.caller(req.Header())
	if err != nil {
		return nil, err
	}
	if _, err := ec.c.Get(ctx, ec.id); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&eproc.ListResponse{Processes: p.s.procs.list(ec.id)}), nil
}
