// Package fake is an in-memory sandbox tier for tests that need no root: a
// runtime.Runtime whose sandboxes are fake agents (agent.go) speaking the
// real agent protocol over in-memory pipes. It keeps its sandboxes across
// edges (an edge that is killed and started again finds them, like the
// container tier finds its cgroups), can be told to fail, and lets a test
// kill a sandbox behind the edge's back.
//
// Lock order: Runtime.mu, then Agent.mu (an agent never takes Runtime.mu).
package fake

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sort"
	"sync"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/runtime"
)

// Runtime is the fake tier. The zero value is not usable; call New.
type Runtime struct {
	mu    sync.Mutex
	boxes map[string]*Agent
	pid   int
	// startErr, when set, fails every Start (SetStartErr); wipeErr every
	// Wipe (SetWipeErr).
	startErr, wipeErr       error
	starts, destroys, wipes int
	// classCaps, classReleases, classCapped: the class cap's writes
	// (classcap.go).
	classCaps, classReleases int
	classCapped              bool
}

var (
	_ runtime.Runtime       = (*Runtime)(nil)
	_ runtime.Recycler      = (*Runtime)(nil)
	_ runtime.UsageReporter = (*Runtime)(nil)
)

// New returns an empty fake runtime.
func New() *Runtime { return &Runtime{boxes: map[string]*Agent{}, pid: 1000} }

// Name is the tier's name.
func (r *Runtime) Name() string { return "fake" }

// Start makes a sandbox whose agent serves at once.
func (r *Runtime) Start(ctx context.Context, spec *runtime.Spec) (*runtime.Instance, error) {
	if spec.ID == "" {
		return nil, errors.New("fake: spec without an id")
	}
	r.mu.Lock()
	if r.startErr != nil {
		err := r.startErr
		r.mu.Unlock()
		return nil, err
	}
	if _, dup := r.boxes[spec.ID]; dup {
		r.mu.Unlock()
		return nil, fmt.Errorf("fake: sandbox %s exists", spec.ID)
	}
	r.pid++
	h := runtime.Handle{ID: spec.ID, Pid: r.pid, PidStart: uint64(r.pid), Socket: filepath.Join(spec.StateDir, "agent.sock"), Cgroup: "fake/" + spec.ID}
	a := newAgent(h, spec)
	r.boxes[spec.ID] = a
	r.starts++
	r.mu.Unlock()
	return r.connect(ctx, a)
}

// connect opens a new channel to a's agent and checks that it answers.
func (r *Runtime) connect(ctx context.Context, a *Agent) (*runtime.Instance, error) {
	client, err := a.dial()
	if err != nil {
		return nil, err
	}
	if err := client.Call(ctx, agentproto.OpPing, nil, nil, nil); err != nil {
		_ = client.Close()
		return nil, fmt.Errorf("fake: agent of %s: %w", a.handle.ID, err)
	}
	return &runtime.Instance{Handle: a.handle, Agent: client}, nil
}

// Attach reconnects to a sandbox that still exists.
func (r *Runtime) Attach(ctx context.Context, h runtime.Handle) (*runtime.Instance, error) {
	r.mu.Lock()
	a := r.boxes[h.ID]
	r.mu.Unlock()
	if a == nil || a.handle.Pid != h.Pid {
		return nil, runtime.ErrGone
	}
	if a.Frozen() {
		return nil, fmt.Errorf("fake: sandbox %s is frozen", h.ID)
	}
	return r.connect(ctx, a)
}

// Destroy ends the sandbox (idempotent).
func (r *Runtime) Destroy(ctx context.Context, h runtime.Handle) error {
	r.mu.Lock()
	a := r.boxes[h.ID]
	delete(r.boxes, h.ID)
	r.destroys++
	r.mu.Unlock()
	if a != nil {
		a.kill()
	}
	return nil
}

// Leftovers lists every sandbox this runtime holds.
func (r *Runtime) Leftovers(ctx context.Context) ([]runtime.Handle, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]runtime.Handle, 0, len(r.boxes))
	for _, a := range r.boxes {
		out = append(out, a.handle)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Freeze stops the sandbox's agent from answering until Thaw.
func (r *Runtime) Freeze(ctx context.Context, h runtime.Handle) error {
	a, err := r.get(h)
	if err != nil {
		return err
	}
	a.setFrozen(true)
	return nil
}

// Thaw lets a frozen agent answer again.
func (r *Runtime) Thaw(ctx context.Context, h runtime.Handle) error {
	a, err := r.get(h)
	if err != nil {
		return err
	}
	a.setFrozen(false)
	return nil
}

func (r *Runtime) get(h runtime.Handle) (*Agent, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := r.boxes[h.ID]
	if a == nil {
		return nil, runtime.ErrGone
	}
	return a, nil
}

// Wipe readies a sandbox's container for reuse (its files are forgotten).
func (r *Runtime) Wipe(ctx context.Context, inst *runtime.Instance) error {
	r.mu.Lock()
	r.wipes++
	werr := r.wipeErr
	r.mu.Unlock()
	if werr != nil {
		return fmt.Errorf("%w: %v", runtime.ErrNotReusable, werr)
	}
	a, err := r.get(inst.Handle)
	if err != nil {
		return err
	}
	a.wipe()
	return nil
}

// Reroot gives a wiped sandbox a fresh root.
func (r *Runtime) Reroot(ctx context.Context, inst *runtime.Instance, spec *runtime.Spec) error {
	_, err := r.get(inst.Handle)
	return err
}

// Resume makes a rerooted sandbox serve again with spec's environment.
func (r *Runtime) Resume(ctx context.Context, inst *runtime.Instance, spec *runtime.Spec) error {
	a, err := r.get(inst.Handle)
	if err != nil {
		return err
	}
	a.resume(spec)
	return nil
}

// Usage is nothing: fake sandboxes use no host resources.
func (r *Runtime) Usage() (runtime.Usage, error) { return runtime.Usage{}, nil }

// SetStartErr makes every Start fail with err (nil: succeed again).
func (r *Runtime) SetStartErr(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.startErr = err
}

// SetWipeErr makes every Wipe fail with err, wrapped in
// runtime.ErrNotReusable (nil: succeed again).
func (r *Runtime) SetWipeErr(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.wipeErr = err
}

// Kill ends a sandbox behind its edge's back (its agent's channels close),
// as an OOM kill of its agent or a crash would. It reports whether the
// sandbox existed.
func (r *Runtime) Kill(id string) bool {
	r.mu.Lock()
	a := r.boxes[id]
	delete(r.boxes, id)
	r.mu.Unlock()
	if a != nil {
		a.kill()
	}
	return a != nil
}

// Agent returns the agent of sandbox id, nil when there is none.
func (r *Runtime) Agent(id string) *Agent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.boxes[id]
}

// IDs lists the sandboxes that exist, sorted.
func (r *Runtime) IDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.boxes))
	for id := range r.boxes {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// Counts says how many sandboxes were started, destroyed (calls) and wiped
// (calls) so far.
func (r *Runtime) Counts() (starts, destroys, wipes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts, r.destroys, r.wipes
}

// pipe is a connected pair of in-memory connections (net.Pipe, which has
// no buffer: every write waits for its reader).
func pipe() (client, server net.Conn) { return net.Pipe() }
