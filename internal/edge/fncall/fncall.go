// Package fncall is the edge's FnCall tier: stateless tasks run in
// pre-created containers (workers) that are reset between tasks
// (internal/agent/reset.go): every process killed, the writable
// directories, /dev/shm and message queues emptied, SysV IPC removed,
// sessions and their environment forgotten. The root and /dev are
// read-only, so edgeproto.FnCallDirs are all a task can write.
//
// Workers of one shape (project, image and limits) are interchangeable.
// The lifecycle core (internal/edge/core) admits and starts them, counts
// them against the workers' share of the node, and reclaims idle ones for
// any create through this package's core.Reclaimer.
//
// Lock order: the core's Edge.mu, then Workers.mu, then the core's
// sandbox.mu (core.Reclaim). Workers.mu is never held while calling the
// core, except Reclaim and Go (see core's package comment).
package fncall

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/edge/core"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// Limits.
const (
	DefaultTimeout = 30 * time.Second
	DefaultOutput  = 1 << 20
	maxWorkers     = 32 // per shape and node: more than the clients of a burst, so resets stay off the critical path
	minIdle        = 2  // kept ready per shape once used
	// idleFor is how long a shape's surplus idle workers (beyond minIdle)
	// stay once no task needed a new worker, and how long all of them stay
	// once no task came at all.
	idleFor = 30 * time.Second
)

// Workers is the node's FnCall workers, by shape.
type Workers struct {
	core core.Core

	mu     sync.Mutex
	shapes map[string]*shape // by project and shape key
}

// shape is a set of interchangeable workers (same image and limits).
type shape struct {
	spec api.CreateSandboxRequest
	idle chan core.Sandbox
	// The rest is under Workers.mu. total counts live workers (idle, busy,
	// starting); lastUsed is when a task last took a worker, lastGrown
	// when one last started a new worker (Shrink).
	total               int
	lastUsed, lastGrown time.Time
}

// New returns the FnCall workers of the node whose core is c.
func New(c core.Core) *Workers {
	return &Workers{core: c, shapes: map[string]*shape{}}
}

// PoolName is the pool name of an image's workers (records, node view).
func PoolName(image string) string { return "fncall:" + image }

// Call runs one task in a worker of its shape.
func (ws *Workers) Call(ctx context.Context, req *edgeproto.FnCallRequest) (*api.ExecResult, error) {
	c := &req.Call
	spec, aerr := edgeproto.NormalizeFnCall(c)
	if aerr != nil {
		return nil, aerr
	}
	spec.Project = req.Project
	key, _ := core.ShapeKey(&spec)
	key = edgeproto.TrajKey(req.Project, key)
	log := ws.core.Logger()
	for attempt := 0; ; attempt++ {
		w, sh, err := ws.worker(ctx, key, &spec)
		if err != nil {
			return nil, err
		}
		res, ran, err := ws.run(ctx, w, c)
		if err == nil {
			ws.release(sh, w, ran)
			return res, nil
		}
		var ae *api.Error
		if errors.As(err, &ae) && ae.Code == api.CodeUnavailable && attempt < 2 {
			// The worker's last reset failed; the task did not start.
			log.Warn("fncall worker unusable; dropped", "id", w.ID(), "err", err)
			ws.drop(sh, w)
			continue
		}
		if !errors.As(err, &ae) || ae.Code == api.CodeInternal || ae.Code == api.CodeConflict || ae.Code == api.CodeTimeout || ae.Code == api.CodeUnavailable {
			log.Warn("fncall worker dropped", "id", w.ID(), "err", err)
			ws.drop(sh, w) // the worker is in an unknown state
		} else {
			ws.release(sh, w, ran)
		}
		return nil, err
	}
}

// worker takes an idle worker of the shape, or starts one.
func (ws *Workers) worker(ctx context.Context, key string, spec *api.CreateSandboxRequest) (core.Sandbox, *shape, error) {
	if ws.core.Closing() {
		return nil, nil, &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonShuttingDown, Message: "node is shutting down"}
	}
	ws.mu.Lock()
	sh := ws.shapes[key]
	if sh == nil {
		sh = &shape{spec: *spec, idle: make(chan core.Sandbox, maxWorkers)}
		ws.shapes[key] = sh
	}
	sh.lastUsed = time.Now()
	w := ws.takeReadyLocked(sh)
	ws.mu.Unlock()
	if w != nil {
		return w, sh, nil
	}
	// Room takes the core's lock, so not under ws.mu; an idle worker
	// that came back meanwhile is taken below.
	room := ws.core.Room(spec)
	ws.mu.Lock()
	if w := ws.takeReadyLocked(sh); w != nil {
		ws.mu.Unlock()
		return w, sh, nil
	}
	if sh.total >= maxWorkers || (sh.total > 0 && !room) {
		// The shape is as large as it may grow: wait for one of its
		// workers rather than take the room sandboxes need.
		ws.mu.Unlock()
		select {
		case w := <-sh.idle:
			return w, sh, nil
		case <-ctx.Done():
			return nil, nil, &api.Error{Code: api.CodeTimeout, Message: "no fncall worker became free"}
		}
	}
	sh.total++
	sh.lastGrown = time.Now()
	ws.mu.Unlock()
	w, err := ws.start(ctx, sh, false)
	if err != nil {
		ws.mu.Lock()
		sh.total--
		ws.mu.Unlock()
		return nil, nil, err
	}
	ws.topUp(sh)
	return w, sh, nil
}

