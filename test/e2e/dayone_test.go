package e2e

// Regression tests for the bugs a new user hit on the first day (issue 14).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// TestFnCallWorkersYieldToSandboxes: FnCall workers left idle after a burst
// must not keep sandboxes out. A create that needs their room evicts them,
// the burst itself leaves room for sandboxes, and a 503 names the resource
// that is short.
func TestFnCallWorkersYieldToSandboxes(t *testing.T) {
	// 2 cores x 2 = 4 cores to admit.
	s := startServer(t, "--cpu-overcommit", "2")
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.C.FnCall(ctx, api.FnCallRequest{Cmd: "sleep 0.3; echo ok", CPU: 1})
			if err == nil && r.Stdout != "ok\n" {
				err = fmt.Errorf("task answered %+v", r)
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	var failed []string
	for err := range errs {
		if err != nil {
			failed = append(failed, err.Error())
		}
	}
	time.Sleep(time.Second) // the pool's background top-up settles

	// The idle workers give their room to sandboxes: two sandboxes of 2
	// cores fill the node.
	for i := 0; i < 2; i++ {
		s.create(t, api.CreateSandboxRequest{CPU: 2, MemoryMB: 64})
	}
	// The node is full now: the 503 says of what.
	_, err := s.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 1, MemoryMB: 64})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeUnavailable || ae.Reason != api.ReasonCPU || !strings.Contains(ae.Message, "cpu") {
		t.Fatalf("create on a full node: %v (%+v), want 503 with reason cpu", err, ae)
	}
	if len(failed) > 0 {
		t.Fatalf("%d of 8 tasks failed during the burst: %s", len(failed), strings.Join(failed, "; "))
	}
}
