package fncall

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/edge/core"
)

// fakeCore is a core.Core that records what the workers give back.
type fakeCore struct {
	mu        sync.Mutex
	room      bool
	closing   bool
	reclaimed map[string]string // id -> reason
	stopped   map[string]string
}

func newFakeCore() *fakeCore {
	return &fakeCore{room: true, reclaimed: map[string]string{}, stopped: map[string]string{}}
}

func (c *fakeCore) Logger() *slog.Logger     { return slog.Default() }
func (c *fakeCore) Context() context.Context { return context.Background() }
func (c *fakeCore) Go(f func())              { f() }
func (c *fakeCore) Closing() bool            { c.mu.Lock(); defer c.mu.Unlock(); return c.closing }
func (c *fakeCore) Room(*api.CreateSandboxRequest) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.room
}
func (c *fakeCore) StartWorker(context.Context, api.CreateSandboxRequest, core.WorkerOptions) (core.Sandbox, error) {
	return nil, &api.Error{Code: api.CodeUnavailable, Reason: api.ReasonCPU, Message: "fake: no room"}
}
func (c *fakeCore) Stop(s core.Sandbox, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stopped[s.ID()] = reason
}
func (c *fakeCore) Reclaim(s core.Sandbox, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reclaimed[s.ID()] = reason
}
func (c *fakeCore) BeforeCommand(core.Sandbox)                 {}
func (c *fakeCore) AfterCommand(core.Sandbox, *api.ExecResult) {}
func (c *fakeCore) AgentError(_ core.Sandbox, err error) error { return err }
func (c *fakeCore) reclaimedN() int                            { c.mu.Lock(); defer c.mu.Unlock(); return len(c.reclaimed) }

type fakeSandbox struct {
	id    string
	ready bool
}

func (s *fakeSandbox) ID() string                { return s.id }
func (s *fakeSandbox) Agent() *agentproto.Client { return nil }
func (s *fakeSandbox) Ready() bool               { return s.ready }

// withIdle returns workers with one shape holding n idle (ready) workers.
func withIdle(c core.Core, n int, spec api.CreateSandboxRequest) (*Workers, *shape) {
	ws := New(c)
	sh := &shape{spec: spec, idle: make(chan core.Sandbox, maxWorkers), total: n, lastUsed: time.Now(), lastGrown: time.Now()}
	for i := range n {
		sh.idle <- &fakeSandbox{id: "w" + string(rune('a'+i)), ready: true}
	}
	ws.shapes["k"] = sh
	return ws, sh
}

// TestShrinkKeepsWhatTheShapeNeeds: surplus idle workers go after idleFor
// without growth, all of them without tasks or under pressure.
func TestShrinkKeepsWhatTheShapeNeeds(t *testing.T) {
	spec := api.CreateSandboxRequest{Image: "busybox", CPU: 1, MemoryMB: 256}
	for _, tc := range []struct {
		name        string
		used, grown time.Duration // ago
		pressed     bool
		keep        int
	}{
		{"busy", 0, 0, false, 5},
		{"no growth", 0, idleFor + time.Second, false, minIdle},
		{"no tasks", idleFor + time.Second, idleFor + time.Second, false, 0},
		{"pressure", 0, 0, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newFakeCore()
			ws, sh := withIdle(c, 5, spec)
			now := time.Now()
			sh.lastUsed, sh.lastGrown = now.Add(-tc.used), now.Add(-tc.grown)
			ws.Shrink(now, tc.pressed)
			if len(sh.idle) != tc.keep || sh.total != tc.keep || c.reclaimedN() != 5-tc.keep {
				t.Fatalf("kept %d idle (total %d), reclaimed %d; want %d kept", len(sh.idle), sh.total, c.reclaimedN(), tc.keep)
			}
		})
	}
}

// TestReclaimIdleStopsWhenRoomIsMade: admission takes only the workers it
// needs, and learns each one's spec.
func TestReclaimIdleStopsWhenRoomIsMade(t *testing.T) {
	spec := api.CreateSandboxRequest{Image: "busybox", CPU: 1, MemoryMB: 256}
	c := newFakeCore()
	ws, sh := withIdle(c, 4, spec)
	if got := len(ws.Idle()); got != 4 {
		t.Fatalf("Idle lists %d, want 4", got)
	}
	need := 2.0 // cores
	ws.ReclaimIdle("reclaimed for a sandbox", func() bool { return need > 0 },
		func(s *api.CreateSandboxRequest) { need -= s.CPU })
	if len(sh.idle) != 2 || sh.total != 2 || c.reclaimedN() != 2 {
		t.Fatalf("after reclaiming 2 cores: %d idle, total %d, %d reclaimed", len(sh.idle), sh.total, c.reclaimedN())
	}
	for id, r := range c.reclaimed {
		if r != "reclaimed for a sandbox" {
			t.Fatalf("%s reclaimed with reason %q", id, r)
		}
	}
}

// TestWorkerSkipsStoppedAndWaitsAtTheCap: a task takes an idle worker
// that still runs (forgetting stopped ones), and a shape at its cap makes
// the task wait for a worker rather than start one.
func TestWorkerSkipsStoppedAndWaitsAtTheCap(t *testing.T) {
	spec := api.CreateSandboxRequest{Image: "busybox", CPU: 1, MemoryMB: 256}
	c := newFakeCore()
	ws, sh := withIdle(c, 0, spec)
	sh.total = 2
	sh.idle <- &fakeSandbox{id: "gone"}
	sh.idle <- &fakeSandbox{id: "live", ready: true}
	w, got, err := ws.worker(context.Background(), "k", &spec)
	if err != nil || got != sh || w.ID() != "live" || sh.total != 1 {
		t.Fatalf("worker: %v %v (total %d), want the live one", w, err, sh.total)
	}

	sh.total = maxWorkers
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, _, err = ws.worker(ctx, "k", &spec)
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeTimeout || sh.total != maxWorkers {
		t.Fatalf("at the cap: %v (total %d), want a timeout and no new worker", err, sh.total)
	}

	// Without room in the workers' share, a shape that has workers waits too.
	c.room = false
	sh.total = 1
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	if _, _, err = ws.worker(ctx2, "k", &spec); !errors.As(err, &ae) || ae.Code != api.CodeTimeout {
		t.Fatalf("without room: %v, want a timeout", err)
	}
	// A start admission refuses leaves the shape as it was.
	sh.total = 0
	if _, _, err = ws.worker(context.Background(), "k", &spec); !errors.As(err, &ae) || ae.Code != api.CodeUnavailable || sh.total != 0 {
		t.Fatalf("refused start: %v (total %d), want unavailable and total 0", err, sh.total)
	}
	// Closing: refused at once.
	c.closing = true
	if _, _, err = ws.worker(context.Background(), "k", &spec); !errors.As(err, &ae) || ae.Reason != api.ReasonShuttingDown {
		t.Fatalf("closing: %v, want shutting down", err)
	}
}
