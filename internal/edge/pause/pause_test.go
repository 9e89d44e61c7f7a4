package pause

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/edge/core"
	"github.com/warrenhq/warren/internal/lifetime"
	"github.com/warrenhq/warren/internal/runtime"
)

// fakeCore is the core as pause uses it: a logger and Go.
type fakeCore struct{ wg lifetime.Group }

func (c *fakeCore) Logger() *slog.Logger                       { return slog.Default() }
func (c *fakeCore) Context() context.Context                   { return context.Background() }
func (c *fakeCore) Go(f func())                                { c.wg.Add(1); go func() { defer c.wg.Done(); f() }() }
func (c *fakeCore) Closing() bool                              { return false }
func (c *fakeCore) Room(*api.CreateSandboxRequest) bool        { return true }
func (c *fakeCore) BeforeCommand(core.Sandbox)                 {}
func (c *fakeCore) AfterCommand(core.Sandbox, *api.ExecResult) {}
func (c *fakeCore) AgentError(_ core.Sandbox, err error) error { return err }
func (c *fakeCore) Reclaim(core.Sandbox, string)               {}
func (c *fakeCore) Stop(core.Sandbox, string)                  {}
func (c *fakeCore) StartWorker(context.Context, api.CreateSandboxRequest, core.WorkerOptions) (core.Sandbox, error) {
	return nil, errors.New("no workers here")
}

// fakeSandbox is a record as the core keeps it, with what was persisted.
type fakeSandbox struct {
	id  string
	pmu sync.Mutex

	mu         sync.Mutex
	state      string
	stopping   bool
	pausedAt   *time.Time
	active     bool
	persisted  []string // the state of each Persist
	persistErr error
	holds      int // HoldCPU not yet released
}

func newSandbox(id, state string) *fakeSandbox { return &fakeSandbox{id: id, state: state} }

func (s *fakeSandbox) ID() string                { return s.id }
func (s *fakeSandbox) Agent() *agentproto.Client { return nil }
func (s *fakeSandbox) Ready() bool               { return true }
func (s *fakeSandbox) PauseLock() sync.Locker    { return &s.pmu }
func (s *fakeSandbox) PauseState() (string, bool, runtime.Handle, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state, !s.stopping, runtime.Handle{ID: s.id}, 256
}
func (s *fakeSandbox) MarkPaused() (runtime.Handle, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.state == api.StatePaused:
		return runtime.Handle{}, true, nil
	case s.state != api.StateRunning || s.stopping:
		return runtime.Handle{}, false, &api.Error{Code: api.CodeConflict, Message: "sandbox " + s.id + " is " + s.state}
	}
	s.state = api.StatePaused
	return runtime.Handle{ID: s.id}, false, nil
}
func (s *fakeSandbox) SetRunning(active bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state, s.pausedAt, s.active = api.StateRunning, nil, active
}
func (s *fakeSandbox) HoldCPU() func() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holds++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.holds--
	}
}
func (s *fakeSandbox) SetPausedAt(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pausedAt = &t
}
func (s *fakeSandbox) Persist() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.persistErr != nil {
		return s.persistErr
	}
	p := s.state
	if s.pausedAt != nil {
		p += "+at"
	}
	s.persisted = append(s.persisted, p)
	return nil
}
func (s *fakeSandbox) history() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Join(s.persisted, ",")
}

// fakeRuntime freezes and reclaims, logging each call in order; the state
// its sandbox had persisted at the freeze is logged with it.
type fakeRuntime struct {
	runtime.Runtime // Name, Start, ...: not called
	mu              sync.Mutex
	calls           []string
	freezeErr       error
	sbs             map[string]*fakeSandbox
	unheld          []string // calls made without the sandbox's CPU held
}

// held notes a call made while h's sandbox did not hold its full CPU.
func (f *fakeRuntime) held(h runtime.Handle, call string) {
	sb := f.sbs[h.ID]
	sb.mu.Lock()
	n := sb.holds
	sb.mu.Unlock()
	if n <= 0 {
		f.mu.Lock()
		f.unheld = append(f.unheld, call)
		f.mu.Unlock()
	}
}

