package e2e

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// TestAdmissionDiskByRealSpace: a node admits disk_mb against what its
// scratch filesystem can really hold (× --disk-overcommit), says so in its
// view, and refuses more with a 503 that names disk.
func TestAdmissionDiskByRealSpace(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	once := warren.New(s.URL, s.Token, warren.WithRetry(1, time.Millisecond, time.Millisecond))
	_, err := once.Create(ctx, api.CreateSandboxRequest{Image: "busybox", DiskMB: 4194304})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeUnavailable || !strings.Contains(ae.Message, "disk") {
		t.Fatalf("create of 4 TiB of disk: %v", err)
	}
	code, body := s.rawRequest(t, "POST", "/v1/sandboxes", s.Token, []byte(`{"image":"busybox","disk_mb":4194304}`), nil)
	if code != 503 || !strings.Contains(body, "disk") {
		t.Fatalf("raw create: %d %s", code, body)
	}
	sb := s.create(t, api.CreateSandboxRequest{DiskMB: 512})
	var n api.Node
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		nodes, err := s.C.Nodes(ctx)
		if err != nil || len(nodes) != 1 {
			t.Fatalf("nodes: %v %v", nodes, err)
		}
		if n = nodes[0]; n.DiskRequestedMB >= 512 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("node disk: admits %d MiB (overcommit %g), requested %d MiB, available %d MiB",
		n.DiskMB, n.DiskOvercommit, n.DiskRequestedMB, n.DiskAvailableMB)
	if n.DiskRequestedMB != 512 || n.DiskMB <= 0 || n.DiskAvailableMB <= 0 || n.DiskOvercommit != 10 {
		t.Errorf("node view: %+v", n)
	}
	if _, err := s.C.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
}
