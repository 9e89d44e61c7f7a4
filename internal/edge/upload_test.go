package edge_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"net"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/dataplane"
	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/edge/edgetest"
)

// freeAddr is a loopback address nothing listens on (yet).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// upload sends data to path of sandbox id over the edge's data listener,
// as the apiserver does.
func upload(t *testing.T, n *edgetest.Node, addr, id, path string, data []byte) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key, err := n.Conn.DataPlaneKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(edge.FileRequest{ID: id, Path: path})
	return dataplane.NewClient(key).Do(ctx, &dataplane.Call{Addr: addr, Sandbox: id, Op: edge.OpFileUpload, Body: body,
		Upload: bytes.NewReader(data)}, nil, nil)
}

// TestUploadWritesInParallel: an upload keeps several agent writes in
// flight (each at its offset), so the transfer of one chunk overlaps the
// file write of the one before; the file arrives whole and in order.
func TestUploadWritesInParallel(t *testing.T) {
	addr := freeAddr(t)
	n := edgetest.Start(t, func(c *edge.Config) { c.DataListen = addr })
	sb, err := n.Create(api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	agent := n.Runtime.Agent(sb.ID)
	agent.SetWriteDelay(50 * time.Millisecond)
	data := make([]byte, 40<<20+12345) // ten and a bit chunks
	_, _ = rand.Read(data)
	if err := upload(t, n, addr, sb.ID, "/up/file", data); err != nil {
		t.Fatal(err)
	}
	got, ok := agent.File("/up/file")
	if !ok || !bytes.Equal(got, data) {
		t.Fatalf("uploaded file: %d bytes (found %v), want the %d sent", len(got), ok, len(data))
	}
	if m := agent.MaxWritesInFlight(); m < 2 {
		t.Fatalf("at most %d agent write in flight: the upload waits for each write before sending the next", m)
	}
}

// TestUploadFailedWriteLeavesNothing: a write that fails while others are
// in flight fails the upload; every write is waited for, and neither the
// file nor its temporary name is left.
func TestUploadFailedWriteLeavesNothing(t *testing.T) {
	addr := freeAddr(t)
	n := edgetest.Start(t, func(c *edge.Config) { c.DataListen = addr })
	sb, err := n.Create(api.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	agent := n.Runtime.Agent(sb.ID)
	agent.SetWriteDelay(20 * time.Millisecond)
	agent.FailWritesFrom(4)
	data := make([]byte, 40<<20)
	err = upload(t, n, addr, sb.ID, "/up/file", data)
	if ae := edgetest.APIError(err); ae == nil || ae.Code == "" {
		t.Fatalf("upload with a failing write: %v, want an error answer", err)
	}
	var left api.FileList
	if err := n.Call(edge.OpFileList, edge.FileRequest{ID: sb.ID, Path: "/up"}, &left); err != nil && edgetest.APIError(err) == nil {
		t.Fatal(err)
	}
	for _, f := range left.Files {
		t.Errorf("left after the failed upload: %s", f.Path)
	}
	if _, ok := agent.File("/up/file"); ok {
		t.Fatal("the target exists after a failed upload")
	}
}

// TestUploadTrajectoryRecorded: in a trajectory sandbox an upload's
// writes are recorded steps, one at a time (internal/edge/upload through
// the core's uploadSandbox), then its rename; the file arrives whole.
func TestUploadTrajectoryRecorded(t *testing.T) {
	addr := freeAddr(t)
	n := edgetest.Start(t, func(c *edge.Config) { c.DataListen = addr })
	sb, err := n.Create(api.CreateSandboxRequest{Trajectory: "t/upload-recorded"})
	if err != nil {
		t.Fatal(err)
	}
	// step is the step a write of a small file is recorded as.
	step := func() int64 {
		t.Helper()
		var fi api.FileInfo
		if err := n.Call(edge.OpFileWrite, edge.FileRequest{ID: sb.ID, Path: "/mark", Data: []byte("x")}, &fi); err != nil {
			t.Fatal(err)
		}
		return fi.Step
	}
	agent := n.Runtime.Agent(sb.ID)
	agent.SetWriteDelay(10 * time.Millisecond)
	data := make([]byte, 2<<20+5) // three recorded writes of 1 MiB at most
	_, _ = rand.Read(data)
	before := step()
	if err := upload(t, n, addr, sb.ID, "/up/file", data); err != nil {
		t.Fatal(err)
	}
	if after := step(); after != before+5 {
		t.Fatalf("a write recorded as step %d after the upload, %d before; want the upload's 3 writes and its rename recorded between", after, before)
	}
	got, ok := agent.File("/up/file")
	if !ok || !bytes.Equal(got, data) {
		t.Fatalf("uploaded file: %d bytes (found %v), want the %d sent", len(got), ok, len(data))
	}
	if m := agent.MaxWritesInFlight(); m != 1 {
		t.Fatalf("%d agent writes in flight at once in a trajectory sandbox, want 1", m)
	}
}
