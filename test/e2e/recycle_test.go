package e2e

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
)

// recycling is the node's recycling figures once they reach want (the node
// view comes with the heartbeat, every second).
func (s *server) recycling(t *testing.T, want func(api.NodeRecycling) bool) api.NodeRecycling {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		nodes, err := s.C.Nodes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var r api.NodeRecycling
		if len(nodes) == 1 {
			r = nodes[0].Recycling
			if want(r) {
				return r
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("node recycling figures stuck at %+v", r)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRecycledContainer: a sandbox that gets the container of a deleted
// one of the same shape finds nothing of it (files, processes, sessions,
// IPC objects, environment) and is as confined as a fresh one; a
// container that holds connections in TIME_WAIT is destroyed instead.
func TestRecycledContainer(t *testing.T) {
	parallel(t)
	s := startServer(t, "--recycle-idle", "5s")
	ctx := context.Background()
	shape := api.CreateSandboxRequest{CPU: 0.5, MemoryMB: 128}

	first := shape
	first.Env = map[string]string{"FIRST": "secret"}
	a := s.create(t, first)
	probe := s.checkContainment(t, a.ID)
	r := s.sh(t, a.ID, `echo secret > /root/secret; echo x > /tmp/x; echo y > /dev/shm/y; echo z > /dev/z
cd /tmp; export LEFT=over; alias ll=false
/probe ipc make
setsid sleep 1000 >/dev/null 2>&1 < /dev/null &
echo ok`)
	if r.ExitCode != 0 || !strings.HasSuffix(r.Stdout, "ok\n") || !strings.Contains(r.Stdout, "made") {
		t.Fatalf("leave things behind: %+v", r)
	}
	if _, err := s.C.Exec(ctx, a.ID, api.ExecRequest{Cmd: "sleep 1000", Background: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.C.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Kept == 1 && r.Waiting == 1 })

	second := shape
	second.Env = map[string]string{"SECOND": "2"}
	b := s.create(t, second)
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Reused == 1 && r.Waiting == 0 })
	// The deleted sandbox's id reaches nothing of its container's new
	// sandbox.
	if r, err := s.C.Exec(ctx, a.ID, api.ExecRequest{Cmd: "echo reached > /tmp/reached"}); err == nil {
		t.Fatalf("exec on the deleted sandbox: %+v", r)
	}
	if _, err := s.C.WriteFileBytes(ctx, a.ID, "/tmp/reached", []byte("x"), 0o644); err == nil {
		t.Fatal("file write on the deleted sandbox succeeded")
	}
	if _, err := s.C.WriteFileBytes(ctx, b.ID, "/probe", probe, 0o755); err != nil {
		t.Fatal(err)
	}
	r = s.sh(t, b.ID, `ls -A /root /tmp /dev/shm; ls /dev/z 2>&1 | grep -c 'No such'
echo "pwd=$PWD left=$LEFT first=$FIRST second=$SECOND"; alias ll 2>/dev/null | wc -l
ps -o args | grep -c '[s]leep 1000'
/probe ipc count`)
	want := "/dev/shm:\n\n/root:\n\n/tmp:\n1\npwd=/root left= first= second=2\n0\n0\nshm=0 msg=0 sem=0 mq=0\n"
	if r.Stdout != want {
		t.Fatalf("the recycled sandbox sees its predecessor:\n%s\nwant:\n%s\nstderr: %s", r.Stdout, want, r.Stderr)
	}
	s.checkContainment(t, b.ID)

	// Another shape does not get it; a TIME_WAIT connection keeps it from
	// being recycled at all.
	s.sh(t, b.ID, "nc -l -p 7000 >/dev/null & sleep 0.2; echo hi | nc 127.0.0.1 7000; sleep 0.2")
	if _, err := s.C.Delete(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Refused == 1 && r.Waiting == 0 })
	other := shape
	other.MemoryMB = 256
	c := s.create(t, other)
	if _, err := s.C.Delete(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	got := s.recycling(t, func(r api.NodeRecycling) bool { return r.Kept == 2 })
	if got.Reused != 1 || got.Waiting != 1 {
		t.Errorf("recycling after another shape: %+v", got)
	}
	// Unclaimed, it is destroyed after --recycle-idle, with its root.
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Waiting == 0 })
	waitNoLayerMounts(t, s, "after the recycled container expired")
	s.stop()
	assertNoLeaks(t, s)
}

