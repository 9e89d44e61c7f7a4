package edge_test

// Unit tests of the edge that need no root: the edge runs on the embedded
// NATS server with the fake runtime and the in-memory image store
// (internal/edge/edgetest), and is called on the bus as the apiserver does.

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/edge/edgetest"
	"github.com/warrenhq/warren/internal/runtime"
)

func wantRefusal(t *testing.T, err error, reason, word string) {
	t.Helper()
	ae := edgetest.APIError(err)
	if ae == nil || ae.Code != api.CodeUnavailable || ae.Reason != reason || !strings.Contains(ae.Message, word) {
		t.Fatalf("got %v (%+v), want a %s refusal for %s naming %q", err, ae, api.CodeUnavailable, reason, word)
	}
}

// TestFakeAdmission: a create beyond the node's cpu, memory, disk or
// sandbox count is refused with the short resource named, starts nothing,
// and fits again once a sandbox is gone.
func TestFakeAdmission(t *testing.T) {
	n := edgetest.Start(t, func(c *edge.Config) {
		c.CPUCapacity, c.MemoryMB, c.DiskMB, c.MaxSandboxes = 2, 1024, 2048, 2
	})
	a, err := n.Create(api.CreateSandboxRequest{CPU: 1.5, MemoryMB: 512, DiskMB: 1024})
	if err != nil {
		t.Fatal(err)
	}
	starts, _, _ := n.Runtime.Counts()
	_, err = n.Create(api.CreateSandboxRequest{CPU: 1, MemoryMB: 256, DiskMB: 256})
	wantRefusal(t, err, api.ReasonCPU, "cpu")
	_, err = n.Create(api.CreateSandboxRequest{CPU: 0.5, MemoryMB: 768, DiskMB: 256})
	wantRefusal(t, err, api.ReasonMemory, "memory")
	_, err = n.Create(api.CreateSandboxRequest{CPU: 0.5, MemoryMB: 256, DiskMB: 1536})
	wantRefusal(t, err, api.ReasonDisk, "disk")
	if _, err := n.Create(api.CreateSandboxRequest{CPU: 0.25, MemoryMB: 256, DiskMB: 256}); err != nil {
		t.Fatal(err)
	}
	_, err = n.Create(api.CreateSandboxRequest{CPU: 0.1, MemoryMB: 64, DiskMB: 64})
	wantRefusal(t, err, api.ReasonSandboxes, "sandboxes")
	if s, _, _ := n.Runtime.Counts(); s != starts+1 {
		t.Fatalf("refused creates started sandboxes: %d starts, want %d", s, starts+1)
	}
	if err := n.Delete(a.ID); err != nil {
		t.Fatal(err)
	}
	b, err := n.Create(api.CreateSandboxRequest{CPU: 1, MemoryMB: 512, DiskMB: 1024})
	if err != nil {
		t.Fatalf("after a delete the create must fit: %v", err)
	}
	if res, err := n.Exec(b.ID, "echo admitted"); err != nil || res.Stdout != "admitted\n" {
		t.Fatalf("exec in the admitted sandbox: %+v %v", res, err)
	}
}

