package edge

import (
	"context"
	"fmt"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/sandboxspec"
)

// The edge's operations: one registration per op, saying how its body is
// decoded, how a scoped request is checked before it runs, and what runs
// it. handle (handlers.go) looks the op up here; an op that is not
// registered answers 404.

// opScope is how handle checks a request of a project-scoped principal
// before the op runs.
type opScope int

const (
	// scopeSandbox: the request's Warren-Sandbox header must name a
	// sandbox within the scope (the default).
	scopeSandbox opScope = iota
	// scopeOwn: the op checks the scope itself (a create's project, a
	// list's filter) or reads nothing a project owns (images).
	scopeOwn
)

// opCall is one request as an op's handler sees it.
type opCall struct {
	op     string
	body   []byte
	w      *bus.Replier
	scope  string // the principal's project scope, when scoped
	scoped bool
}

// opSpec registers one operation.
type opSpec struct {
	scope opScope
	// sandboxBody: the request's "id" is the sandbox it acts on, so a
	// Warren-Sandbox header (what the scope was checked against) must
	// name the same one (checkSandboxHeader).
	sandboxBody bool
	run         func(e *Edge, ctx context.Context, c *opCall) (any, error)
}

// decoded makes an op's runner that decodes its body as a T (a malformed
// body is a 400) and passes it on.
func decoded[T any](fn func(e *Edge, ctx context.Context, c *opCall, req *T) (any, error)) func(*Edge, context.Context, *opCall) (any, error) {
	return func(e *Edge, ctx context.Context, c *opCall) (any, error) {
		var req T
		if err := decode(c.body, &req); err != nil {
			return nil, err
		}
		return fn(e, ctx, c, &req)
	}
}

// ofSandbox registers an op on one sandbox, named by its body's "id".
func ofSandbox(run func(*Edge, context.Context, *opCall) (any, error)) opSpec {
	return opSpec{scope: scopeSandbox, sandboxBody: true, run: run}
}

// edgeOps is every operation the edge answers, on the bus and (the
// DataOps) on the data listener.
var edgeOps map[string]opSpec

