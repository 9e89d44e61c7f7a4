package microvm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/runtime/runtimetest"
)

// TestUpperTarThawsWhenTheEdgeGoes: the edge goes away (its connection to
// the agent closes) while the agent streams the VM's writable disk for a
// snapshot (OpUpperTar, the disk's filesystem frozen): the guest's disk is
// thawed at once, not when an edge connects again. A guest process that
// writes to the disk and then to the serial console shows it (and that
// the disk is frozen while it is streamed).
func TestUpperTarThawsWhenTheEdgeGoes(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "thaw")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	inst, err := f.rt.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := f.rt.Destroy(context.Background(), inst.Handle); err != nil {
			t.Error(err)
		}
	}()
	console := filepath.Join(spec.StateDir, ConsoleName)
	ticks := func() int {
		b, _ := os.ReadFile(console)
		return strings.Count(string(b), "tick-")
	}
	r, err := runtimetest.Exec(ctx, inst.Agent, "dd if=/dev/zero of=/root/big bs=1M count=64 2>/dev/null; "+
		"(i=0; while :; do i=$((i+1)); echo $i > /root/tick; echo tick-$i > /dev/ttyS0; sleep 0.2; done) </dev/null >/dev/null 2>&1 & echo ok")
	if err != nil || r.Stdout != "ok\n" {
		t.Fatalf("setup: %q %v", r.Stdout, err)
	}
	for deadline := time.Now().Add(20 * time.Second); ticks() < 2; {
		if time.Now().After(deadline) {
			t.Fatal("the guest's ticker does not tick")
		}
		time.Sleep(100 * time.Millisecond)
	}
	first := make(chan struct{})
	var once sync.Once
	go func() {
		t0 := time.Now()
		var bytes int
		err := inst.Agent.CallBulk(ctx, agentproto.OpUpperTar, nil, nil, func(r *agentproto.Response) error {
			bytes += len(r.Data)
			once.Do(func() { close(first) })
			time.Sleep(50 * time.Millisecond) // a slow consumer: the stream lasts seconds
			return nil
		})
		t.Logf("upper.tar: %d bytes in %v: %v", bytes, time.Since(t0), err)
		once.Do(func() { close(first) })
	}()
	select {
	case <-first:
	case <-time.After(60 * time.Second):
		t.Fatal("no chunk of upper.tar")
	}
	// Mid-stream: the disk is frozen, the ticker waits in its write.
	n1 := ticks()
	time.Sleep(1500 * time.Millisecond)
	if n := ticks(); n > n1+1 {
		t.Errorf("the guest wrote to its disk while it was streamed: %d ticks, then %d", n1, n)
	}
	inst.Agent.Close()
	n0 := ticks()
	deadline := time.Now().Add(15 * time.Second)
	for ticks() < n0+3 {
		if time.Now().After(deadline) {
			t.Fatalf("the guest's disk stayed frozen after the edge left: %d ticks then, %d 15 s later", n0, ticks())
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("ticks resumed: %d → %d", n0, ticks())
}
