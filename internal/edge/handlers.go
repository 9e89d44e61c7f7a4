package edge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edge/audit"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// Exec defaults.
const (
	DefaultExecTimeout = 10 * time.Minute
	DefaultOutputCap   = 16 << 20
	MaxOutputCap       = 1 << 30
)

func badRequest(format string, a ...any) error {
	return &api.Error{Code: api.CodeBadRequest, Message: fmt.Sprintf(format, a...)}
}

func decode(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest("malformed request: %v", err)
	}
	return nil
}

// handle is the edge's bus handler (and the data listener's, through
// handleData): it checks the request's scope as its op's registration
// (ops.go) says, then runs the op.
func (e *Edge) handle(ctx context.Context, op string, body []byte, w *bus.Replier) (any, error) {
	// A request on behalf of a project-scoped principal reaches only the
	// sandboxes of that project and below.
	if err := checkSandboxHeader(ctx, op, body); err != nil {
		return nil, err
	}
	scope, scoped := bus.HeaderOf(ctx, bus.HeaderScope)
	if !scoped && !bus.Unscoped(ctx) {
		// A missing scope is no access, not root: root is said explicitly.
		return nil, &api.Error{Code: api.CodeForbidden, Message: "a request to an edge must carry a scope or the root marker"}
	}
	spec, known := edgeOps[op]
	if scoped && (!known || spec.scope == scopeSandbox) {
		if err := e.sandboxInScope(ctx, scope); err != nil {
			return nil, err
		}
	}
	if !known {
		return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("unknown edge operation %q", op)}
	}
	return spec.run(e, ctx, &opCall{op: op, body: body, w: w, scope: scope, scoped: scoped})
}

// sandboxInScope checks that a scoped request names its sandbox in the
// Warren-Sandbox header and that the sandbox is within scope.
func (e *Edge) sandboxInScope(ctx context.Context, scope string) error {
	id, ok := bus.HeaderOf(ctx, bus.HeaderSandbox)
	if !ok {
		return badRequest("a scoped request must name its sandbox")
	}
	sb, err := e.lookup(id)
	if err != nil {
		return err
	}
	if !sandboxspec.Within(sb.rec.Spec.Project, scope) {
		return &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("sandbox %s not found", id)}
	}
	return nil
}

func (e *Edge) list(req *ListRequest) *api.SandboxList {
	e.mu.Lock()
	all := make([]*sandbox, 0, len(e.sandboxes))
	for _, sb := range e.sandboxes {
		all = append(all, sb)
	}
	e.mu.Unlock()
	out := &api.SandboxList{Sandboxes: []api.Sandbox{}}
	for _, sb := range all {
		if sb.pooled() {
			continue
		}
		v := sb.view()
		if req.State != "" && v.State != req.State {
			continue
		}
		if req.Scoped && !sandboxspec.Within(v.Project, req.Scope) {
			continue
		}
		if req.Project != "" && !sandboxspec.Within(v.Project, req.Project) {
			continue
		}
		match := true
		for k, want := range req.Labels {
			if v.Labels[k] != want {
				match = false
				break
			}
		}
		if match {
			out.Sandboxes = append(out.Sandboxes, v)
		}
	}
	sort.Slice(out.Sandboxes, func(i, j int) bool { return out.Sandboxes[i].CreatedAt.Before(out.Sandboxes[j].CreatedAt) })
	return out
}

func (e *Edge) lookup(id string) (*sandbox, error) {
	e.mu.Lock()
	sb := e.sandboxes[id]
	if sb == nil {
		sb = e.lostTombstone(id)
	}
	e.mu.Unlock()
	if sb != nil && sb.pooled() {
		sb = nil // warm pool members are nobody's yet
	}
	if sb == nil {
		return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("sandbox %s not found", id)}
	}
	return sb, nil
}

// acquire finds a running sandbox, marks it active and counts the operation
// as in flight until release is called.
func (e *Edge) acquire(id string) (*sandbox, *agentproto.Client, func(), error) {
	sb, err := e.lookup(id)
	if err != nil {
		return nil, nil, nil, err
	}
	<-sb.ready
	sb.mu.Lock()
	defer sb.mu.Unlock()
	for sb.rec.Sandbox.State == api.StatePaused && !sb.stopping {
		// Any operation on a paused sandbox resumes it first.
		sb.mu.Unlock()
		err := e.pauser.Resume(context.Background(), e.pausable(sb), true)
		sb.mu.Lock()
		if err != nil {
			return nil, nil, nil, err
		}
	}
	if sb.rec.Sandbox.State != api.StateRunning || sb.stopping || sb.inst == nil {
		return nil, nil, nil, &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s is %s", id, stateWord(sb))}
	}
	sb.inflight++
	sb.lastActive = time.Now()
	e.cpuSwitchLocked(sb) // the CPU is there before the agent hears of the operation
	lat := e.latencyOp(sb)
	if lat {
		e.classBegin() // and the best-effort class is capped
	}
	return sb, sb.inst.Agent, func() {
		sb.mu.Lock()
		sb.inflight--
		sb.lastActive = time.Now()
		e.cpuSwitchLocked(sb)
		if lat {
			e.classEnd()
		}
		sb.mu.Unlock()
	}, nil
}