// init fills edgeOps. It is long because it is the edge's whole table of
// operations, one short entry per op (the loops at its end register the
// ops that share a runner), and reads best whole, as a table.
func init() {
	edgeOps = map[string]opSpec{
		OpCreate:      {scope: scopeOwn, run: decoded(runCreate)},
		OpCreateBatch: {scope: scopeOwn, run: decoded(runCreateBatch)},
		OpList:        {scope: scopeOwn, run: decoded(runList)},
		OpImages:      {scope: scopeOwn, run: runImages},
		OpTrajReplay:  {scope: scopeOwn, run: decoded(runTrajReplay)},

		OpGet:    ofSandbox(decoded(runGet)),
		OpDelete: ofSandbox(decoded(runDelete)),
		OpCommands: ofSandbox(decoded(func(e *Edge, _ context.Context, _ *opCall, req *IDRequest) (any, error) {
			return e.commands(req.ID)
		})),
		OpStats: ofSandbox(decoded(func(e *Edge, ctx context.Context, _ *opCall, req *IDRequest) (any, error) {
			return e.stats(ctx, req.ID)
		})),
		OpNetwork: ofSandbox(decoded(func(e *Edge, _ context.Context, _ *opCall, req *IDRequest) (any, error) {
			return e.rules.Read(req.ID)
		})),
		OpNetworkSet: ofSandbox(decoded(func(e *Edge, ctx context.Context, _ *opCall, req *NetworkSetRequest) (any, error) {
			return e.setNetwork(ctx, req)
		})),
		edgeproto.OpScreenshot: ofSandbox(decoded(func(e *Edge, ctx context.Context, _ *opCall, req *IDRequest) (any, error) {
			return e.screenshot(ctx, req.ID)
		})),
		edgeproto.OpDisplayInput: ofSandbox(decoded(func(e *Edge, ctx context.Context, _ *opCall, req *edgeproto.DisplayInputRequest) (any, error) {
			return e.displayInput(ctx, req)
		})),
		OpNetworkDenials: ofSandbox(decoded(func(e *Edge, _ context.Context, _ *opCall, req *IDRequest) (any, error) {
			return e.networkDenials(req.ID)
		})),
		OpPause: ofSandbox(decoded(func(e *Edge, ctx context.Context, _ *opCall, req *ResumeSandboxRequest) (any, error) {
			return e.pauseOne(ctx, req.ID)
		})),
		OpResume: ofSandbox(decoded(func(e *Edge, ctx context.Context, _ *opCall, req *ResumeSandboxRequest) (any, error) {
			return e.resumeOne(ctx, req.ID, !req.NoPrefetch)
		})),
		OpTimeout: ofSandbox(decoded(func(e *Edge, _ context.Context, _ *opCall, req *TimeoutRequest) (any, error) {
			return e.setTimeout(req)
		})),
		OpPauseMatch: {run: decoded(func(e *Edge, ctx context.Context, _ *opCall, req *PauseMatchingRequest) (any, error) {
			return e.pauseMatching(ctx, req)
		})},

		OpImagePull: {run: decoded(func(e *Edge, ctx context.Context, _ *opCall, req *api.PullImageRequest) (any, error) {
			return e.cfg.Images.PullImage(ctx, req.Ref, req.Name)
		})},
		OpImageCommit: {run: decoded(func(e *Edge, ctx context.Context, _ *opCall, req *api.CommitImageRequest) (any, error) {
			return e.cfg.Images.CommitImage(ctx, req)
		})},

		OpPoolPut: {run: decoded(func(e *Edge, ctx context.Context, _ *opCall, req *api.PoolRequest) (any, error) {
			return e.pools.Put(req)
		})},
		OpPoolList: {run: func(e *Edge, _ context.Context, _ *opCall) (any, error) { return e.pools.List(), nil }},
		OpPoolDelete: {run: decoded(func(e *Edge, _ context.Context, _ *opCall, req *PoolNameRequest) (any, error) {
			return e.pools.Delete(req.Project, req.Name)
		})},
		OpFnCall: {run: decoded(func(e *Edge, ctx context.Context, _ *opCall, req *FnCallRequest) (any, error) {
			return e.fn.Call(ctx, req)
		})},

		OpSnapshot: ofSandbox(decoded(func(e *Edge, ctx context.Context, _ *opCall, req *SnapshotRequest) (any, error) {
			return e.snapshotOp(ctx, req)
		})),
		OpForkMemory: ofSandbox(decoded(func(e *Edge, ctx context.Context, _ *opCall, req *ForkMemoryRequest) (any, error) {
			return e.forkMemory(ctx, req)
		})),
		OpSnapshotGet: {run: decoded(func(e *Edge, ctx context.Context, _ *opCall, req *SnapshotGetRequest) (any, error) {
			return e.getSnapshot(ctx, req.Snapshot)
		})},

		OpExec: ofSandbox(decoded(func(e *Edge, ctx context.Context, c *opCall, req *ExecRequest) (any, error) {
			return e.execRecorded(ctx, req, c.w)
		})),

		OpTrajResume: ofSandbox(decoded(func(e *Edge, ctx context.Context, _ *opCall, req *ResumeRequest) (any, error) {
			return e.resumeTrajectory(ctx, req)
		})),
		OpTrajAdvance: ofSandbox(decoded(func(e *Edge, _ context.Context, _ *opCall, req *AdvanceRequest) (any, error) {
			return e.advanceTrajectory(req)
		})),
		OpAudit: ofSandbox(decoded(func(e *Edge, _ context.Context, _ *opCall, req *AuditRequest) (any, error) {
			return e.auditOf(req)
		})),
	}
	runCommand := decoded(func(e *Edge, ctx context.Context, c *opCall, req *CommandRequest) (any, error) {
		return e.command(ctx, c.op, req)
	})
	for _, op := range []string{OpCommandGet, OpCommandKill} {
		edgeOps[op] = ofSandbox(runCommand)
	}
	runLayer := decoded(func(e *Edge, ctx context.Context, c *opCall, req *LayerRequest) (any, error) {
		return e.layerOp(ctx, c.op, req)
	})
	for _, op := range []string{OpLayerUpload, OpLayerList, OpLayerGet, OpLayerDelete, OpLayerGC} {
		edgeOps[op] = opSpec{run: runLayer}
	}
	edgeOps[OpLayerCreate] = ofSandbox(runLayer) // from the sandbox its body names
	runFile := decoded(func(e *Edge, ctx context.Context, c *opCall, req *FileRequest) (any, error) {
		return e.fileRecorded(ctx, c.op, req, c.w)
	})
	for _, op := range []string{OpFileRead, OpFileWrite, OpFileList, OpFileStat, OpFileMkdir, OpFileRemove, OpFileRename, OpTarGet, OpTarPut} {
		edgeOps[op] = ofSandbox(runFile)
	}
}

