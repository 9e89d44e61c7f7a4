package edge_test

import (
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/edge/edgetest"
)

// TestFakeClassCap: the best-effort class is capped with one write when
// the first latency-class operation starts and released with one when the
// last ends, however many overlap; best-effort operations, and latency
// ones before any best-effort sandbox exists, write nothing; a node with
// the cap off never writes.
func TestFakeClassCap(t *testing.T) {
	n := edgetest.Start(t)
	lat, err := n.Create(api.CreateSandboxRequest{CPU: 1, Priority: api.PriorityLatency})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Exec(lat.ID, "true"); err != nil {
		t.Fatal(err)
	}
	if c, r, _ := n.Runtime.ClassWrites(); c != 0 || r != 0 {
		t.Errorf("no best-effort sandbox: %d caps, %d releases", c, r)
	}
	be, err := n.Create(api.CreateSandboxRequest{CPU: 1, Priority: api.PriorityBestEffort})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Exec(be.ID, "true"); err != nil {
		t.Fatal(err)
	}
	if c, r, _ := n.Runtime.ClassWrites(); c != 0 || r != 0 {
		t.Errorf("a best-effort operation wrote: %d caps, %d releases", c, r)
	}
	var wg sync.WaitGroup
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := n.Exec(lat.ID, "sleep 0.6"); err != nil {
				t.Error(err)
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if c, r, capped := n.Runtime.ClassWrites(); c != 1 || r != 0 || !capped {
		t.Errorf("during 3 latency operations: %d caps, %d releases, capped %v; want 1, 0, true", c, r, capped)
	}
	if el := n.Edge.NodeStatus().Elastic; !el.ClassCapped || el.ClassCaps != 1 {
		t.Errorf("node view during: %+v", el)
	}
	wg.Wait()
	if c, r, capped := n.Runtime.ClassWrites(); c != 1 || r != 1 || capped {
		t.Errorf("after: %d caps, %d releases, capped %v; want 1, 1, false", c, r, capped)
	}
	if el := n.Edge.NodeStatus().Elastic; el.ClassCapped || el.ClassCaps != 1 || el.ClassReleases != 1 {
		t.Errorf("node view after: %+v", el)
	}

	off := edgetest.Start(t, func(c *edge.Config) { c.BestEffortCap = -1 })
	l2, err := off.Create(api.CreateSandboxRequest{CPU: 1, Priority: api.PriorityLatency})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := off.Create(api.CreateSandboxRequest{CPU: 1, Priority: api.PriorityBestEffort}); err != nil {
		t.Fatal(err)
	}
	if _, err := off.Exec(l2.ID, "true"); err != nil {
		t.Fatal(err)
	}
	if c, r, _ := off.Runtime.ClassWrites(); c != 0 || r > 1 {
		t.Errorf("cap off: %d caps, %d releases", c, r)
	}
}
