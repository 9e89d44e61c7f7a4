package watcher

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
)

// A silent node that still answers stays up; a silent node that does not
// is marked down, and its sandboxes are recorded lost (for it to destroy
// when it returns) before they are reported.
func TestSilentNodeProbedThenLost(t *testing.T) {
	srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: t.TempDir(), NoAuth: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	conn, err := srv.Connect("watcher-test", bus.RoleAPIServer, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// "alive" serves its subject but stopped heartbeating.
	if _, err := conn.Serve(ctx, bus.EdgeSubject("alive"), "", func(context.Context, string, []byte, *bus.Replier) (any, error) {
		return nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	roster, err := conn.KeyValue(ctx, bus.BucketRoster, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := roster.Put(ctx, "dead", []byte("sb-dead-aaaa p1\nsb-dead-bbbb p2.x\n")); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	shift := time.Duration(0)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return time.Now().Add(shift) }
	w, err := Start(ctx, Config{Bus: conn, CheckEvery: 20 * time.Millisecond, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	hb := time.Now().UTC()
	w.Observe(api.Node{Name: "alive", State: "up", LastHeartbeat: hb})
	w.Observe(api.Node{Name: "dead", State: "up", LastHeartbeat: hb})
	mu.Lock()
	shift = DownAfter + time.Second
	mu.Unlock()

	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, up := w.Known("dead"); !up {
			if _, lost := w.Lost(ctx, "sb-dead-bbbb", "dead"); lost {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("dead node not marked down with its sandboxes lost: %+v", w.Nodes())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// "alive" is probed beside "dead": until its answer arrives it is
	// silent (not up), then up again for good.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, up := w.Known("alive"); up {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a node that answers was marked down: %+v", w.Nodes())
		}
	}
	lk, err := conn.OpenLost(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := lk.Of(ctx, "dead")
	if err != nil || len(got) != 2 || got["sb-dead-aaaa"] != "p1" || got["sb-dead-bbbb"] != "p2.x" {
		t.Fatalf("lost record of dead: %v %v", got, err)
	}
	if none, err := lk.Of(ctx, "alive"); err != nil || len(none) != 0 {
		t.Fatalf("lost record of alive: %v %v", none, err)
	}
	// A watcher that never saw the node down (another replica, restarted)
	// finds the record too.
	w2, err := Start(ctx, Config{Bus: conn})
	if err != nil {
		t.Fatal(err)
	}
	defer w2.Close()
	if p, lost := w2.Lost(ctx, "sb-dead-aaaa", "dead"); !lost || p != "p1" {
		t.Fatalf("lost from the bucket: %q %v", p, lost)
	}
	if _, lost := w2.Lost(ctx, "sb-dead-cccc", "dead"); lost {
		t.Fatal("an id never reported lost is lost")
	}
	// The events are published after the sandboxes are recorded lost.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		evs, err := w.Events().Read(ctx, 0, 100, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, ev := range evs {
			if ev.Type == api.EventSandboxLost && ev.Node == "dead" {
				n++
			}
			if ev.Node == "alive" {
				t.Fatalf("event about the node that answers: %+v", ev)
			}
		}
		if n == 2 {
			break
		}
		if n > 2 || time.Now().After(deadline) {
			t.Fatalf("%d sandbox.lost events, want 2: %+v", n, evs)
		}
	}
}
