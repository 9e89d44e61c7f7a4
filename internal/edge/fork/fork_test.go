package fork

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/runtime"
)

type fakeSource struct{ net *runtime.NetHandle }

func (s fakeSource) Handle() runtime.Handle { return runtime.Handle{ID: "sb-n1-src", Net: s.net} }

type fakeChild string

func (c fakeChild) ID() string { return string(c) }

// fakeHost is a core whose source has tier; children named in
// failRecord fail to be recorded and those in failStart to start.
type fakeHost struct {
	tier       string
	net        *runtime.NetHandle // the source's network
	failRecord string
	failStart  string
	held       bool
	recorded   []string
	started    []string
	abandoned  []string
	done       []string
	stopped    []string
}

func (h *fakeHost) Logger() *slog.Logger { return slog.New(slog.DiscardHandler) }
func (h *fakeHost) Node() string         { return "n1" }
func (h *fakeHost) Tier(id string) (string, error) {
	if id != "sb-n1-src" {
		return "", &api.Error{Code: api.CodeNotFound, Message: "sandbox " + id + " not found"}
	}
	return h.tier, nil
}
func (h *fakeHost) Hold(string) (Source, func(), error) {
	h.held = true
	return fakeSource{net: h.net}, func() { h.held = false }, nil
}
func (h *fakeHost) NewChild(_ context.Context, id string, _ Source) (Child, *runtime.Spec, error) {
	h.recorded = append(h.recorded, id)
	if id == h.failRecord {
		return fakeChild(id), nil, &api.Error{Code: api.CodeTooManyRequests, Message: "node full"}
	}
	return fakeChild(id), &runtime.Spec{ID: id}, nil
}
func (h *fakeHost) Start(_ context.Context, c Child, inst *runtime.Instance, _ time.Time) (api.Sandbox, error) {
	if c.ID() == h.failStart {
		return api.Sandbox{}, errors.New("persist failed")
	}
	h.started = append(h.started, c.ID())
	return api.Sandbox{ID: c.ID()}, nil
}
func (h *fakeHost) Abandon(c Child, _ error) { h.abandoned = append(h.abandoned, c.ID()) }
func (h *fakeHost) Done(c Child)             { h.done = append(h.done, c.ID()) }
func (h *fakeHost) Stop(_ context.Context, c Child, _ string) {
	h.stopped = append(h.stopped, c.ID())
}

// fakeRuntime forks (err: fails) and records the instances it destroys.
type fakeRuntime struct {
	runtime.Runtime
	err       error
	destroyed []string
}

func (r *fakeRuntime) Fork(_ context.Context, _ runtime.Handle, specs []*runtime.Spec) ([]*runtime.Instance, error) {
	if r.err != nil {
		return nil, r.err
	}
	out := make([]*runtime.Instance, len(specs))
	for i, s := range specs {
		a, b := net.Pipe()
		_ = b.Close()
		out[i] = &runtime.Instance{Handle: runtime.Handle{ID: s.ID}, Agent: agentproto.NewClient(a)}
	}
	return out, nil
}

func (r *fakeRuntime) Destroy(_ context.Context, h runtime.Handle) error {
	r.destroyed = append(r.destroyed, h.ID)
	return nil
}

// noForkRuntime cannot fork from memory.
type noForkRuntime struct{ runtime.Runtime }

func wantCode(t *testing.T, err error, code string, words ...string) {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != code {
		t.Fatalf("error %v, want an api error %s", err, code)
	}
	for _, w := range words {
		if !strings.Contains(ae.Message, w) {
			t.Fatalf("error %q does not name %q", ae.Message, w)
		}
	}
}