func stateWord(sb *sandbox) string {
	if sb.stopping && sb.rec.Sandbox.State == api.StateRunning {
		return "stopping"
	}
	return sb.rec.Sandbox.State
}

// agentError turns an agent or channel failure into an API error.
func (e *Edge) agentError(sb *sandbox, err error) error {
	var ae *agentproto.Error
	if errors.As(err, &ae) {
		code := api.CodeInternal
		switch ae.Code {
		case agentproto.ErrNotFound:
			code = api.CodeNotFound
		case agentproto.ErrInvalid:
			code = api.CodeBadRequest
		case agentproto.ErrExists, agentproto.ErrNotDir, agentproto.ErrIsDir, agentproto.ErrNotEmpty:
			code = api.CodeConflict
		case agentproto.ErrPermission:
			code = api.CodeForbidden
		case agentproto.ErrTooLarge:
			code = api.CodeTooLarge
		case agentproto.ErrNoSpace:
			code = api.CodeTooLarge
		case agentproto.ErrPidsLimit:
			e.audit.Limit(auditSandbox{sb}, api.AuditLimitPids)
			return &api.Error{Code: api.CodeTooManyRequests, Reason: api.ReasonPids,
				Message: ae.Message + ": the sandbox is at its pids limit (its processes hold every pid it may use); retry when some have ended"}
		}
		return &api.Error{Code: code, Message: ae.Message}
	}
	if errors.Is(err, agentproto.ErrClosed) {
		sb.mu.Lock()
		defer sb.mu.Unlock()
		return &api.Error{Code: api.CodeConflict, Message: fmt.Sprintf("sandbox %s stopped during the operation", sb.rec.Sandbox.ID)}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return &api.Error{Code: api.CodeTimeout, Message: "operation cancelled"}
	}
	return err
}

// checkExec refuses an exec request that is not well formed.
func checkExec(x *api.ExecRequest) *api.Error {
	if (x.Cmd == "") == (len(x.Argv) == 0) {
		return &api.Error{Code: api.CodeInvalid, Message: "exactly one of cmd and argv is required"}
	}
	if aerr := sandboxspec.CheckEnv(x.Env); aerr != nil {
		return aerr
	}
	if aerr := sandboxspec.CheckUser(x.User); aerr != nil {
		return aerr
	}
	if x.KeepCPU && !x.Background {
		return &api.Error{Code: api.CodeInvalid, Message: "keep_cpu is only for background commands"}
	}
	if x.Timeout < 0 || x.OutputCap < 0 || x.OutputCap > MaxOutputCap {
		return &api.Error{Code: api.CodeInvalid, Message: "timeout and output_cap must be positive (output_cap at most 1 GiB)"}
	}
	return nil
}

// agentExec is the agent's request for exec x, defaults filled in.
func agentExec(x *api.ExecRequest) *agentproto.ExecRequest {
	timeout := DefaultExecTimeout
	if x.Timeout > 0 {
		timeout = time.Duration(x.Timeout * float64(time.Second))
	}
	areq := &agentproto.ExecRequest{
		Cmd: x.Cmd, Argv: x.Argv, Session: x.Session, Env: x.Env, Cwd: x.Cwd, User: x.User,
		Timeout: timeout, OutputCap: x.OutputCap, Background: x.Background, Trusted: x.Trusted,
	}
	if areq.OutputCap == 0 {
		areq.OutputCap = DefaultOutputCap
	}
	if x.Stdin != "" {
		areq.Stdin = []byte(x.Stdin)
	}
	return areq
}

