package edge

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// The FnCall tier runs stateless tasks in pre-created containers that are
// reset between tasks (internal/agent/reset.go): every process killed, the
// writable directories, /dev/shm and message queues emptied, SysV IPC
// removed, sessions and their environment forgotten. The root and /dev are
// read-only, so those directories are all a task can write.

// FnCallDirs are a stateless sandbox's writable directories.
var FnCallDirs = edgeproto.FnCallDirs

// FnCall limits.
const (
	FnCallDefaultTimeout = 30 * time.Second
	FnCallMaxTimeout     = edgeproto.FnCallMaxTimeout
	FnCallDefaultOutput  = 1 << 20
	FnCallMaxOutput      = edgeproto.FnCallMaxOutput
	FnCallMaxFiles       = edgeproto.FnCallMaxFiles
	FnCallMaxFileBytes   = edgeproto.FnCallMaxFileBytes // all files together (they travel in one bus message)
	fnMaxWorkers         = 32                           // per shape and node: more than the clients of a burst, so resets stay off the critical path
	fnMinIdle            = 2                            // kept ready per shape once used
)

// fnShape is a set of interchangeable workers (same image and limits).
type fnShape struct {
	key   string
	spec  api.CreateSandboxRequest
	idle  chan *sandbox
	total int // live workers (idle, busy, starting); under Edge.mu
	// lastUsed is when a task last took a worker, lastGrown when one last
	// started a new worker (fnShrink); under Edge.mu.
	lastUsed, lastGrown time.Time
}

func (e *Edge) fncall(ctx context.Context, req *FnCallRequest) (*api.ExecResult, error) {
	c := &req.Call
	spec, aerr := edgeproto.NormalizeFnCall(c)
	if aerr != nil {
		return nil, aerr
	}
	spec.Project = req.Project
	key, _ := poolKey(&spec)
	key = TrajKey(req.Project, key)
	for attempt := 0; ; attempt++ {
		w, shape, err := e.fnWorker(ctx, key, &spec)
		if err != nil {
			return nil, err
		}
		res, ran, err := e.fnRun(ctx, w, c)
		if err == nil {
			e.fnRelease(shape, w, ran)
			return res, nil
		}
		var ae *api.Error
		if errors.As(err, &ae) && ae.Code == api.CodeUnavailable && attempt < 2 {
			// The worker's last reset failed; the task did not start.
			e.log.Warn("fncall worker unusable; dropped", "id", w.rec.Sandbox.ID, "err", err)
			e.fnDrop(shape, w)
			continue
		}
		if !errors.As(err, &ae) || ae.Code == api.CodeInternal || ae.Code == api.CodeConflict || ae.Code == api.CodeTimeout || ae.Code == api.CodeUnavailable {
			e.log.Warn("fncall worker dropped", "id", w.rec.Sandbox.ID, "err", err)
			e.fnDrop(shape, w) // the worker is in an unknown state
		} else {
			e.fnRelease(shape, w, ran)
		}
		return nil, err
	}
}

// fnWorker takes an idle worker of the shape, or starts one.
func (e *Edge) fnWorker(ctx context.Context, key string, spec *api.CreateSandboxRequest) (*sandbox, *fnShape, error) {
	e.mu.Lock()
	if e.closing {
		e.mu.Unlock()
		return nil, nil, &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonShuttingDown, Message: "node is shutting down"}
	}
	sh := e.fn[key]
	if sh == nil {
		sh = &fnShape{key: key, spec: *spec, idle: make(chan *sandbox, fnMaxWorkers)}
		e.fn[key] = sh
	}
	sh.lastUsed = time.Now()
	for {
		select {
		case w := <-sh.idle:
			if w.poolReady() {
				e.mu.Unlock()
				return w, sh, nil
			}
			sh.total--
			continue
		default:
		}
		break
	}
	if sh.total >= fnMaxWorkers || (sh.total > 0 && !e.fnRoomLocked(spec)) {
		// The shape is as large as it may grow: wait for one of its
		// workers rather than take the room sandboxes need.
		e.mu.Unlock()
		select {
		case w := <-sh.idle:
			return w, sh, nil
		case <-ctx.Done():
			return nil, nil, &api.Error{Code: api.CodeTimeout, Message: "no fncall worker became free"}
		}
	}
	sh.total++
	sh.lastGrown = time.Now()
	e.mu.Unlock()
	w, err := e.fnStart(ctx, sh, false)
	if err != nil {
		e.mu.Lock()
		sh.total--
		e.mu.Unlock()
		return nil, nil, err
	}
	e.fnTopUp(sh)
	return w, sh, nil
}