// takeReadyLocked takes an idle worker that is still running off sh's
// queue, forgetting those that stopped meanwhile; nil when none is idle.
func (ws *Workers) takeReadyLocked(sh *shape) core.Sandbox {
	for {
		w := takeIdle(sh)
		if w == nil || w.Ready() {
			return w
		}
		sh.total--
	}
}

// takeIdle takes an idle worker off sh's queue without waiting; nil when
// none is idle.
func takeIdle(sh *shape) core.Sandbox {
	select {
	case w := <-sh.idle:
		return w
	default:
		return nil
	}
}

// topUp starts workers in the background until minIdle are idle.
func (ws *Workers) topUp(sh *shape) {
	if ws.core.Closing() {
		return
	}
	ws.mu.Lock()
	need := min(minIdle-len(sh.idle), maxWorkers-sh.total)
	if need <= 0 {
		ws.mu.Unlock()
		return
	}
	sh.total += need
	ws.mu.Unlock()
	for i := 0; i < need; i++ {
		ws.core.Go(func() {
			w, err := ws.start(ws.core.Context(), sh, true)
			if err != nil {
				ws.mu.Lock()
				sh.total--
				ws.mu.Unlock()
				ws.core.Logger().Debug("fncall worker", "err", err)
				return
			}
			ws.release(sh, w, false)
		})
	}
}

// start creates one worker (admitted like any sandbox). A spare one
// (started ahead of demand) only takes free room within the FnCall
// share: it neither reclaims other idle workers nor crowds sandboxes out.
func (ws *Workers) start(ctx context.Context, sh *shape, spare bool) (core.Sandbox, error) {
	return ws.core.StartWorker(ctx, sh.spec, core.WorkerOptions{Pool: PoolName(sh.spec.Image), Stateless: true, Spare: spare})
}

// release makes a worker idle again. reset says the agent resets it
// itself (the task's exec asked for it; the agent holds the next request
// until it is done); otherwise it is reset here first, in the background
// (the caller has its answer already).
func (ws *Workers) release(sh *shape, w core.Sandbox, reset bool) {
	if reset {
		ws.idle(sh, w)
		return
	}
	ws.core.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		agent := w.Agent()
		if agent == nil {
			ws.drop(sh, w)
			return
		}
		var rr agentproto.ResetResult
		if err := agent.Call(ctx, agentproto.OpReset, nil, &rr, nil); err != nil {
			ws.core.Logger().Warn("fncall worker reset failed; dropped", "id", w.ID(), "err", err)
			ws.drop(sh, w)
			return
		}
		ws.idle(sh, w)
	})
}

// idle puts a reset (or resetting) worker in its shape's idle queue, or
// stops it when the queue is full. While the node shuts down, Close stops
// it with every other sandbox.
func (ws *Workers) idle(sh *shape, w core.Sandbox) {
	if ws.core.Closing() {
		return
	}
	select {
	case sh.idle <- w:
	default:
		ws.mu.Lock()
		sh.total--
		ws.mu.Unlock()
		ws.core.Stop(w, "fncall worker not needed")
	}
}

// drop stops a worker that cannot be reused.
func (ws *Workers) drop(sh *shape, w core.Sandbox) {
	ws.mu.Lock()
	sh.total--
	ws.mu.Unlock()
	ws.core.Stop(w, "fncall worker dropped")
}