func (e *Edge) exec(ctx context.Context, req *ExecRequest, chunk func(stream string, data []byte) error) (any, error) {
	x := &req.Exec
	if aerr := checkExec(x); aerr != nil {
		return nil, aerr
	}
	sb, agent, release, err := e.acquire(req.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	areq := agentExec(x)
	if !x.Background {
		e.killsBefore(sb)
	}
	var res agentproto.ExecResult
	start := time.Now()
	// An audit policy's kill-step cancels ctx; the agent then kills the
	// command (the agent protocol's cancel).
	ctx, leave := sb.audit.Enter(ctx)
	defer leave()
	trustedBackground := false
	if x.Trusted {
		// Its window lasts until it ends: for a background one, past
		// this call (afterCommand below).
		sb.audit.BeginTrusted()
		defer func() {
			if !trustedBackground {
				sb.audit.EndTrusted()
			}
		}()
	}
	err = agent.Call(ctx, agentproto.OpExec, areq, &res, func(r *agentproto.Response) error {
		return chunk(r.Stream, r.Data)
	})
	if err != nil && audit.KilledByPolicy(ctx) {
		err = nil
		res = agentproto.ExecResult{ExitCode: 128 + 9, Signal: "SIGKILL", Duration: time.Since(start).Seconds() * 1000}
	}
	if err != nil {
		err = e.agentError(sb, err)
		sb.hist.Note(x, start, nil, err)
		return nil, err
	}
	out := &api.ExecResult{
		ExitCode: res.ExitCode, Truncated: res.Truncated, TimedOut: res.TimedOut, Signal: res.Signal,
		DurationMs: res.Duration, CommandID: res.CommandID,
	}
	if audit.KilledByPolicy(ctx) {
		out.KilledBy = api.KilledByPolicy
	} else if !x.Background {
		e.explainEnd(sb, out)
		e.audit.Limits(auditSandbox{sb}, out)
	} else if x.KeepCPU && res.CommandID != "" {
		e.holdCPU(sb, agent, res.CommandID)
	}
	if x.Trusted && x.Background && res.CommandID != "" {
		trustedBackground = true
		e.afterCommand(agent, res.CommandID, sb.audit.EndTrusted)
	}
	sb.hist.Note(x, start, out, nil)
	return out, nil
}

func (e *Edge) command(ctx context.Context, op string, req *CommandRequest) (any, error) {
	if req.CommandID == "" || len(req.CommandID) > 128 {
		return nil, badRequest("command_id is required")
	}
	sb, agent, release, err := e.acquire(req.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	if op == OpCommandKill {
		if req.Signal < 0 || req.Signal > 64 {
			return nil, &api.Error{Code: api.CodeInvalid, Message: "signal must be between 1 and 64"}
		}
		if err := agent.Call(ctx, agentproto.OpProcKill, &agentproto.ProcRequest{CommandID: req.CommandID, Signal: req.Signal}, nil, nil); err != nil {
			return nil, e.agentError(sb, err)
		}
	}
	var st agentproto.ProcStatus
	if err := agent.Call(ctx, agentproto.OpProcGet, &agentproto.ProcRequest{CommandID: req.CommandID, Wait: req.Wait && op == OpCommandGet}, &st, nil); err != nil {
		return nil, e.agentError(sb, err)
	}
	return &api.Command{
		ID: st.CommandID, Running: st.Running, ExitCode: st.ExitCode, Stdout: string(st.Stdout), Stderr: string(st.Stderr),
		Truncated: st.Truncated, TimedOut: st.TimedOut, Signal: st.Signal, DurationMs: st.Duration,
	}, nil
}

func (e *Edge) file(ctx context.Context, op string, req *FileRequest, w *bus.Replier) (any, error) {
	sb, agent, release, err := e.acquire(req.ID)
	if err != nil {
		return nil, err
	}
	defer release()
	var out any
	var body any
	var agentOp string
	var onChunk func(*agentproto.Response) error
	switch op {
	case OpFileRead:
		agentOp, body, out = agentproto.OpFileRead, &agentproto.PathRequest{Path: req.Path}, &api.FileInfo{}
		onChunk = func(r *agentproto.Response) error { return w.Chunk("data", r.Data) }
	case OpFileWrite:
		agentOp, body, out = agentproto.OpFileWrite, &agentproto.WriteRequest{Path: req.Path, Data: req.Data, Mode: req.Mode, Append: req.Append}, &api.FileInfo{}
	case OpFileList:
		agentOp, body, out = agentproto.OpFileList, &agentproto.PathRequest{Path: req.Path}, &api.FileList{}
	case OpFileStat:
		agentOp, body, out = agentproto.OpFileStat, &agentproto.PathRequest{Path: req.Path}, &api.FileInfo{}
	case OpFileMkdir:
		agentOp, body, out = agentproto.OpFileMkdir, &agentproto.MkdirRequest{Path: req.Path, Mode: req.Mode, Parents: req.Parents}, &api.FileInfo{}
	case OpFileRemove:
		agentOp, body = agentproto.OpFileRemove, &agentproto.RemoveRequest{Path: req.Path, Recursive: req.Recursive}
	case OpFileRename:
		agentOp, body = agentproto.OpFileRename, &agentproto.RenameRequest{From: req.Path, To: req.To}
	case OpTarGet:
		agentOp, body = agentproto.OpTarGet, &agentproto.PathRequest{Path: req.Path}
		onChunk = func(r *agentproto.Response) error { return w.Chunk("data", r.Data) }
	case OpTarPut:
		agentOp, body, out = agentproto.OpTarPut, &agentproto.TarPutRequest{Path: req.Path, Handle: req.Handle, Data: req.Data, Final: req.Final, Abort: req.Abort}, &TarPutResult{}
	}
	// The chunks' buffers are reused: a Replier copies each chunk before
	// Chunk returns (onto the data-plane connection, or into the bus's
	// outgoing buffer).
	if err := agent.CallBulk(ctx, agentOp, body, out, onChunk); err != nil {
		return nil, e.agentError(sb, err)
	}
	return out, nil
}
