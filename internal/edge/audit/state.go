package audit

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/auditpolicy"
)

// State is one sandbox's audit, kept by the core with its record of the
// sandbox (Sandbox.Audit). The zero value is ready; it must not be copied.
type State struct {
	// ring holds what the sandbox's processes did (and the core added).
	ring Ring
	// policy is the create's audit options, compiled (SetPolicy); nil
	// until the first SetPolicy, which applies nothing.
	policy atomic.Pointer[auditpolicy.Policy]
	// steps are the operations running now that a kill-step hook cancels.
	steps stepCancels
	// stepNow is the trajectory step running now (0: between steps), for
	// the records the core adds (limits, refusals).
	stepNow atomic.Int64
	// trusted are the times its trusted commands ran.
	trusted trustedWindows
	// saveMu is held over one save of a step's records (Node.Save); saved
	// is the seq of the newest record saved with the trajectory.
	saveMu sync.Mutex
	saved  int64
	// cookie names the sandbox to the node's telemetry while its cgroups
	// are registered (0: they are not); under Node.mu.
	cookie uint64
}

// SetPolicy compiles a create's audit options (checked at create: a spec
// that no longer compiles, from an older record, applies nothing).
func (s *State) SetPolicy(spec *api.AuditSpec) {
	p, err := auditpolicy.Compile(spec)
	if err != nil {
		p = &auditpolicy.Policy{}
	}
	s.policy.Store(p)
}

// Reset forgets every record (a pool member claimed by a sandbox: what
// ran while it waited in the pool is nobody's).
func (s *State) Reset() { s.ring.Reset() }

// Enter registers an operation, whose context an audit policy's kill-step
// (or fail-sandbox) hook cancels: the agent then kills its commands.
// leave (always called) unregisters it.
func (s *State) Enter(ctx context.Context) (_ context.Context, leave func()) {
	return s.steps.enter(ctx)
}

// BeginTrusted marks a trusted command starting; EndTrusted marks it
// done. A file operation or connection beside the sandbox's agent
// (telemetry.Record.Beside) while one runs is its own and not recorded.
func (s *State) BeginTrusted() { s.trusted.begin() }

// EndTrusted ends what BeginTrusted began.
func (s *State) EndTrusted() { s.trusted.end() }

// stepCancels are the operations of a sandbox running now, each with the
// cancel of its context. Its mu is a leaf.
type stepCancels struct {
	mu   sync.Mutex
	next int
	m    map[int]context.CancelCauseFunc
}

// errPolicyKill is the cause of an operation cancelled by a kill-step or
// fail-sandbox hook.
var errPolicyKill = errors.New("ended by an audit policy hook")

// enter registers an operation; leave (always called) unregisters it.
func (s *stepCancels) enter(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	s.mu.Lock()
	if s.m == nil {
		s.m = map[int]context.CancelCauseFunc{}
	}
	s.next++
	k := s.next
	s.m[k] = cancel
	s.mu.Unlock()
	return ctx, func() {
		s.mu.Lock()
		delete(s.m, k)
		s.mu.Unlock()
		cancel(nil)
	}
}

// cancelAll cancels every registered operation with errPolicyKill and
// says how many there were.
func (s *stepCancels) cancelAll() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.m {
		c(errPolicyKill)
	}
	return len(s.m)
}

// KilledByPolicy reports whether ctx (of State.Enter) was cancelled by an
// audit policy hook.
func KilledByPolicy(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), errPolicyKill)
}

// trustedWindows are the times a sandbox's trusted commands ran: a file
// operation or connection beside its agent (telemetry.Record.Beside) then
// is the trusted command's own and is not recorded; one at any other time
// is a process the agent started and had not yet moved into work/. Its mu
// is a leaf.
type trustedWindows struct {
	mu      sync.Mutex
	running int
	since   time.Time
	past    [4][2]time.Time // the last windows that ended, [start, end]
	next    int
}

// begin marks a trusted command starting; end marks it done.
func (w *trustedWindows) begin() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running == 0 {
		w.since = time.Now()
	}
	w.running++
}

func (w *trustedWindows) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running--; w.running == 0 {
		w.past[w.next] = [2]time.Time{w.since, time.Now()}
		w.next = (w.next + 1) % len(w.past)
	}
}

// covers reports whether a trusted command ran at t.
func (w *trustedWindows) covers(t time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running > 0 && !t.Before(w.since) {
		return true
	}
	for _, p := range w.past {
		if !p[0].IsZero() && !t.Before(p[0]) && !t.After(p[1]) {
			return true
		}
	}
	return false
}
