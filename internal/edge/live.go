package edge

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/edgeproto"
)

// OpExecLive and ExecLiveRequest: see internal/edgeproto.
const OpExecLive = edgeproto.OpExecLive

// ExecLiveRequest is OpExecLive's request (edgeproto).
type ExecLiveRequest = edgeproto.ExecLiveRequest

// terminalActive is how long a command with live input counts as an
// operation after its last input (issue 21: "a terminal with input in the
// last N seconds"): the sandbox keeps its full CPU, and the idle timer
// restarts, with every keystroke.
const terminalActive = 5 * time.Second

// CheckLive validates an OpExecLive request (edgeproto.CheckLive).
func CheckLive(req *ExecLiveRequest) error { return edgeproto.CheckLive(req) }

// execLive serves OpExecLive.
func (e *Edge) execLive(ctx context.Context, req *ExecLiveRequest, in io.Reader, chunk func(string, []byte) error) (any, error) {
	if err := CheckLive(req); err != nil {
		return nil, err
	}
	x := &req.Exec
	sb, agent, release, err := e.acquire(req.ID)
	if err != nil {
		return nil, err
	}
	if sb.traj != nil {
		release()
		return nil, &api.Error{Code: api.CodeConflict, Message: "a trajectory sandbox records its commands: terminals and live input are not recorded; use exec"}
	}
	// The start counts as input: the CPU is there before the command
	// starts, and stays for terminalActive.
	sb.mu.Lock()
	e.typedLocked(sb)
	sb.mu.Unlock()
	release()
	areq := &agentproto.ExecRequest{
		Cmd: x.Cmd, Argv: x.Argv, Env: x.Env, Cwd: x.Cwd, User: x.User,
		Timeout: time.Duration(x.Timeout * float64(time.Second)), OutputCap: x.OutputCap,
		LiveStdin: req.PTY == nil,
	}
	if areq.OutputCap == 0 {
		areq.OutputCap = MaxOutputCap
	}
	if req.PTY != nil {
		areq.PTY = &agentproto.WinSize{Cols: uint16(req.PTY.Cols), Rows: uint16(req.PTY.Rows)}
	}
	if x.Stdin != "" {
		areq.Stdin = []byte(x.Stdin)
	}
	e.killsBefore(sb)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ids := make(chan uint64, 1)
	// The pump ends with the call: its sends fail once ctx is cancelled,
	// and its read of the upload when the data listener closes it after
	// this handler returned (it is not waited for: that read does not end
	// before).
	go func() {
		select {
		case id := <-ids:
			if err := e.pumpInput(ctx, req.ID, agent, id, in); err != nil {
				e.log.Debug("edge: live input ended", "id", req.ID, "err", err)
				if errors.Is(err, dataplane.ErrBroken) {
					cancel() // the caller went away: so does the command
				}
			}
		case <-ctx.Done():
		}
	}()
	var res agentproto.ExecResult
	start := time.Now()
	err = agent.CallLive(ctx, agentproto.OpExec, areq, &res, func(r *agentproto.Response) error {
		return chunk(r.Stream, r.Data)
	}, func(id uint64) { ids <- id })
	cancel()
	hist := api.ExecRequest{Cmd: x.Cmd, Argv: x.Argv, User: x.User, Cwd: x.Cwd}
	if err != nil {
		err = e.agentError(sb, err)
		sb.hist.Note(&hist, start, nil, err)
		return nil, err
	}
	out := &api.ExecResult{ExitCode: res.ExitCode, Truncated: res.Truncated, TimedOut: res.TimedOut, Signal: res.Signal, DurationMs: res.Duration}
	e.explainEnd(sb, out)
	sb.hist.Note(&hist, start, out, nil)
	return out, nil
}

// pumpInput forwards the input frames of in to the agent's call id, each
// answered before the next is read: the input's flow control reaches from
// the agent's write to the caller. Every frame counts as activity. It ends
// at in's clean end (nil), when in breaks (dataplane.ErrBroken), or when
// the command no longer takes input.
func (e *Edge) pumpInput(ctx context.Context, id string, agent *agentproto.Client, call uint64, in io.Reader) error {
	var buf []byte
	for {
		kind, b, err := dataplane.ReadInput(in, buf)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		buf = b
		ir := &agentproto.InputRequest{Call: call}
		var payload []byte
		switch kind {
		case dataplane.InputData:
			if len(b) == 0 {
				continue
			}
			payload = b
		case dataplane.InputResize:
			var s api.TermSize
			if json.Unmarshal(b, &s) != nil || !s.Valid() {
				continue // the apiserver checks it; a bad one changes nothing
			}
			ir.Resize = &agentproto.WinSize{Cols: uint16(s.Cols), Rows: uint16(s.Rows)}
		case dataplane.InputSignal:
			var s struct {
				Signal int `json:"signal"`
			}
			if json.Unmarshal(b, &s) != nil || s.Signal < 1 || s.Signal > 64 {
				continue
			}
			ir.Signal = s.Signal
		case dataplane.InputEOF:
			ir.EOF = true
		}
		if err := e.sendInput(ctx, id, agent, ir, payload); err != nil {
			return err
		}
	}
}

// sendInput delivers one input as an operation of its own (a paused
// sandbox resumes, the CPU is there first) that also keeps the terminal
// active.
func (e *Edge) sendInput(ctx context.Context, id string, agent *agentproto.Client, ir *agentproto.InputRequest, payload []byte) error {
	sb, _, release, err := e.acquire(id)
	if err != nil {
		return err
	}
	defer release()
	sb.mu.Lock()
	e.typedLocked(sb)
	sb.mu.Unlock()
	if payload != nil && agent.Proto() < agentproto.ProtoPayload {
		ir.Data, payload = payload, nil
	}
	if payload != nil {
		return agent.CallPayload(ctx, agentproto.OpInput, ir, payload, nil, nil)
	}
	return agent.Call(ctx, agentproto.OpInput, ir, nil, nil)
}