func (f *fakeRuntime) log(c string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
}
func (f *fakeRuntime) trace() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.calls, " ")
}
func (f *fakeRuntime) Freeze(_ context.Context, h runtime.Handle) error {
	f.held(h, "freeze")
	f.log("freeze(persisted " + f.sbs[h.ID].history() + ")")
	return f.freezeErr
}
func (f *fakeRuntime) Thaw(context.Context, runtime.Handle) error { f.log("thaw"); return nil }
func (f *fakeRuntime) Reclaim(_ context.Context, h runtime.Handle) (int64, int64, error) {
	f.held(h, "reclaim")
	f.log("reclaim")
	return 100, 10, nil
}
func (f *fakeRuntime) Restore(_ context.Context, h runtime.Handle, mem int64) error {
	f.held(h, "restore")
	f.log(fmt.Sprintf("restore(%d)", mem))
	return nil
}
func (f *fakeRuntime) Prefetch(_ context.Context, _ runtime.Handle, rest bool) (int64, error) {
	if rest {
		f.log("prefetch-rest")
	} else {
		f.log("prefetch-agent")
	}
	return 1, nil
}

func setup(t *testing.T, sbs ...*fakeSandbox) (*Pauser, *fakeRuntime, *fakeCore) {
	rt := &fakeRuntime{sbs: map[string]*fakeSandbox{}}
	for _, sb := range sbs {
		rt.sbs[sb.id] = sb
	}
	c := &fakeCore{}
	t.Cleanup(func() { _ = c.wg.Wait(context.Background()) })
	return New(c, rt), rt, c
}

// TestPauseIntentFirst: the record says paused before the freeze (a crash
// in between is resolved at restart), then the memory is pushed out and
// the pause time recorded; a second pause does nothing.
func TestPauseIntentFirst(t *testing.T) {
	sb := newSandbox("a", api.StateRunning)
	p, rt, _ := setup(t, sb)
	if err := p.Pause(context.Background(), sb, "test"); err != nil {
		t.Fatal(err)
	}
	if got, want := rt.trace(), "freeze(persisted paused) reclaim"; got != want {
		t.Fatalf("runtime calls %q, want %q", got, want)
	}
	if got := sb.history(); got != "paused,paused+at" {
		t.Fatalf("persisted %q", got)
	}
	// The freeze and the reclaim ran with the sandbox's full CPU held (a
	// VM's QEMU writes its memory under the sandbox's gate), released after.
	if len(rt.unheld) != 0 || sb.holds != 0 {
		t.Fatalf("calls without the full CPU held: %v; holds left %d", rt.unheld, sb.holds)
	}
	if err := p.Pause(context.Background(), sb, "again"); err != nil || strings.Count(rt.trace(), "freeze") != 1 {
		t.Fatalf("a second pause: %v, calls %q", err, rt.trace())
	}
}

// TestPauseRefused: a sandbox that does not run is a conflict; a pause
// whose intent cannot be written does not freeze and leaves it running.
func TestPauseRefused(t *testing.T) {
	stopped := newSandbox("s", api.StateStopped)
	broken := newSandbox("b", api.StateRunning)
	broken.persistErr = errors.New("disk full")
	p, rt, _ := setup(t, stopped, broken)
	var ae *api.Error
	if err := p.Pause(context.Background(), stopped, "test"); !errors.As(err, &ae) || ae.Code != api.CodeConflict {
		t.Fatalf("pause of a stopped sandbox: %v, want a conflict", err)
	}
	if err := p.Pause(context.Background(), broken, "test"); err == nil {
		t.Fatal("a pause whose intent was not written succeeded")
	}
	if st, _, _, _ := broken.PauseState(); st != api.StateRunning || rt.trace() != "" {
		t.Fatalf("after a failed intent: state %s, runtime calls %q", st, rt.trace())
	}
}