// fnTopUp starts workers in the background until fnMinIdle are idle.
func (e *Edge) fnTopUp(sh *fnShape) {
	e.mu.Lock()
	need := fnMinIdle - len(sh.idle)
	if room := fnMaxWorkers - sh.total; need > room {
		need = room
	}
	if need <= 0 || e.closing {
		e.mu.Unlock()
		return
	}
	sh.total += need
	e.mu.Unlock()
	for i := 0; i < need; i++ {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			w, err := e.fnStart(e.runCtx, sh, true)
			if err != nil {
				e.mu.Lock()
				sh.total--
				e.mu.Unlock()
				e.log.Debug("fncall worker", "err", err)
				return
			}
			e.fnRelease(sh, w, false)
		}()
	}
}

// fnStart creates one worker (admitted like any sandbox). A spare one
// (spare: started ahead of demand) only takes free room within the FnCall
// share: it neither reclaims other idle workers nor crowds sandboxes out.
func (e *Edge) fnStart(ctx context.Context, sh *fnShape, spare bool) (*sandbox, error) {
	id := e.newID()
	spec := sh.spec
	e.mu.Lock()
	if spare && !e.fnRoomLocked(&spec) {
		e.mu.Unlock()
		return nil, &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonCPU, Message: "fncall workers hold their share of the node"}
	}
	if spare {
		if aerr := e.shortLocked(e.usageLocked(), &spec); aerr != nil {
			e.mu.Unlock()
			return nil, aerr
		}
	}
	if aerr := e.admitLocked(&spec); aerr != nil {
		e.mu.Unlock()
		return nil, aerr
	}
	now := time.Now().UTC()
	sb := &sandbox{
		rec: record{Spec: spec, Sandbox: api.Sandbox{
			ID: id, State: api.StateCreating, Node: e.cfg.Node, Tier: api.TierFnCall, Image: spec.Image,
			CPU: spec.CPU, MemoryMB: spec.MemoryMB, DiskMB: spec.DiskMB, Pids: spec.Pids,
			Priority: spec.Priority, CreatedAt: now,
		}},
		lastActive: now,
		ready:      make(chan struct{}),
		pool:       fnPoolName(sh.spec.Image),
		stateless:  true,
	}
	e.putLocked(id, sb)
	e.mu.Unlock()
	err := e.start(context.WithoutCancel(ctx), sb)
	close(sb.ready)
	if err != nil {
		e.mu.Lock()
		e.dropLocked(id)
		e.mu.Unlock()
		return nil, err
	}
	return sb, nil
}

func fnPoolName(image string) string { return "fncall:" + image }

// fnRelease makes a worker idle again. reset says the agent resets it
// itself (the task's exec asked for it; the agent holds the next request
// until it is done); otherwise it is reset here first, in the background
// (the caller has its answer already).
func (e *Edge) fnRelease(sh *fnShape, w *sandbox, reset bool) {
	if reset {
		e.fnIdle(sh, w)
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		w.mu.Lock()
		inst := w.inst
		w.mu.Unlock()
		var rr agentproto.ResetResult
		if inst == nil {
			e.fnDrop(sh, w)
			return
		}
		if err := inst.Agent.Call(ctx, agentproto.OpReset, nil, &rr, nil); err != nil {
			e.log.Warn("fncall worker reset failed; dropped", "id", w.rec.Sandbox.ID, "err", err)
			e.fnDrop(sh, w)
			return
		}
		e.fnIdle(sh, w)
	}()
}

