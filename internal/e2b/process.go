package e2b

// envd's process service over warren's background commands. Every
// process.Process/Start runs a native background command; its pid is a
// hash of the command id, found again through the sandbox's command
// history, so the front stays stateless. Output is delivered when the
// command ends (warren's background commands keep it until then), not
// live; PTY, stdin input and tags are not served yet.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"hash/fnv"
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

// waitSlice bounds one wait for a command; a keepalive goes out between
// waits (the SDK's proxies expect one at least every 50 s).
const waitSlice = 20 * time.Second

type procService struct {
	processconnect.UnimplementedProcessHandler
	s *Server
}

// pidOf is the E2B pid of a warren command id: stable, positive, non-zero.
func pidOf(cid string) uint32 {
	h := fnv.New32a()
	_, _ = h.Write([]byte(cid))
	return h.Sum32()&0x7fffffff | 1
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
	if req.Msg.Pty != nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("warren does not serve PTY processes through envd yet"))
	}
	if req.Msg.Tag != nil {
		return connect.NewError(connect.CodeUnimplemented, errors.New("tagged processes are not served yet"))
	}
	user := basicUser(req.Header())
	argv, err := p.s.shells.argv(ctx, ec, append([]string{cfg.GetCmd()}, cfg.GetArgs()...))
	if err != nil {
		return err
	}
	er := api.ExecRequest{Argv: argv, Env: cfg.GetEnvs(), User: user, Background: true}
	if cfg.Cwd != nil {
		er.Cwd = cfg.GetCwd()
	} else {
		if user == "" {
			sb, err := ec.c.Get(ctx, ec.id)
			if err != nil {
				return rpcError(err)
			}
			user = sb.User
		}
		er.Cwd = homeOf(user)
	}
	if dl, ok := ctx.Deadline(); ok {
		er.Timeout = math.Max(1, math.Ceil(time.Until(dl).Seconds()))
	}
	res, err := ec.c.Exec(ctx, ec.id, er)
	if err != nil {
		return rpcError(err)
	}
	send := func(ev *eproc.ProcessEvent) error { return stream.Send(&eproc.StartResponse{Event: ev}) }
	if err := send(&eproc.ProcessEvent{Event: &eproc.ProcessEvent_Start{Start: &eproc.ProcessEvent_StartEvent{Pid: pidOf(res.CommandID)}}}); err != nil {
		return err
	}
	return follow(ctx, ec, res.CommandID, send)
}

func (p *procService) Connect(ctx context.Context, req *connect.Request[eproc.ConnectRequest], stream *connect.ServerStream[eproc.ConnectResponse]) error {
	ec, err := p.caller(req.Header())
	if err != nil {
		return err
	}
	pid := req.Msg.GetProcess().GetPid()
	cid, err := cidOf(ctx, ec, pid)
	if err != nil {
		return err
	}
	send := func(ev *eproc.ProcessEvent) error { return stream.Send(&eproc.ConnectResponse{Event: ev}) }
	if err := send(&eproc.ProcessEvent{Event: &eproc.ProcessEvent_Start{Start: &eproc.ProcessEvent_StartEvent{Pid: pid}}}); err != nil {
		return err
	}
	return follow(ctx, ec, cid, send)
}

// bashPath is the shell the SDKs run every command with (/bin/bash -l -c
// CMD); shPath stands in for it in a sandbox without bash (busybox).
const (
	bashPath = "/bin/bash"
	shPath   = "/bin/sh"
	// maxShellCache bounds the per-sandbox memory of which have bash.
	maxShellCache = 10_000
)

// shellCache remembers, per sandbox, whether its image has /bin/bash
// (looked up once per sandbox: a sandbox that installs bash later keeps
// running the SDK's commands under /bin/sh).
type shellCache struct {
	mu      sync.Mutex
	hasBash map[string]bool
}

// argv is the command to run for E2B's argv: /bin/bash becomes /bin/sh in
// a sandbox that has no bash (busybox's sh takes -l and -c alike).
func (sc *shellCache) argv(ctx context.Context, ec *envdCaller, argv []string) ([]string, error) {
	if argv[0] != bashPath {
		return argv, nil
	}
	sc.mu.Lock()
	has, known := sc.hasBash[ec.id]
	sc.mu.Unlock()
	if !known {
		_, err := ec.c.Stat(ctx, ec.id, bashPath)
		switch {
		case err == nil:
			has = true
		case warren.IsNotFound(err):
			if _, gone := ec.c.Get(ctx, ec.id); gone != nil {
				return nil, rpcError(gone)
			}
		default:
			return nil, rpcError(err)
		}
		sc.mu.Lock()
		if sc.hasBash == nil || len(sc.hasBash) >= maxShellCache {
			sc.hasBash = map[string]bool{}
		}
		sc.hasBash[ec.id] = has
		sc.mu.Unlock()
	}
	if has {
		return argv, nil
	}
	return append([]string{shPath}, argv[1:]...), nil
}

// cidOf finds the command id of a pid in the sandbox's command history.
func cidOf(ctx context.Context, ec *envdCaller, pid uint32) (string, error) {
	if pid == 0 {
		return "", connect.NewError(connect.CodeInvalidArgument, errors.New("process.pid is required (tags are not served)"))
	}
	hist, err := ec.c.Commands(ctx, ec.id)
	if err != nil {
		return "", rpcError(err)
	}
	for i := len(hist) - 1; i >= 0; i-- {
		if cid := hist[i].CommandID; cid != "" && pidOf(cid) == pid {
			return cid, nil
		}
	}
	return "", connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", pid))
}