// TestFakeFnCallReclaim: idle FnCall workers hold their resources only
// until a create needs them: it stops as many as it must and is admitted.
func TestFakeFnCallReclaim(t *testing.T) {
	n := edgetest.Start(t, func(c *edge.Config) { c.CPUCapacity, c.MemoryMB = 4, 2048 })
	var res api.ExecResult
	if err := n.Call(edge.OpFnCall, &edge.FnCallRequest{Call: api.FnCallRequest{Image: edgetest.Image, Cmd: "echo fn", CPU: 1, MemoryMB: 512}}, &res); err != nil {
		t.Fatal(err)
	}
	if res.ExitCode != 0 || res.Stdout != "fn\n" {
		t.Fatalf("fncall: %+v", res)
	}
	// The shape keeps fnMinIdle (2) idle workers once used: 2 cores, 1 GiB
	// (a worker still starting counts, but is not idle: not reclaimable).
	deadline := time.Now().Add(20 * time.Second)
	for !fnIdle(n, 2) {
		if time.Now().After(deadline) {
			t.Fatalf("after one call: %+v, want 2 idle workers", n.Edge.NodeStatus().Pools)
		}
		time.Sleep(10 * time.Millisecond)
	}
	workers := n.Runtime.IDs()
	// 3.5 cores fit only without both idle workers.
	sb, err := n.Create(api.CreateSandboxRequest{CPU: 3.5, MemoryMB: 1024})
	if err != nil {
		t.Fatalf("a create that fits once the idle workers are reclaimed: %v", err)
	}
	for _, w := range workers {
		for n.Runtime.Agent(w) != nil {
			if time.Now().After(deadline) {
				t.Fatalf("the idle worker %s still runs", w)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// The node is now full: nothing to reclaim, the refusal names cpu.
	_, err = n.Create(api.CreateSandboxRequest{CPU: 1, MemoryMB: 128})
	wantRefusal(t, err, api.ReasonCPU, "cpu")
	if ids := n.Runtime.IDs(); len(ids) != 1 || ids[0] != sb.ID {
		t.Errorf("containers on a full node: %v, want only %s", ids, sb.ID)
	}
	if err := n.Delete(sb.ID); err != nil {
		t.Fatal(err)
	}
}

// TestFakeReaper: a sandbox past its TTL, or idle past its idle timeout,
// is stopped with the reason, and its container destroyed; one in use is
// not reaped for idleness.
func TestFakeReaper(t *testing.T) {
	n := edgetest.Start(t)
	ttl, err := n.Create(api.CreateSandboxRequest{TTL: 1})
	if err != nil {
		t.Fatal(err)
	}
	idle, err := n.Create(api.CreateSandboxRequest{TTL: 3600, IdleTimeout: 1})
	if err != nil {
		t.Fatal(err)
	}
	busy, err := n.Create(api.CreateSandboxRequest{TTL: 3600, IdleTimeout: 1})
	if err != nil {
		t.Fatal(err)
	}
	stopBusy := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stopBusy:
				return
			default:
			}
			_, _ = n.Exec(busy.ID, "sleep 0.2")
		}
	}()
	for _, c := range []struct{ id, reason string }{{ttl.ID, "ttl expired"}, {idle.ID, "idle timeout"}} {
		v := n.WaitState(c.id, api.StateStopped)
		if v.Reason != c.reason {
			t.Errorf("%s stopped for %q, want %q", c.id, v.Reason, c.reason)
		}
		if n.Runtime.Agent(c.id) != nil {
			t.Errorf("%s stopped but its container is still there", c.id)
		}
	}
	close(stopBusy)
	<-done
	if v, err := n.Get(busy.ID); err != nil || v.State != api.StateRunning {
		t.Errorf("a sandbox in use was reaped: %+v %v", v, err)
	}
}