// fnIdle puts a reset (or resetting) worker in its shape's idle queue, or
// stops it when the queue is full.
func (e *Edge) fnIdle(sh *fnShape, w *sandbox) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closing {
		return
	}
	select {
	case sh.idle <- w:
	default:
		sh.total--
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.stop(context.Background(), w, api.StateStopped, "fncall worker not needed")
		}()
	}
}

// fnDrop stops a worker that cannot be reused.
func (e *Edge) fnDrop(sh *fnShape, w *sandbox) {
	e.mu.Lock()
	sh.total--
	e.mu.Unlock()
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.stop(context.Background(), w, api.StateStopped, "fncall worker dropped")
	}()
}

// fnRun writes the files and runs the command in worker w. ran says the
// exec was sent, with ResetAfter: the agent resets the worker itself.
func (e *Edge) fnRun(ctx context.Context, w *sandbox, c *api.FnCallRequest) (res *api.ExecResult, ran bool, err error) {
	w.mu.Lock()
	inst := w.inst
	w.mu.Unlock()
	if inst == nil {
		return nil, false, &api.Error{Code: api.CodeConflict, Message: "fncall worker is gone"}
	}
	agent := inst.Agent
	paths := make([]string, 0, len(c.Files))
	for p := range c.Files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if err := agent.Call(ctx, agentproto.OpFileWrite, &agentproto.WriteRequest{Path: p, Data: c.Files[p], Mode: 0o644}, nil, nil); err != nil {
			return nil, false, e.fnAgentError(w, err)
		}
	}
	timeout := FnCallDefaultTimeout
	if c.Timeout > 0 {
		timeout = time.Duration(c.Timeout * float64(time.Second))
	}
	capb := c.OutputCap
	if capb == 0 {
		capb = FnCallDefaultOutput
	}
	areq := &agentproto.ExecRequest{Cmd: c.Cmd, Argv: c.Argv, Env: c.Env, Cwd: c.Cwd, Timeout: timeout, OutputCap: capb,
		Collect: true, ResetAfter: true}
	if c.Stdin != "" {
		areq.Stdin = []byte(c.Stdin)
	}
	e.killsBefore(w)
	var out, errb bytes.Buffer
	var ares agentproto.ExecResult
	err = agent.Call(ctx, agentproto.OpExec, areq, &ares, func(r *agentproto.Response) error {
		if r.Stream == agentproto.StreamStderr {
			errb.Write(r.Data)
		} else {
			out.Write(r.Data)
		}
		return nil
	})
	if err != nil {
		err = e.fnAgentError(w, err)
		var ae *api.Error
		return nil, !errors.As(err, &ae) || ae.Code != api.CodeUnavailable, err
	}
	out.Write(ares.Stdout)
	errb.Write(ares.Stderr)
	res = &api.ExecResult{
		ExitCode: ares.ExitCode, Stdout: strings.ToValidUTF8(out.String(), "\uFFFD"), Stderr: strings.ToValidUTF8(errb.String(), "\uFFFD"),
		Truncated: ares.Truncated, TimedOut: ares.TimedOut, Signal: ares.Signal, DurationMs: ares.Duration,
	}
	e.explainEnd(w, res)
	return res, true, nil
}

// fnAgentError is agentError, with a failed reset as 503: the worker
// carried nothing out and is dropped, and the task goes to another one.
func (e *Edge) fnAgentError(w *sandbox, err error) error {
	var ae *agentproto.Error
	if errors.As(err, &ae) && ae.Code == agentproto.ErrUnusable {
		return &api.Error{Code: api.CodeUnavailable, Message: ae.Message}
	}
	return e.agentError(w, err)
}

// fnViewLocked reports the FnCall workers as pools of the node view.
func (e *Edge) fnViewLocked() []api.NodePool {
	var out []api.NodePool
	for _, sh := range e.fn {
		out = append(out, api.NodePool{Name: fnPoolName(sh.spec.Image) + fmt.Sprintf("/%gcpu/%dmb", sh.spec.CPU, sh.spec.MemoryMB), Project: sh.spec.Project, Size: sh.total, Ready: len(sh.idle)})
	}
	return out
}