// run writes the files and runs the command in worker w. ran says the
// exec was sent, with ResetAfter: the agent resets the worker itself.
func (ws *Workers) run(ctx context.Context, w core.Sandbox, c *api.FnCallRequest) (res *api.ExecResult, ran bool, err error) {
	agent := w.Agent()
	if agent == nil {
		return nil, false, &api.Error{Code: api.CodeConflict, Message: "fncall worker is gone"}
	}
	paths := make([]string, 0, len(c.Files))
	for p := range c.Files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if err := agent.Call(ctx, agentproto.OpFileWrite, &agentproto.WriteRequest{Path: p, Data: c.Files[p], Mode: 0o644}, nil, nil); err != nil {
			return nil, false, ws.agentError(w, err)
		}
	}
	ws.core.BeforeCommand(w)
	var out, errb bytes.Buffer
	var ares agentproto.ExecResult
	err = agent.Call(ctx, agentproto.OpExec, execRequest(c), &ares, func(r *agentproto.Response) error {
		if r.Stream == agentproto.StreamStderr {
			errb.Write(r.Data)
		} else {
			out.Write(r.Data)
		}
		return nil
	})
	if err != nil {
		err = ws.agentError(w, err)
		var ae *api.Error
		return nil, !errors.As(err, &ae) || ae.Code != api.CodeUnavailable, err
	}
	out.Write(ares.Stdout)
	errb.Write(ares.Stderr)
	res = &api.ExecResult{
		ExitCode: ares.ExitCode, Stdout: strings.ToValidUTF8(out.String(), "\uFFFD"), Stderr: strings.ToValidUTF8(errb.String(), "\uFFFD"),
		Truncated: ares.Truncated, TimedOut: ares.TimedOut, Signal: ares.Signal, DurationMs: ares.Duration,
	}
	ws.core.AfterCommand(w, res)
	return res, true, nil
}

// execRequest is the agent's exec of task c: collected output, reset after.
func execRequest(c *api.FnCallRequest) *agentproto.ExecRequest {
	timeout := DefaultTimeout
	if c.Timeout > 0 {
		timeout = time.Duration(c.Timeout * float64(time.Second))
	}
	capb := c.OutputCap
	if capb == 0 {
		capb = DefaultOutput
	}
	areq := &agentproto.ExecRequest{Cmd: c.Cmd, Argv: c.Argv, Env: c.Env, Cwd: c.Cwd, Timeout: timeout, OutputCap: capb,
		Collect: true, ResetAfter: true}
	if c.Stdin != "" {
		areq.Stdin = []byte(c.Stdin)
	}
	return areq
}

// agentError is the core's AgentError, with a failed reset as 503: the
// worker carried nothing out and is dropped, and the task goes to another.
func (ws *Workers) agentError(w core.Sandbox, err error) error {
	var ae *agentproto.Error
	if errors.As(err, &ae) && ae.Code == agentproto.ErrUnusable {
		return &api.Error{Code: api.CodeUnavailable, Message: ae.Message}
	}
	return ws.core.AgentError(w, err)
}

// View reports the workers as pools of the node view.
func (ws *Workers) View() []api.NodePool {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var out []api.NodePool
	for _, sh := range ws.shapes {
		out = append(out, api.NodePool{Name: PoolName(sh.spec.Image) + fmt.Sprintf("/%gcpu/%dmb", sh.spec.CPU, sh.spec.MemoryMB), Project: sh.spec.Project, Size: sh.total, Ready: len(sh.idle)})
	}
	return out
}

// Idle lists the spec of every idle worker (core.Reclaimer).
func (ws *Workers) Idle() []*api.CreateSandboxRequest {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	var out []*api.CreateSandboxRequest
	for _, sh := range ws.shapes {
		for range len(sh.idle) {
			out = append(out, &sh.spec)
		}
	}
	return out
}

// ReclaimIdle gives idle workers back to the core while more() wants room
// (core.Reclaimer).
func (ws *Workers) ReclaimIdle(reason string, more func() bool, took func(*api.CreateSandboxRequest)) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, sh := range ws.shapes {
		for more() {
			w := takeIdle(sh)
			if w == nil {
				break
			}
			sh.total--
			ws.core.Reclaim(w, reason)
			took(&sh.spec)
		}
	}
}

// Shrink stops idle workers nobody needs: a shape's surplus over minIdle
// once no task has needed a new worker for idleFor, all of them once no
// task came for idleFor or while the host is under pressure (pressed).
// The reaper calls it.
func (ws *Workers) Shrink(now time.Time, pressed bool) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, sh := range ws.shapes {
		keep := len(sh.idle)
		switch {
		case pressed || now.Sub(sh.lastUsed) > idleFor:
			keep = 0
		case now.Sub(sh.lastGrown) > idleFor:
			keep = min(keep, minIdle)
		}
		for len(sh.idle) > keep {
			w := takeIdle(sh)
			if w == nil {
				break
			}
			sh.total--
			ws.core.Reclaim(w, "fncall worker idle")
		}
	}
}
