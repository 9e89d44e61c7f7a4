package e2e

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

func waitPoolReady(t *testing.T, s *server, name string, n int) *api.Pool {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		p, err := s.C.Pool(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if p.Ready >= n {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s never got %d ready: %+v\n%s", name, n, p, tail(s.logs.String(), 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestWarmPools(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	p, err := s.C.CreatePool(ctx, api.PoolRequest{Name: "p1", Image: "busybox", CPU: 0.5, MemoryMB: 128, Size: 3})
	if err != nil || p.Name != "p1" || p.Size != 3 || p.Priority != api.PriorityBestEffort {
		t.Fatalf("create pool: %+v %v", p, err)
	}
	waitPoolReady(t, s, "p1", 3)
	// Pool members are nobody's: not listed.
	if l, _ := s.C.List(ctx, warren.ListOptions{}); len(l) != 0 {
		t.Fatalf("pool members listed: %v", l)
	}
	spec := api.CreateSandboxRequest{Image: "busybox", CPU: 0.5, MemoryMB: 128, Labels: map[string]string{"from": "pool"}, TTL: 600}
	t0 := time.Now()
	sb := s.create(t, spec)
	took := time.Since(t0)
	if sb.Pool != "p1" || !strings.HasPrefix(sb.ID, "sb-e2e-") || sb.Labels["from"] != "pool" || sb.TTL != 600 || sb.State != api.StateRunning {
		t.Fatalf("claimed sandbox: %+v", sb)
	}
	t.Logf("create from pool took %v", took)
	if r := s.sh(t, sb.ID, "echo $((6*7)) > /tmp/x; cat /tmp/x; hostname"); r.Stdout != "42\nsandbox\n" {
		t.Fatalf("exec in claimed sandbox: %+v", r)
	}
	if l, _ := s.C.List(ctx, warren.ListOptions{Labels: map[string]string{"from": "pool"}}); len(l) != 1 || l[0].ID != sb.ID {
		t.Fatalf("list: %+v", l)
	}
	// Idempotent creates still hold with pools.
	a, err := s.C.CreateWithKey(ctx, spec, "pool-key-1")
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.C.CreateWithKey(ctx, spec, "pool-key-1")
	if err != nil || b.ID != a.ID {
		t.Fatalf("idempotent pooled create: %v %v %v", a.ID, b, err)
	}
	// A different shape does not match.
	other := s.create(t, api.CreateSandboxRequest{CPU: 0.5, MemoryMB: 128, Env: map[string]string{"A": "1"}})
	if other.Pool != "" {
		t.Fatalf("env'd create came from the pool: %+v", other)
	}
	// Refill, and the node view.
	waitPoolReady(t, s, "p1", 3)
	deadline := time.Now().Add(5 * time.Second)
	for {
		nodes, _ := s.C.Nodes(ctx)
		if len(nodes) == 1 && len(nodes[0].Pools) == 1 && nodes[0].Pools[0].Ready == 3 && nodes[0].SandboxesByState["pooled"] == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node view: %+v", nodes)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// A burst bigger than the pool: all succeed, the pool serves what it has.
	var wg sync.WaitGroup
	var mu sync.Mutex
	fromPool, n := 0, 8
	errs := []error{}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := s.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.5, MemoryMB: 128})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			if sb.Pool != "" {
				fromPool++
			}
			t.Cleanup(func() { _, _ = s.C.Delete(context.Background(), sb.ID) })
		}()
	}
	wg.Wait()
	if len(errs) > 0 || fromPool < 3 {
		t.Fatalf("burst: %d from pool, errors %v", fromPool, errs)
	}

	// Bad requests.
	var ae *api.Error
	for _, bad := range []api.PoolRequest{
		{Name: "p1", Image: "busybox", CPU: 1, Size: 1},        // other shape, same name
		{Name: "Bad_Name", Image: "busybox", Size: 1},          // name
		{Name: "p2", Image: "busybox", Size: -1},               // size
		{Name: "p3", Image: "busybox", Priority: "x", Size: 1}, // priority
	} {
		if _, err := s.C.CreatePool(ctx, bad); !errors.As(err, &ae) || (ae.Code != api.CodeInvalid && ae.Code != api.CodeConflict) {
			t.Errorf("pool %+v: %v", bad, err)
		}
	}
	if _, err := s.C.Pool(ctx, "nope"); !errors.As(err, &ae) || ae.Code != api.CodeNotFound {
		t.Errorf("unknown pool: %v", err)
	}
	if code, _ := s.rawRequest(t, "POST", "/v1/pools", s.Token, []byte(`{"image":"busybox","size":1,"sise":2}`), nil); code != 400 {
		t.Errorf("unknown field: %d", code)
	}

	// The pool definition survives a restart; its members are remade.
	s.kill9()
	s.start()
	waitPoolReady(t, s, "p1", 3)
	if g, err := s.C.Get(ctx, sb.ID); err != nil || g.State != api.StateRunning || g.Pool != "p1" {
		t.Fatalf("claimed sandbox after restart: %+v %v", g, err)
	}
	if r := s.sh(t, sb.ID, "cat /tmp/x"); r.Stdout != "42\n" {
		t.Fatalf("claimed sandbox lost state across restart: %+v", r)
	}
	// Shrink, then delete: members go, claimed sandboxes stay.
	if p, err := s.C.CreatePool(ctx, api.PoolRequest{Name: "p1", Image: "busybox", CPU: 0.5, MemoryMB: 128, Size: 1}); err != nil || p.Size != 1 {
		t.Fatalf("shrink: %+v %v", p, err)
	}
	if _, err := s.C.DeletePool(ctx, "p1"); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.C.Pools(ctx); len(l) != 0 {
		t.Fatalf("pools after delete: %+v", l)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		nodes, _ := s.C.Nodes(ctx)
		if len(nodes) == 1 && nodes[0].SandboxesByState["pooled"] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool members not stopped: %+v", nodes)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r := s.sh(t, sb.ID, "echo still"); r.Stdout != "still\n" {
		t.Fatalf("claimed sandbox after pool delete: %+v", r)
	}
	s.stop()
	assertNoLeaksOf(t, s)
}