// TestForkRefusals: a fork the request, the tier or the runtime cannot
// make is refused with the reason, before any child is recorded.
func TestForkRefusals(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name     string
		tier     string
		rt       runtime.Runtime
		children []string
		code     string
		words    []string
	}{
		{"no children", api.TierMicroVM, &fakeRuntime{}, nil, api.CodeBadRequest, []string{"at least one child"}},
		{"other node", api.TierMicroVM, &fakeRuntime{}, []string{"sb-n2-a"}, api.CodeInvalid, []string{"sb-n2-a", "node n1"}},
		{"twice", api.TierMicroVM, &fakeRuntime{}, []string{"sb-n1-a", "sb-n1-a"}, api.CodeInvalid, []string{"sb-n1-a"}},
		{"itself", api.TierMicroVM, &fakeRuntime{}, []string{"sb-n1-src"}, api.CodeInvalid, []string{"sb-n1-src"}},
		{"container", "", &fakeRuntime{}, []string{"sb-n1-a"}, api.CodeInvalid, []string{"container sandbox", "disk fork"}},
		{"runtime cannot", api.TierMicroVM, noForkRuntime{}, []string{"sb-n1-a"}, api.CodeInvalid, []string{"microvm sandbox"}},
		{"networked", api.TierMicroVM, &fakeRuntime{}, []string{"sb-n1-a"}, api.CodeInvalid, []string{"has a network", "without \"memory\""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := &fakeHost{tier: c.tier}
			if c.name == "networked" {
				h.net = &runtime.NetHandle{Address: "10.213.0.3", Gateway: "10.213.0.2"}
			}
			_, err := New(h, c.rt).Fork(ctx, &edgeproto.ForkMemoryRequest{ID: "sb-n1-src", Children: c.children})
			wantCode(t, err, c.code, c.words...)
			if len(h.recorded) != 0 || h.held {
				t.Fatalf("a refused fork recorded %v (source held: %v)", h.recorded, h.held)
			}
		})
	}
}

// TestForkWholeOrNothing: a fork starts every child, or undoes every one
// (recorded, started, and the runtime's instances) and says why.
func TestForkWholeOrNothing(t *testing.T) {
	ctx := context.Background()
	kids := []string{"sb-n1-a", "sb-n1-b", "sb-n1-c"}
	req := &edgeproto.ForkMemoryRequest{ID: "sb-n1-src", Children: kids}

	h, rt := &fakeHost{tier: api.TierMicroVM}, &fakeRuntime{}
	out, err := New(h, rt).Fork(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(out.Sandboxes) != 3 || out.Sandboxes[2].ID != "sb-n1-c" || !slices.Equal(h.done, kids) || len(h.abandoned)+len(h.stopped) != 0 || h.held {
		t.Fatalf("fork: %+v done %v abandoned %v stopped %v held %v", out, h.done, h.abandoned, h.stopped, h.held)
	}

	h = &fakeHost{tier: api.TierMicroVM, failRecord: "sb-n1-b"}
	_, err = New(h, &fakeRuntime{}).Fork(ctx, req)
	wantCode(t, err, api.CodeTooManyRequests)
	if !slices.Equal(h.abandoned, []string{"sb-n1-a", "sb-n1-b"}) {
		t.Fatalf("a child that could not be admitted: abandoned %v, want sb-n1-a and sb-n1-b", h.abandoned)
	}

	h = &fakeHost{tier: api.TierMicroVM}
	_, err = New(h, &fakeRuntime{err: fmt.Errorf("qemu: %w", runtime.ErrNoMemoryFork)}).Fork(ctx, req)
	wantCode(t, err, api.CodeInvalid, "sb-n1-src")
	if !slices.Equal(h.abandoned, kids) {
		t.Fatalf("the runtime could not fork: abandoned %v", h.abandoned)
	}

	h = &fakeHost{tier: api.TierMicroVM}
	_, err = New(h, &fakeRuntime{err: errors.New("migrate failed")}).Fork(ctx, req)
	wantCode(t, err, api.CodeUnavailable, "migrate failed")

	h, rt = &fakeHost{tier: api.TierMicroVM, failStart: "sb-n1-b"}, &fakeRuntime{}
	_, err = New(h, rt).Fork(ctx, req)
	if err == nil || !strings.Contains(err.Error(), "persist failed") {
		t.Fatalf("a child that failed to start: %v", err)
	}
	if !slices.Equal(h.stopped, []string{"sb-n1-a"}) || !slices.Equal(h.abandoned, []string{"sb-n1-b", "sb-n1-c"}) || len(h.done) != 0 {
		t.Fatalf("a child failed to start: stopped %v abandoned %v done %v; want sb-n1-a stopped, the others abandoned", h.stopped, h.abandoned, h.done)
	}
	if !slices.Equal(rt.destroyed, []string{"sb-n1-c"}) {
		t.Fatalf("instances destroyed %v, want the one no child took (sb-n1-c)", rt.destroyed)
	}
}
