package agent

import (
	"context"

	"github.com/warrenhq/warren/internal/agentproto"
)

// The agent's operations: one registration per op, saying in which phase
// it may run, how its body is decoded and what runs it. dispatch
// (conn.go) looks the op up here.

// opPhase is what must hold before an op runs.
type opPhase int

const (
	// phaseRequest: the agent is set up; the op counts as a request in
	// flight (enterRequest) and waits out a reset in progress (the
	// default, and what an unknown op goes through before it is refused).
	phaseRequest opPhase = iota
	// phaseAny: always (ping, setup).
	phaseAny
	// phaseSetUp: the agent is set up; the op is not a request a reset
	// waits for (wipe, reroot, resume: the edge's own steps).
	phaseSetUp
)

// agentOp registers one operation.
type agentOp struct {
	phase opPhase
	run   func(a *Agent, ctx context.Context, cl *call, req *agentproto.Request) (any, error)
}

// withBody makes an op's runner that decodes its body as a T (a bad body
// is ErrInvalid) and passes it on.
func withBody[T any](fn func(a *Agent, ctx context.Context, cl *call, req *agentproto.Request, r *T) (any, error)) func(*Agent, context.Context, *call, *agentproto.Request) (any, error) {
	return func(a *Agent, ctx context.Context, cl *call, req *agentproto.Request) (any, error) {
		var r T
		if err := decode(req, &r); err != nil {
			return nil, err
		}
		return fn(a, ctx, cl, req, &r)
	}
}

// agentOps is every operation the agent answers.
var agentOps = map[string]agentOp{
	agentproto.OpPing: {phase: phaseAny, run: func(*Agent, context.Context, *call, *agentproto.Request) (any, error) {
		return &agentproto.PingResult{Proto: agentproto.Proto}, nil
	}},
	agentproto.OpSetup: {phase: phaseAny, run: withBody(func(a *Agent, ctx context.Context, _ *call, _ *agentproto.Request, cfg *agentproto.SetupConfig) (any, error) {
		return a.doSetup(ctx, cfg)
	})},

	agentproto.OpWipe: {phase: phaseSetUp, run: func(a *Agent, ctx context.Context, _ *call, _ *agentproto.Request) (any, error) {
		return a.wipe(ctx)
	}},
	agentproto.OpReroot: {phase: phaseSetUp, run: withBody(func(a *Agent, _ context.Context, _ *call, _ *agentproto.Request, r *agentproto.RerootRequest) (any, error) {
		return a.reroot(r)
	})},
	agentproto.OpResume: {phase: phaseSetUp, run: withBody(func(a *Agent, _ context.Context, _ *call, _ *agentproto.Request, r *agentproto.ResumeRequest) (any, error) {
		return a.resume(r)
	})},

	agentproto.OpIdentity: {phase: phaseSetUp, run: withBody(func(a *Agent, _ context.Context, _ *call, _ *agentproto.Request, r *agentproto.IdentityRequest) (any, error) {
		return nil, a.identity(r)
	})},

	agentproto.OpClock: {phase: phaseSetUp, run: withBody(func(a *Agent, _ context.Context, _ *call, _ *agentproto.Request, r *agentproto.ClockRequest) (any, error) {
		if !a.vm {
			return nil, nil // a container's clock is the host's
		}
		if err := setClock(r.UnixNano); err != nil {
			return nil, err
		}
		if r.OwnRAM {
			if err := reportFreePages(); err != nil {
				return nil, errf(agentproto.ErrInternal, "clock: free page reporting: %v", err)
			}
		}
		return nil, nil
	})},

	agentproto.OpUpperTar: {run: func(a *Agent, ctx context.Context, cl *call, _ *agentproto.Request) (any, error) {
		return a.upperTar(ctx, cl)
	}},

	agentproto.OpInput: {run: withBody(func(a *Agent, ctx context.Context, cl *call, req *agentproto.Request, r *agentproto.InputRequest) (any, error) {
		if req.Payload != nil { // sent raw, after the request
			r.Data = req.Payload
		}
		return nil, a.input(ctx, cl.conn, r)
	})},
	agentproto.OpReset: {run: func(a *Agent, ctx context.Context, _ *call, _ *agentproto.Request) (any, error) {
		return a.reset(ctx)
	}},
	agentproto.OpExec: {run: withBody(runExec)},
	agentproto.OpProcGet: {run: withBody(func(a *Agent, ctx context.Context, _ *call, _ *agentproto.Request, r *agentproto.ProcRequest) (any, error) {
		return a.procGet(ctx, r)
	})},
	agentproto.OpProcKill: {run: withBody(func(a *Agent, _ context.Context, _ *call, _ *agentproto.Request, r *agentproto.ProcRequest) (any, error) {
		return nil, a.procKill(r)
	})},
	agentproto.OpFileRead: {run: withBody(func(a *Agent, _ context.Context, cl *call, _ *agentproto.Request, r *agentproto.PathRequest) (any, error) {
		return a.fileRead(cl, r)
	})},
	agentproto.OpFileWrite: {run: withBody(func(a *Agent, _ context.Context, _ *call, req *agentproto.Request, r *agentproto.WriteRequest) (any, error) {
		if req.Payload != nil { // sent raw, after the request
			r.Data = req.Payload
		}
		return a.fileWrite(r)
	})},
	agentproto.OpFileList: {run: withBody(func(a *Agent, _ context.Context, _ *call, _ *agentproto.Request, r *agentproto.PathRequest) (any, error) {
		return a.fileList(r)
	})},
	agentproto.OpFileStat: {run: withBody(func(a *Agent, _ context.Context, _ *call, _ *agentproto.Request, r *agentproto.PathRequest) (any, error) {
		return a.fileStat(r)
	})},
	agentproto.OpFileMkdir: {run: withBody(func(a *Agent, _ context.Context, _ *call, _ *agentproto.Request, r *agentproto.MkdirRequest) (any, error) {
		return a.fileMkdir(r)
	})},
	agentproto.OpFileRemove: {run: withBody(func(a *Agent, _ context.Context, _ *call, _ *agentproto.Request, r *agentproto.RemoveRequest) (any, error) {
		return nil, a.fileRemove(r)
	})},
	agentproto.OpFileRename: {run: withBody(func(a *Agent, _ context.Context, _ *call, _ *agentproto.Request, r *agentproto.RenameRequest) (any, error) {
		return nil, a.fileRename(r)
	})},
	agentproto.OpTarGet: {run: withBody(func(a *Agent, _ context.Context, cl *call, _ *agentproto.Request, r *agentproto.PathRequest) (any, error) {
		return nil, a.tarGet(cl, r)
	})},
	agentproto.OpTarPut: {run: withBody(func(a *Agent, _ context.Context, cl *call, req *agentproto.Request, r *agentproto.TarPutRequest) (any, error) {
		if req.Payload != nil { // sent raw, after the request
			r.Data = req.Payload
		}
		// An upload spans calls: it is abandoned when the connection
		// ends, not when one of its calls does.
		return a.tarPut(cl.conn.ctx, r)
	})},
}

func runExec(a *Agent, ctx context.Context, cl *call, _ *agentproto.Request, r *agentproto.ExecRequest) (any, error) {
	if r.ResetAfter {
		if len(a.cfg.Stateless) == 0 {
			return nil, errf(agentproto.ErrInvalid, "exec: reset_after needs a stateless sandbox")
		}
		cl.after = a.beginReset(ctx)
	}
	return a.exec(ctx, cl, r)
}