// TestRecycledOtherRoot: a recycled container serves a create with other
// layers (rerooted again) and another image's environment and user.
func TestRecycledOtherRoot(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	a := s.create(t, api.CreateSandboxRequest{})
	s.sh(t, a.ID, "echo old > /root/old")
	if _, err := s.C.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Waiting == 1 })
	b := s.create(t, api.CreateSandboxRequest{DiskMB: 512, User: "nobody", Env: map[string]string{"X": "y"}})
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Reused == 1 })
	r := s.sh(t, b.ID, "id -u; echo $X; ls /root 2>&1 | wc -l; touch /tmp/mine && echo wrote")
	if r.Stdout != "65534\ny\n0\nwrote\n" && r.Stdout != "65534\ny\n1\nwrote\n" {
		t.Fatalf("recycled with another root: %+v", r)
	}
	if fi, err := s.C.Stat(ctx, b.ID, "/root/old"); err == nil {
		t.Fatalf("the old root's file is visible: %+v", fi)
	}
}

// TestRecycleOff: with --recycle 0 every sandbox gets a new container.
func TestRecycleOff(t *testing.T) {
	parallel(t)
	s := startServer(t, "--recycle", "0")
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		sb := s.create(t, api.CreateSandboxRequest{})
		if _, err := s.C.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1500 * time.Millisecond) // a heartbeat
	if got := s.recycling(t, func(api.NodeRecycling) bool { return true }); got != (api.NodeRecycling{}) {
		t.Errorf("recycling with --recycle 0: %+v", got)
	}
}

// TestRecycledAdoptedAfterRestart: a sandbox in a recycled container
// survives a kill -9 of warren like any other (its record names the
// container and its own writable layer), and a waiting container is
// removed as a leftover.
func TestRecycledAdoptedAfterRestart(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	a := s.create(t, api.CreateSandboxRequest{})
	if _, err := s.C.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Waiting == 1 })
	b := s.create(t, api.CreateSandboxRequest{})
	c := s.create(t, api.CreateSandboxRequest{})
	if _, err := s.C.Delete(ctx, c.ID); err != nil {
		t.Fatal(err)
	}
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Reused == 1 && r.Waiting == 1 })
	s.sh(t, b.ID, "echo kept > /root/kept")
	s.kill9()
	s.start()
	if r := s.sh(t, b.ID, "cat /root/kept"); r.Stdout != "kept\n" {
		t.Fatalf("recycled sandbox after the restart: %+v", r)
	}
	if got := s.recycling(t, func(api.NodeRecycling) bool { return true }); got.Waiting != 0 {
		t.Errorf("a waiting container survived the restart: %+v", got)
	}
	if _, err := s.C.Delete(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	s.stop()
	assertNoLeaks(t, s)
}

// TestRecycledContainerDied: a waiting container whose agent died is
// dropped when a create takes it, and the create gets a new container:
// with the same root (resumed) and with another (rerooted first).
func TestRecycledContainerDied(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	for i, req := range []api.CreateSandboxRequest{{}, {DiskMB: 700}} {
		a := s.create(t, api.CreateSandboxRequest{})
		pid := agentPid(t, s, a.ID)
		if _, err := s.C.Delete(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		s.recycling(t, func(r api.NodeRecycling) bool { return r.Waiting == 1 })
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		b := s.create(t, req)
		if r := s.sh(t, b.ID, "echo alive"); r.Stdout != "alive\n" {
			t.Fatalf("case %d: sandbox after a dead recycled container: %+v", i, r)
		}
		if _, err := s.C.Delete(ctx, b.ID); err != nil {
			t.Fatal(err)
		}
	}
	// Kept: the four deletes. Reused: only the second round's first
	// create (the first round's second sandbox's container); the dead
	// ones are not.
	s.recycling(t, func(r api.NodeRecycling) bool { return r.Kept == 4 && r.Reused == 1 && r.Waiting == 1 })
	s.stop()
	assertNoLeaks(t, s)
}