// TestFreezeFails: a freeze that fails is thawed and the sandbox recorded
// running again.
func TestFreezeFails(t *testing.T) {
	sb := newSandbox("a", api.StateRunning)
	p, rt, _ := setup(t, sb)
	rt.freezeErr = errors.New("freezer timed out")
	if err := p.Pause(context.Background(), sb, "test"); err == nil {
		t.Fatal("a failed freeze succeeded")
	}
	if got, want := rt.trace(), "freeze(persisted paused) thaw"; got != want {
		t.Fatalf("runtime calls %q, want %q", got, want)
	}
	if st, _, _, _ := sb.PauseState(); st != api.StateRunning || sb.history() != "paused,running" || sb.active {
		t.Fatalf("after a failed freeze: state %s, persisted %q, active %v", st, sb.history(), sb.active)
	}
}

// TestResumeOrder: the memory limit comes back and the agent's memory is
// read in before the thaw, the rest after; the sandbox is recorded
// running and active. A running sandbox is left alone.
func TestResumeOrder(t *testing.T) {
	sb := newSandbox("a", api.StatePaused)
	p, rt, c := setup(t, sb)
	if err := p.Resume(context.Background(), sb, true); err != nil {
		t.Fatal(err)
	}
	_ = c.wg.Wait(context.Background())
	if got, want := rt.trace(), "restore(256) prefetch-agent thaw prefetch-rest"; got != want {
		t.Fatalf("runtime calls %q, want %q", got, want)
	}
	if st, _, _, _ := sb.PauseState(); st != api.StateRunning || !sb.active || sb.history() != "running" {
		t.Fatalf("after resume: state %s, active %v, persisted %q", st, sb.active, sb.history())
	}
	if len(rt.unheld) != 0 || sb.holds != 0 {
		t.Fatalf("resume calls without the full CPU held: %v; holds left %d", rt.unheld, sb.holds)
	}
	if err := p.Resume(context.Background(), sb, true); err != nil || strings.Count(rt.trace(), "thaw") != 1 {
		t.Fatalf("resume of a running sandbox: %v, calls %q", err, rt.trace())
	}
}

// TestRefreeze: a sandbox still recorded paused after a restart is frozen
// again without a new intent; one resumed meanwhile is not; frozen is
// called either way.
func TestRefreeze(t *testing.T) {
	paused := newSandbox("a", api.StatePaused)
	resumed := newSandbox("b", api.StateRunning)
	p, rt, _ := setup(t, paused, resumed)
	n := 0
	if err := p.Refreeze(context.Background(), paused, "restart", func() { n++ }); err != nil {
		t.Fatal(err)
	}
	if err := p.Refreeze(context.Background(), resumed, "restart", func() { n++ }); err != nil {
		t.Fatal(err)
	}
	if got, want := rt.trace(), "freeze(persisted ) reclaim"; got != want || n != 2 {
		t.Fatalf("runtime calls %q (want %q), frozen called %d times", got, want, n)
	}
}

// TestMatching: every sandbox is paused, one that cannot be is named with
// its error.
func TestMatching(t *testing.T) {
	var sbs []*fakeSandbox
	var all []core.Pausable
	for i := range 10 {
		sb := newSandbox(fmt.Sprint("s", i), api.StateRunning)
		sbs = append(sbs, sb)
		all = append(all, sb)
	}
	sbs[3].stopping = true
	p, _, _ := setup(t, sbs...)
	out := p.Matching(context.Background(), all, false)
	if len(out.Sandboxes) != 9 || len(out.Errors) != 1 || out.Errors["s3"] == "" {
		t.Fatalf("matching: %+v", out)
	}
	out = p.Matching(context.Background(), all, true)
	if len(out.Sandboxes) != 10 || len(out.Errors) != 0 {
		t.Fatalf("resume matching: %+v", out)
	}
	for _, sb := range sbs[:3] {
		if st, _, _, _ := sb.PauseState(); st != api.StateRunning {
			t.Fatalf("%s is %s after the resume", sb.id, st)
		}
	}
}
