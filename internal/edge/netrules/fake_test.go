package netrules

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"testing"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/runtime"
)

// fakeSandbox is a sandbox of the core: its network under its own lock.
type fakeSandbox struct {
	id string

	mu        sync.Mutex
	view      View
	waited    bool
	recorded  []*api.NetworkSpec
	recordErr error
}

func (s *fakeSandbox) ID() string { return s.id }

func (s *fakeSandbox) Wait() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waited = true
}

func (s *fakeSandbox) Network(f func(View, func(*api.NetworkSpec) error) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.view
	if v.Handle != nil {
		h := *v.Handle
		v.Handle = &h
	}
	return f(v, func(n *api.NetworkSpec) error {
		s.view.Spec = n
		s.recorded = append(s.recorded, n)
		return s.recordErr
	})
}

// networked is a running sandbox with a container on a network and the
// egress list egress.
func networked(id string, egress ...string) *fakeSandbox {
	return &fakeSandbox{id: id, view: View{
		Spec:   &api.NetworkSpec{Egress: egress},
		Handle: &runtime.Handle{ID: id, Net: &runtime.NetHandle{Address: "10.0.0.2", Gateway: "10.0.0.1"}},
		State:  api.StateRunning,
	}}
}

// fakeHost is the core: its sandboxes, its goroutines and its log.
type fakeHost struct {
	t       *testing.T
	wg      sync.WaitGroup
	log     bytes.Buffer
	logMu   sync.Mutex
	sbs     []*fakeSandbox
	lookups int
}

func newHost(t *testing.T, sbs ...*fakeSandbox) *fakeHost {
	h := &fakeHost{t: t, sbs: sbs}
	t.Cleanup(h.wg.Wait)
	return h
}

type lockedWriter struct{ h *fakeHost }

func (w lockedWriter) Write(b []byte) (int, error) {
	w.h.logMu.Lock()
	defer w.h.logMu.Unlock()
	return w.h.log.Write(b)
}

func (h *fakeHost) Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(lockedWriter{h}, nil))
}

func (h *fakeHost) logged() string {
	h.logMu.Lock()
	defer h.logMu.Unlock()
	return h.log.String()
}

func (h *fakeHost) Go(f func()) { h.wg.Go(f) }

func (h *fakeHost) Users(names func([]string) bool) []Sandbox {
	var out []Sandbox
	for _, sb := range h.sbs {
		sb.mu.Lock()
		if n := sb.view.Spec; n != nil && names(n.Egress) && sb.view.Handle != nil {
			out = append(out, sb)
		}
		sb.mu.Unlock()
	}
	return out
}

func (h *fakeHost) Lookup(id string) (Sandbox, error) {
	h.lookups++
	for _, sb := range h.sbs {
		if sb.id == id {
			return sb, nil
		}
	}
	return nil, &api.Error{Code: api.CodeNotFound, Message: "sandbox " + id + " not found"}
}

// fakeRuntime sets and reports sandboxes' networks.
type fakeRuntime struct {
	runtime.Runtime

	mu     sync.Mutex
	set    map[string][][]string // handle id -> each list set, as strings
	setErr error

	denied     map[string]int64
	deniedErr  error
	dests      []api.NetworkDenial
	destsErr   error
	reportedOn []string
}

func (r *fakeRuntime) SetEgress(h runtime.Handle, egress []api.EgressRule) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.setErr != nil {
		return r.setErr
	}
	if r.set == nil {
		r.set = map[string][][]string{}
	}
	r.set[h.ID] = append(r.set[h.ID], strs(egress))
	return nil
}

func (r *fakeRuntime) sets(id string) [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.set[id]
}

func (r *fakeRuntime) NetworkDenied(h runtime.Handle) (map[string]int64, error) {
	r.reportedOn = append(r.reportedOn, h.ID)
	return r.denied, r.deniedErr
}

func (r *fakeRuntime) NetworkDeniedDestinations(runtime.Handle) ([]api.NetworkDenial, error) {
	return r.dests, r.destsErr
}

// plainRuntime can neither set nor report a network.
type plainRuntime struct{ runtime.Runtime }

func strs(egress []api.EgressRule) []string {
	out := []string{}
	for _, e := range egress {
		out = append(out, e.String())
	}
	return out
}

// fakeSource is the bucket of rules: its records as they stand, then each
// change sent on changes (done answers when the change was handled).
type fakeSource struct {
	initial []bus.RecordUpdate
	changes chan bus.RecordUpdate
	done    chan struct{}
	err     error // returned at once, before ready
	noReady bool
}

func newSource(initial ...bus.RecordUpdate) *fakeSource {
	return &fakeSource{initial: initial, changes: make(chan bus.RecordUpdate), done: make(chan struct{})}
}

func (s *fakeSource) Watch(ctx context.Context, fn func(bus.RecordUpdate), ready func()) error {
	if s.err != nil {
		return s.err
	}
	for _, u := range s.initial {
		fn(u)
	}
	if !s.noReady {
		ready()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case u := <-s.changes:
			fn(u)
			s.done <- struct{}{}
		}
	}
}

// change hands u to the watch and waits until it was handled.
func (s *fakeSource) change(u bus.RecordUpdate) {
	s.changes <- u
	<-s.done
}

func ruleRec(t *testing.T, nr api.NetworkRule) bus.RecordUpdate {
	t.Helper()
	b, err := json.Marshal(nr)
	if err != nil {
		t.Fatal(err)
	}
	return bus.RecordUpdate{Key: nr.Name, Raw: b}
}

// watched is rules over h and rt, loaded from src; the watch ends with
// the test.
func watched(t *testing.T, h *fakeHost, rt runtime.Runtime, src *fakeSource) *Rules {
	t.Helper()
	r := New(h, rt)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := r.Watch(ctx, src); err != nil {
		t.Fatalf("Watch: %v", err)
	}
	return r
}