// outsideScope refuses a new sandbox of a project outside the principal's
// scope.
func outsideScope(c *opCall, project string) error {
	if c.scoped && !sandboxspec.Within(project, c.scope) {
		return &api.Error{Code: api.CodeForbidden, Message: fmt.Sprintf("project %s is outside %s", project, c.scope)}
	}
	return nil
}

func runCreate(e *Edge, ctx context.Context, c *opCall, req *CreateRequest) (any, error) {
	if err := outsideScope(c, req.Spec.Project); err != nil {
		return nil, err
	}
	if c.scoped {
		if err := e.checkSnapshotScope(ctx, &req.Spec, c.scope); err != nil {
			return nil, err
		}
	}
	return e.create(ctx, req)
}

func runCreateBatch(e *Edge, ctx context.Context, c *opCall, req *CreateBatchRequest) (any, error) {
	checked := map[string]bool{} // the items of a batch share their spec
	for _, it := range req.Items {
		if err := outsideScope(c, it.Spec.Project); err != nil {
			return nil, err
		}
		if k := fmt.Sprint(it.Spec.Snapshot, it.Spec.Layers); c.scoped && !checked[k] {
			if err := e.checkSnapshotScope(ctx, &it.Spec, c.scope); err != nil {
				return nil, err
			}
			checked[k] = true
		}
	}
	return e.createBatch(ctx, req), nil
}

func runList(e *Edge, _ context.Context, c *opCall, req *ListRequest) (any, error) {
	if c.scoped {
		req.Scope, req.Scoped = c.scope, true
	}
	return e.list(req), nil
}

func runImages(e *Edge, ctx context.Context, _ *opCall) (any, error) {
	imgs, err := e.cfg.Images.ListImages(ctx)
	if err != nil {
		return nil, err
	}
	return &api.ImageList{Images: imgs}, nil
}

// runTrajReplay: like a create, the replay's sandbox is new, of the
// spec's project.
func runTrajReplay(e *Edge, ctx context.Context, c *opCall, req *ReplayRequest) (any, error) {
	if err := outsideScope(c, req.Spec.Project); err != nil {
		return nil, err
	}
	return e.replayTrajectory(ctx, req)
}

func runGet(e *Edge, _ context.Context, _ *opCall, req *IDRequest) (any, error) {
	sb, err := e.lookup(req.ID)
	if err != nil {
		return nil, err
	}
	v := sb.view()
	sb.mu.Lock()
	v.CPUStats = sb.cpu.StatsLocked()
	sb.mu.Unlock()
	return &v, nil
}

func runDelete(e *Edge, ctx context.Context, _ *opCall, req *IDRequest) (any, error) {
	sb, err := e.lookup(req.ID)
	if err != nil {
		return nil, err
	}
	<-sb.ready
	e.stop(ctx, sb, api.StateStopped, "deleted")
	v := sb.view()
	return &v, nil
}
