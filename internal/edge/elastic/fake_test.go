package elastic

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/runtime"
)

// fakeGate is a runtime.CPUGate that records its writes; usage and
// throttled are what Sample answers.
type fakeGate struct {
	sets      []bool
	setErr    error
	sampleErr error
	usage     int64
	throttled int64
	closed    int
}

func (g *fakeGate) Set(full bool) error {
	if g.setErr != nil {
		return g.setErr
	}
	g.sets = append(g.sets, full)
	return nil
}

func (g *fakeGate) Sample() (int64, int64, error) {
	return g.usage, g.throttled, g.sampleErr
}

func (g *fakeGate) Close() error {
	g.closed++
	return nil
}

// level is the last level written (true: full); ok is false before any.
func (g *fakeGate) level() (full, ok bool) {
	if len(g.sets) == 0 {
		return false, false
	}
	return g.sets[len(g.sets)-1], true
}

// fakeGater hands out gates and records the levels asked.
type fakeGater struct {
	gates      []*fakeGate
	full, idle float64
	err        error
}

func (f *fakeGater) CPUGate(_ runtime.Handle, full, idle float64) (runtime.CPUGate, error) {
	if f.err != nil {
		return nil, f.err
	}
	f.full, f.idle = full, idle
	g := &fakeGate{}
	f.gates = append(f.gates, g)
	return g, nil
}

// fakeSandbox is a sandbox of the core: its lock guards everything.
type fakeSandbox struct {
	mu        sync.Mutex
	cpu       CPU
	spec      api.CreateSandboxRequest
	stateless bool
	inflight  int
}

func (s *fakeSandbox) Lock()                           { s.mu.Lock() }
func (s *fakeSandbox) Unlock()                         { s.mu.Unlock() }
func (s *fakeSandbox) CPU() *CPU                       { return &s.cpu }
func (s *fakeSandbox) ID() string                      { return "sb-1" }
func (s *fakeSandbox) Spec() *api.CreateSandboxRequest { return &s.spec }
func (s *fakeSandbox) Stateless() bool                 { return s.stateless }
func (s *fakeSandbox) InFlight() int                   { return s.inflight }

func ptr[T any](v T) *T { return &v }

// newNode is a node with a fake gater, 4 cores and no pressure check.
func newNode() (*Node, *fakeGater) {
	g := &fakeGater{}
	return New(slog.New(slog.DiscardHandler), g, 4, -1), g
}

// opened is a best-effort sandbox of 2 cores, idle_cpu 0.5, whose gate n
// opened (at the idle level).
func opened(t *testing.T, n *Node, g *fakeGater) (*fakeSandbox, *fakeGate) {
	t.Helper()
	s := &fakeSandbox{spec: api.CreateSandboxRequest{CPU: 2, IdleCPU: ptr(0.5), Priority: api.PriorityBestEffort}}
	s.Lock()
	n.OpenLocked(s, runtime.Handle{ID: "sb-1"})
	s.Unlock()
	if len(g.gates) == 0 {
		t.Fatal("no gate opened")
	}
	return s, g.gates[len(g.gates)-1]
}

// full reports s's level as its CPU sees it (under its lock).
func (s *fakeSandbox) full() bool {
	s.Lock()
	defer s.Unlock()
	return s.cpu.full
}

// fakeAgent answers OpProcGet: running for the first runs calls.
type fakeAgent struct {
	mu    sync.Mutex
	runs  int
	calls int
	reqs  []agentproto.ProcRequest
	err   error
	block bool          // a call waits for ctx
	step  chan struct{} // when set, a call answers once given one
	done  chan struct{}
}

func newAgent(runs int) *fakeAgent { return &fakeAgent{runs: runs, done: make(chan struct{})} }

func (a *fakeAgent) Call(ctx context.Context, op string, body any, out any, _ func(*agentproto.Response) error) error {
	if op != agentproto.OpProcGet {
		return errors.New("unexpected op " + op)
	}
	req := body.(*agentproto.ProcRequest)
	a.mu.Lock()
	a.calls++
	a.reqs = append(a.reqs, *req)
	running := a.calls <= a.runs
	err, block, step := a.err, a.block, a.step
	a.mu.Unlock()
	if block {
		<-ctx.Done()
		return ctx.Err()
	}
	if step != nil {
		select {
		case <-step:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err != nil {
		return err
	}
	out.(*agentproto.ProcStatus).Running = running
	return nil
}

func (a *fakeAgent) Done() <-chan struct{} { return a.done }

func (a *fakeAgent) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls
}
