package e2e

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

func TestDiskLimit(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{DiskMB: 16})
	r := s.sh(t, sb.ID, "dd if=/dev/zero of=/big bs=1M count=64 2>&1; echo rc=$?")
	if !strings.Contains(r.Stdout, "rc=1") || !(strings.Contains(r.Stdout, "quota") || strings.Contains(r.Stdout, "space")) {
		t.Fatalf("writing 64 MiB under a 16 MiB disk limit: %q", r.Stdout)
	}
	// The files API reports a full disk as a client-visible error, not a 500.
	_, err := s.C.WriteFileBytes(ctx, sb.ID, "/more", bytes.Repeat([]byte("x"), 2<<20), 0o644)
	if err == nil || warren.StatusOf(err) >= 500 {
		t.Fatalf("write to a full sandbox disk: %v", err)
	}
	// Freeing space makes the sandbox usable again.
	if r := s.sh(t, sb.ID, "rm -f /big /more; echo ok > /small; cat /small"); r.Stdout != "ok\n" {
		t.Fatalf("after freeing space: %+v", r)
	}
}

func TestConcurrentDeleteAndExec(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{})
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "sleep 0.2; echo x"})
			errs <- err
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(100 * time.Millisecond) // let the execs get under way
		_, err := s.C.Delete(ctx, sb.ID)
		if err != nil {
			t.Errorf("delete: %v", err)
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		// Each exec either finished or was told the sandbox stopped: never a 500.
		if err != nil && !warren.IsConflict(err) {
			t.Errorf("exec racing a delete: %v", err)
		}
	}
	got, err := s.C.Get(ctx, sb.ID)
	if err != nil || got.State != api.StateStopped {
		t.Fatalf("after delete: %+v %v", got, err)
	}
	if _, err := s.C.Delete(ctx, sb.ID); err != nil {
		t.Fatalf("a second delete must succeed (idempotent): %v", err)
	}
}

func TestExecAsUser(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	sb := s.create(t, api.CreateSandboxRequest{})
	r, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "id -u; id -g; grep CapEff /proc/self/status", User: "65534"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(r.Stdout, "65534\n") || !strings.Contains(r.Stdout, "CapEff:\t0000000000000000") {
		t.Fatalf("exec as nobody: %q", r.Stdout)
	}
	if r := s.sh(t, sb.ID, "id -u"); r.Stdout != "0\n" {
		t.Fatalf("default user: %q", r.Stdout)
	}
	// The writable layer lies in a directory only the host's root may enter:
	// a user of the sandbox still writes and reads through the overlay.
	r, err = s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo mine > /tmp/u && cat /tmp/u && ls -ln /tmp/u", User: "65534"})
	if err != nil || !strings.HasPrefix(r.Stdout, "mine\n") || !strings.Contains(r.Stdout, " 65534 ") {
		t.Fatalf("write as nobody: %+v %v", r, err)
	}
}
