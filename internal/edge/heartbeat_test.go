package edge_test

import (
	"context"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/edge/edgetest"
	"github.com/warrenhq/warren/internal/watcher"
)

// TestHeartbeatOnRequest: a watcher that subscribes after the edge's
// first heartbeat (the apiserver of `warren serve`, started after its
// edge) learns of the node as soon as it asks for a heartbeat, not a
// period later; without the request it does not within that time.
func TestHeartbeatOnRequest(t *testing.T) {
	n := edgetest.Start(t, func(c *edge.Config) { c.HeartbeatEvery = time.Hour })
	// The edge's first heartbeat goes out as it starts: let it pass (or
	// see that it has) before the watcher subscribes.
	beats := make(chan struct{}, 8)
	sub, err := n.Conn.Subscribe(bus.SubjectHeartbeat, func([]byte) { beats <- struct{}{} })
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-beats:
	case <-time.After(time.Second):
	}
	_ = sub.Unsubscribe()
	w, err := watcher.Start(context.Background(), watcher.Config{Bus: n.Conn})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	known := func(within time.Duration) bool {
		for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if _, up := w.Known(n.Name); up {
				return true
			}
		}
		return false
	}
	if known(300 * time.Millisecond) {
		t.Fatal("the watcher knew the node before any heartbeat after it subscribed (the test proves nothing)")
	}
	n.Edge.Heartbeat()
	n.Edge.Heartbeat() // one pending request at a time: never blocks
	if !known(2 * time.Second) {
		t.Fatal("the watcher did not learn of the node within 2 s of asking for a heartbeat")
	}
}