// TestFakeScope: a scoped request reaches only its project's sandboxes
// (another's is 404, as if it did not exist), and a request whose body
// names another sandbox than its header is refused, not carried out on
// the body's.
func TestFakeScope(t *testing.T) {
	n := edgetest.Start(t)
	mine, err := n.Create(api.CreateSandboxRequest{Project: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := n.Create(api.CreateSandboxRequest{Project: "p2"})
	if err != nil {
		t.Fatal(err)
	}
	scoped := func(id string) map[string]string {
		return map[string]string{bus.HeaderScope: "p1", bus.HeaderSandbox: id}
	}
	var v api.Sandbox
	if err := n.Call(edge.OpGet, &edge.IDRequest{ID: mine.ID}, &v, scoped(mine.ID)); err != nil || v.ID != mine.ID {
		t.Fatalf("own sandbox: %+v %v", v, err)
	}
	err = n.Call(edge.OpGet, &edge.IDRequest{ID: theirs.ID}, &v, scoped(theirs.ID))
	if ae := edgetest.APIError(err); ae == nil || ae.Code != api.CodeNotFound {
		t.Fatalf("another project's sandbox: %v, want not_found", err)
	}
	// The header names p1's sandbox (which passes the scope check), the
	// body p2's: the delete must not reach p2's.
	err = n.Call(edge.OpDelete, &edge.IDRequest{ID: theirs.ID}, nil, scoped(mine.ID))
	if ae := edgetest.APIError(err); ae == nil || ae.Code != api.CodeBadRequest {
		t.Fatalf("header/body mismatch: %v, want bad_request", err)
	}
	err = n.Call(edge.OpExec, &edge.ExecRequest{ID: theirs.ID, Exec: api.ExecRequest{Cmd: "true"}}, nil, scoped(mine.ID))
	if ae := edgetest.APIError(err); ae == nil || ae.Code != api.CodeBadRequest {
		t.Fatalf("exec with a header/body mismatch: %v, want bad_request", err)
	}
	if a := n.Runtime.Agent(theirs.ID); a == nil || a.Execs() != 0 {
		t.Fatalf("p2's sandbox was reached: agent %v", a)
	}
	if v, err := n.Get(theirs.ID); err != nil || v.State != api.StateRunning {
		t.Fatalf("p2's sandbox after the refused calls: %+v %v", v, err)
	}
	// A scoped create outside the scope is forbidden.
	err = n.Call(edge.OpCreate, &edge.CreateRequest{ID: edge.NewSandboxID(n.Name), Spec: api.CreateSandboxRequest{Image: edgetest.Image, Project: "p2"}}, nil,
		map[string]string{bus.HeaderScope: "p1"})
	if ae := edgetest.APIError(err); ae == nil || ae.Code != api.CodeForbidden {
		t.Fatalf("scoped create in another project: %v, want forbidden", err)
	}
}

// TestFakeReconcile: after the edge went down (its sandboxes left
// running, as a kill -9 or an upgrade leaves them), the next edge adopts
// the sandboxes that survived, records the one that died while it was
// down as failed, and destroys what it has no record of: a container, a
// writable layer.
func TestFakeReconcile(t *testing.T) {
	n := edgetest.Start(t, func(c *edge.Config) { c.KeepOnShutdown = true })
	alive, err := n.Create(api.CreateSandboxRequest{Project: "p1"})
	if err != nil {
		t.Fatal(err)
	}
	died, err := n.Create(api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n.Stop()
	if ids := n.Runtime.IDs(); len(ids) != 2 {
		t.Fatalf("containers after a stop that keeps them: %v", ids)
	}
	if !n.Runtime.Kill(died.ID) {
		t.Fatalf("no container %s to kill", died.ID)
	}
	ctx := context.Background()
	leftover := edge.NewSandboxID(n.Name)
	inst, err := n.Runtime.Start(ctx, &runtime.Spec{ID: leftover, StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer inst.Agent.Close()
	orphan := edge.NewSandboxID(n.Name)
	if _, err := n.Writable.Alloc(orphan, 0); err != nil {
		t.Fatal(err)
	}

	n.Restart(func(c *edge.Config) { c.KeepOnShutdown = false })
	v, err := n.Get(alive.ID)
	if err != nil || v.State != api.StateRunning || v.Project != "p1" {
		t.Fatalf("the surviving sandbox: %+v %v", v, err)
	}
	if res, err := n.Exec(alive.ID, "echo adopted"); err != nil || res.Stdout != "adopted\n" {
		t.Fatalf("exec in the adopted sandbox: %+v %v", res, err)
	}
	v, err = n.Get(died.ID)
	if err != nil || v.State != api.StateFailed || !strings.Contains(v.Reason, "lost while the edge was down") {
		t.Fatalf("the sandbox that died while the edge was down: %+v %v", v, err)
	}
	if ids := n.Runtime.IDs(); len(ids) != 1 || ids[0] != alive.ID {
		t.Errorf("containers after reconcile: %v, want only %s (the leftover %s destroyed)", ids, alive.ID, leftover)
	}
	layers, err := n.Writable.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(layers) != 1 || layers[0] != alive.ID {
		t.Errorf("writable layers after reconcile: %v, want only %s", layers, alive.ID)
	}
	if h := n.Images.Holders(); len(h) != 1 || h[0] != alive.ID {
		t.Errorf("layer holders after reconcile: %v, want only %s", h, alive.ID)
	}
}

// TestFakePoolClaim: a create of a warm pool's shape in its project takes
// a ready member (no start) under the create's id, the pool fills up
// again, and a create of another shape or project starts its own.
func TestFakePoolClaim(t *testing.T) {
	n := edgetest.Start(t)
	var p api.Pool
	if err := n.Call(edge.OpPoolPut, &api.PoolRequest{Name: "warm", Project: "p1", Image: edgetest.Image, CPU: 0.5, MemoryMB: 256, Size: 2}, &p); err != nil {
		t.Fatal(err)
	}
	waitContainers(t, n, 2)
	waitPoolReady(t, n, "warm", 2) // started is not yet ready to be claimed
	starts, _, _ := n.Runtime.Counts()
	members := n.Runtime.IDs()
	sb, err := n.Create(api.CreateSandboxRequest{Project: "p1", CPU: 0.5, MemoryMB: 256})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Pool != "warm" || sb.State != api.StateRunning {
		t.Fatalf("claim: %+v, want a running sandbox from pool warm", sb)
	}
	if res, err := n.Exec(sb.ID, "echo claimed"); err != nil || res.Stdout != "claimed\n" {
		t.Fatalf("exec in the claimed sandbox: %+v %v", res, err)
	}
	claimedFrom := ""
	for _, m := range members {
		if a := n.Runtime.Agent(m); a != nil && a.Execs() > 0 {
			claimedFrom = m
		}
	}
	if claimedFrom == "" {
		t.Fatalf("the claimed sandbox's exec ran in none of the members %v", members)
	}
	waitContainers(t, n, 3) // the pool fills up again
	if s, _, _ := n.Runtime.Counts(); s != starts+1 {
		t.Errorf("starts after one claim: %d, want %d (the refill only)", s, starts+1)
	}
	for _, spec := range []api.CreateSandboxRequest{
		{Project: "p1", CPU: 1, MemoryMB: 256},   // another shape
		{Project: "p2", CPU: 0.5, MemoryMB: 256}, // another project
	} {
		other, err := n.Create(spec)
		if err != nil {
			t.Fatal(err)
		}
		if other.Pool != "" {
			t.Errorf("create %+v was served from pool %s", spec, other.Pool)
		}
	}
	if s, _, _ := n.Runtime.Counts(); s != starts+3 {
		t.Errorf("starts: %d, want %d", s, starts+3)
	}
}

// fnIdle says whether the node's FnCall workers are want, all idle.
func fnIdle(n *edgetest.Node, want int) bool {
	for _, p := range n.Edge.NodeStatus().Pools {
		if p.Size == want && p.Ready == want {
			return true
		}
	}
	return false
}

// waitPoolReady waits until pool name has want members ready to claim.
func waitPoolReady(t *testing.T, n *edgetest.Node, name string, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var pl api.PoolList
		if err := n.Call(edge.OpPoolList, struct{}{}, &pl); err != nil {
			t.Fatal(err)
		}
		for _, p := range pl.Pools {
			if p.Name == name && p.Ready >= want {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: %+v, want %d ready", name, pl.Pools, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitContainers(t *testing.T, n *edgetest.Node, want int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for len(n.Runtime.IDs()) != want {
		if time.Now().After(deadline) {
			t.Fatalf("containers: %v, want %d", n.Runtime.IDs(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFakeRecycleRefusal: a deleted sandbox's container is kept and reused
// by the next create of its shape; one the runtime refuses to wipe is
// destroyed, counted as refused, and never served again.
func TestFakeRecycleRefusal(t *testing.T) {
	n := edgetest.Start(t, func(c *edge.Config) { c.Recycle = 1 })
	a, err := n.Create(api.CreateSandboxRequest{CPU: 0.5, MemoryMB: 128})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Delete(a.ID); err != nil {
		t.Fatal(err)
	}
	waitRecycling(t, n, func(r api.NodeRecycling) bool { return r.Kept == 1 && r.Waiting == 1 })
	starts, _, _ := n.Runtime.Counts()
	b, err := n.Create(api.CreateSandboxRequest{CPU: 0.5, MemoryMB: 128})
	if err != nil {
		t.Fatal(err)
	}
	if s, _, _ := n.Runtime.Counts(); s != starts {
		t.Fatalf("a create of a kept shape started a container (%d starts, want %d)", s, starts)
	}
	if r := n.Edge.NodeStatus().Recycling; r.Reused != 1 {
		t.Fatalf("recycling after the reuse: %+v", r)
	}
	n.Runtime.SetWipeErr(errors.New("a socket is left in its network namespace"))
	if err := n.Delete(b.ID); err != nil {
		t.Fatal(err)
	}
	waitRecycling(t, n, func(r api.NodeRecycling) bool { return r.Refused == 1 })
	waitContainers(t, n, 0)
	if r := n.Edge.NodeStatus().Recycling; r.Kept != 1 || r.Waiting != 0 {
		t.Fatalf("recycling after a refusal: %+v, want nothing kept", r)
	}
	c, err := n.Create(api.CreateSandboxRequest{CPU: 0.5, MemoryMB: 128})
	if err != nil {
		t.Fatal(err)
	}
	if s, _, _ := n.Runtime.Counts(); s != starts+1 || n.Runtime.Agent(c.ID) == nil {
		t.Fatalf("after a refusal the next create must start its own container: %d starts, want %d", s, starts+1)
	}
}

func waitRecycling(t *testing.T, n *edgetest.Node, ok func(api.NodeRecycling) bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !ok(n.Edge.NodeStatus().Recycling) {
		if time.Now().After(deadline) {
			t.Fatalf("recycling: %+v", n.Edge.NodeStatus().Recycling)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFakeStartFailure: a sandbox that fails to start is a 503 that holds
// nothing: no container, writable layer, layer mount or capacity.
func TestFakeStartFailure(t *testing.T) {
	n := edgetest.Start(t, func(c *edge.Config) { c.CPUCapacity = 1 })
	n.Runtime.SetStartErr(errors.New("no agent"))
	_, err := n.Create(api.CreateSandboxRequest{CPU: 1})
	if ae := edgetest.APIError(err); ae == nil || ae.Code != api.CodeUnavailable || !strings.Contains(ae.Message, "no agent") {
		t.Fatalf("a failed start: %v, want unavailable naming the cause", err)
	}
	if layers, _ := n.Writable.List(); len(layers) != 0 {
		t.Errorf("writable layers after a failed start: %v", layers)
	}
	if h := n.Images.Holders(); len(h) != 0 {
		t.Errorf("layer holders after a failed start: %v", h)
	}
	n.Runtime.SetStartErr(nil)
	if _, err := n.Create(api.CreateSandboxRequest{CPU: 1}); err != nil {
		t.Fatalf("the failed start still holds capacity: %v", err)
	}
}

// TestFakeAgentDies: a sandbox whose agent goes away behind the edge's
// back is failed with the reason, and what it held is freed.
func TestFakeAgentDies(t *testing.T) {
	n := edgetest.Start(t)
	sb, err := n.Create(api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	n.Runtime.Kill(sb.ID)
	v := n.WaitState(sb.ID, api.StateFailed)
	if !strings.Contains(v.Reason, "agent exited") {
		t.Errorf("reason %q", v.Reason)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		layers, _ := n.Writable.List()
		if len(layers) == 0 && len(n.Images.Holders()) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the agent died: writable %v, holders %v", layers, n.Images.Holders())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestFakePause: a paused sandbox's processes are frozen and its record
// says paused; any operation resumes it first, and an idle timeout with
// the pause action pauses rather than stops.
func TestFakePause(t *testing.T) {
	n := edgetest.Start(t)
	sb, err := n.Create(api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var v api.Sandbox
	if err := n.Call(edge.OpPause, &edge.ResumeSandboxRequest{ID: sb.ID}, &v); err != nil || v.State != api.StatePaused {
		t.Fatalf("pause: %+v %v", v, err)
	}
	if !n.Runtime.Agent(sb.ID).Frozen() {
		t.Fatal("a paused sandbox's agent is not frozen")
	}
	if res, err := n.Exec(sb.ID, "echo awake"); err != nil || res.Stdout != "awake\n" {
		t.Fatalf("exec in a paused sandbox: %+v %v", res, err)
	}
	if n.Runtime.Agent(sb.ID).Frozen() {
		t.Fatal("the exec did not thaw the sandbox")
	}
	if v, err := n.Get(sb.ID); err != nil || v.State != api.StateRunning {
		t.Fatalf("after the exec: %+v %v", v, err)
	}
	idle, err := n.Create(api.CreateSandboxRequest{IdleTimeout: 1, IdleTimeoutAction: api.IdleActionPause})
	if err != nil {
		t.Fatal(err)
	}
	n.WaitState(idle.ID, api.StatePaused)
	// The record says paused before the freeze (so that a crash in
	// between is resolved at restart: pause.go); the freeze follows.
	for deadline := time.Now().Add(5 * time.Second); !n.Runtime.Agent(idle.ID).Frozen(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("paused for idleness but not frozen")
		}
	}
}