// follow waits for a command, with keepalives, then sends its output and
// end event. When the call's deadline (Connect-Timeout-Ms) passes first,
// the command is killed, as envd does.
func follow(ctx context.Context, ec *envdCaller, cid string, send func(*eproc.ProcessEvent) error) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, waitSlice)
		cmd, err := ec.c.Command(wctx, ec.id, cid, true)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				kctx, kcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				_, _ = ec.c.KillCommand(kctx, ec.id, cid, 9)
				kcancel()
				return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the command outlived its deadline and was killed"))
			}
			if wctx.Err() == nil {
				return rpcError(err)
			}
			cmd = &api.Command{Running: true} // this wait slice ended
		}
		if cmd.Running {
			if err := send(&eproc.ProcessEvent{Event: &eproc.ProcessEvent_Keepalive{Keepalive: &eproc.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
			continue
		}
		if cmd.Stdout != "" {
			if err := send(&eproc.ProcessEvent{Event: &eproc.ProcessEvent_Data{Data: &eproc.ProcessEvent_DataEvent{Output: &eproc.ProcessEvent_DataEvent_Stdout{Stdout: []byte(cmd.Stdout)}}}}); err != nil {
				return err
			}
		}
		if cmd.Stderr != "" {
			if err := send(&eproc.ProcessEvent{Event: &eproc.ProcessEvent_Data{Data: &eproc.ProcessEvent_DataEvent{Output: &eproc.ProcessEvent_DataEvent_Stderr{Stderr: []byte(cmd.Stderr)}}}}); err != nil {
				return err
			}
		}
		return send(&eproc.ProcessEvent{Event: &eproc.ProcessEvent_End{End: endOf(cmd)}})
	}
}

// endOf is the end event of a finished command, worded as envd (Go's
// os/exec) words it.
func endOf(cmd *api.Command) *eproc.ProcessEvent_EndEvent {
	if cmd.Signal != "" || cmd.ExitCode == nil {
		word := map[string]string{"SIGKILL": "killed", "SIGTERM": "terminated", "SIGINT": "interrupt", "SIGHUP": "hangup"}[cmd.Signal]
		if word == "" {
			word = strings.ToLower(strings.TrimPrefix(cmd.Signal, "SIG"))
		}
		if word == "" {
			word = "killed"
		}
		st := "signal: " + word
		return &eproc.ProcessEvent_EndEvent{ExitCode: -1, Exited: false, Status: st, Error: &st}
	}
	st := fmt.Sprintf("exit status %d", *cmd.ExitCode)
	end := &eproc.ProcessEvent_EndEvent{ExitCode: int32(*cmd.ExitCode), Exited: true, Status: st}
	if *cmd.ExitCode != 0 {
		end.Error = &st
	}
	return end
}

func (p *procService) SendSignal(ctx context.Context, req *connect.Request[eproc.SendSignalRequest]) (*connect.Response[eproc.SendSignalResponse], error) {
	ec, err := p.caller(req.Header())
	if err != nil {
		return nil, err
	}
	sig := 9
	switch req.Msg.GetSignal() {
	case eproc.Signal_SIGNAL_SIGTERM:
		sig = 15
	case eproc.Signal_SIGNAL_SIGKILL:
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %v: SIGNAL_SIGKILL or SIGNAL_SIGTERM", req.Msg.GetSignal()))
	}
	cid, err := cidOf(ctx, ec, req.Msg.GetProcess().GetPid())
	if err != nil {
		return nil, err
	}
	cmd, err := ec.c.Command(ctx, ec.id, cid, false)
	if err != nil {
		return nil, rpcError(err)
	}
	if !cmd.Running {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d has ended", req.Msg.GetProcess().GetPid()))
	}
	if _, err := ec.c.KillCommand(ctx, ec.id, cid, sig); err != nil {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&eproc.SendSignalResponse{}), nil
}

// List answers the running processes started through envd (warren's
// running background commands).
func (p *procService) List(ctx context.Context, req *connect.Request[eproc.ListRequest]) (*connect.Response[eproc.ListResponse], error) {
	ec, err := p.caller(req.Header())
	if err != nil {
		return nil, err
	}
	hist, err := ec.c.Commands(ctx, ec.id)
	if err != nil {
		return nil, rpcError(err)
	}
	out := &eproc.ListResponse{}
	for _, h := range hist {
		if h.CommandID == "" || h.ExitCode != nil || h.Error != "" {
			continue
		}
		cmd, err := ec.c.Command(ctx, ec.id, h.CommandID, false)
		if err != nil || !cmd.Running {
			continue
		}
		cfg := &eproc.ProcessConfig{Cmd: h.Cmd}
		if len(h.Argv) > 0 {
			cfg.Cmd, cfg.Args = h.Argv[0], h.Argv[1:]
		}
		out.Processes = append(out.Processes, &eproc.ProcessInfo{Config: cfg, Pid: pidOf(h.CommandID)})
	}
	return connect.NewResponse(out), nil
}
