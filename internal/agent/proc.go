package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
)

// Finished background commands are kept (and can be read any number of
// times) until one of these bounds evicts the oldest.
const (
	maxFinished      = 1000
	maxFinishedBytes = 32 << 20 // output held by finished commands
)

// procTable holds background commands.
type procTable struct {
	mu        sync.Mutex
	m         map[string]*bgProc
	doneIDs   []string // finished ids, oldest first
	doneBytes int
}

type bgProc struct {
	id string

	mu             sync.Mutex
	r              *running
	stdout, stderr []byte
	res            *agentproto.ExecResult
	done           chan struct{}
}

func newProcTable() *procTable { return &procTable{m: make(map[string]*bgProc)} }

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return "cmd-" + hex.EncodeToString(b[:])
}

func (t *procTable) add() *bgProc {
	p := &bgProc{id: newID(), done: make(chan struct{})}
	t.mu.Lock()
	t.m[p.id] = p
	t.mu.Unlock()
	return p
}

func (t *procTable) drop(id string) {
	t.mu.Lock()
	delete(t.m, id)
	t.mu.Unlock()
}

func (t *procTable) get(id string) *bgProc {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[id]
}

// finished records p's result and evicts the oldest finished commands beyond
// maxFinished.
func (t *procTable) finished(p *bgProc, res *agentproto.ExecResult) {
	p.mu.Lock()
	p.res = res
	p.mu.Unlock()
	close(p.done)
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.m[p.id]; !ok {
		return
	}
	t.doneIDs = append(t.doneIDs, p.id)
	t.doneBytes += p.size()
	for len(t.doneIDs) > 1 && (len(t.doneIDs) > maxFinished || t.doneBytes > maxFinishedBytes) {
		if old := t.m[t.doneIDs[0]]; old != nil {
			t.doneBytes -= old.size()
		}
		delete(t.m, t.doneIDs[0])
		t.doneIDs = t.doneIDs[1:]
	}
}

func (p *bgProc) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.stdout) + len(p.stderr)
}

func (p *bgProc) started(r *running) {
	p.mu.Lock()
	p.r = r
	p.mu.Unlock()
}

func (p *bgProc) emit(stream string, b []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if stream == agentproto.StreamStdout {
		p.stdout = append(p.stdout, b...)
	} else {
		p.stderr = append(p.stderr, b...)
	}
}

func (p *bgProc) status() *agentproto.ProcStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := &agentproto.ProcStatus{
		CommandID: p.id,
		Stdout:    append([]byte(nil), p.stdout...),
		Stderr:    append([]byte(nil), p.stderr...),
	}
	if p.res == nil {
		st.Running = true
		if p.r != nil {
			st.Duration = float64(time.Since(p.r.start).Microseconds()) / 1000
			for _, o := range p.r.outs {
				o.mu.Lock()
				st.Truncated = st.Truncated || o.truncated
				o.mu.Unlock()
			}
		}
		return st
	}
	code := p.res.ExitCode
	st.ExitCode = &code
	st.Truncated = p.res.Truncated
	st.TimedOut = p.res.TimedOut
	st.Signal = p.res.Signal
	st.Duration = p.res.Duration
	return st
}

// procGet answers a background command's status; with Wait it blocks until
// the command ends or the connection goes away.
func (a *Agent) procGet(ctx context.Context, req *agentproto.ProcRequest) (any, error) {
	p := a.procs.get(req.CommandID)
	if p == nil {
		return nil, errf(agentproto.ErrNotFound, "proc.get: no command %q", req.CommandID)
	}
	if req.Wait {
		select {
		case <-p.done:
		case <-ctx.Done():
			return nil, errf(agentproto.ErrInternal, "proc.get: connection closed")
		}
	}
	return p.status(), nil
}

// procKill signals a running background command's process group.
func (a *Agent) procKill(req *agentproto.ProcRequest) error {
	p := a.procs.get(req.CommandID)
	if p == nil {
		return errf(agentproto.ErrNotFound, "proc.kill: no command %q", req.CommandID)
	}
	sig := unix.SIGKILL
	if req.Signal != 0 {
		if req.Signal < 1 || req.Signal > 64 {
			return errf(agentproto.ErrInvalid, "proc.kill: bad signal %d", req.Signal)
		}
		sig = unix.Signal(req.Signal)
	}
	p.mu.Lock()
	r := p.r
	p.mu.Unlock()
	if r != nil {
		r.kill(sig)
	}
	return nil
}

func killGroup(pid int) error { return unix.Kill(-pid, unix.SIGKILL) }
