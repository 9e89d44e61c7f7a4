package edgetest

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/runtime/fake"
)

// Image is the image every Node stores.
const Image = "test-image"

// Node is one edge on the embedded NATS server with the fake runtime, as
// the apiserver sees it: Call sends it requests on the bus. Everything of
// it is removed when the test ends.
type Node struct {
	t        *testing.T
	Name     string
	Bus      *bus.Embedded
	Conn     *bus.Conn // the caller's connection (the apiserver's)
	Runtime  *fake.Runtime
	Images   *Images
	Writable *Writable
	DataDir  string
	Edge     *edge.Edge
	cfg      edge.Config
}

// Start starts a node named n1. edit (optional) changes its config before
// the edge is made; by default it checks no host pressure (the host's
// memory, pids and PSI are not the test's).
func Start(t *testing.T, edit ...func(*edge.Config)) *Node {
	t.Helper()
	dir := t.TempDir()
	// The bus with its real permissions: the edge and the caller connect
	// with their role's credentials, and the caller (as the apiserver)
	// makes the buckets the edge may only open.
	auth, err := bus.EnsureAuth(filepath.Join(dir, "auth"), []string{"n1"})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := bus.StartEmbedded(bus.EmbeddedConfig{DataDir: filepath.Join(dir, "nats"), Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	n := &Node{t: t, Name: "n1", Bus: srv, Runtime: fake.New(), Images: NewImages(filepath.Join(dir, "images")),
		Writable: NewWritable(filepath.Join(dir, "writable")), DataDir: filepath.Join(dir, "data")}
	n.Images.Add(Image, []string{"base"}, "FROM_IMAGE=yes")
	if n.Conn, err = srv.Connect("edgetest-caller", bus.RoleAPIServer, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Conn.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Conn.EnsureBuckets(ctx); err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	if os.Getenv("WARREN_TEST_LOG") != "" {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	n.cfg = edge.Config{
		Node: n.Name, DataDir: n.DataDir, Runtime: n.Runtime, Images: n.Images, Writable: n.Writable, Logger: logger,
		CPUCapacity: 4, MemoryMB: 4096, MaxSandboxes: 100,
		MinDiskAvailableMB: -1, MinMemoryAvailableMB: -1, MaxMemoryPressure: -1, MaxCPUPressure: -1, MinFreeTasks: -1,
		ReaperEvery: 50 * time.Millisecond, HeartbeatEvery: 200 * time.Millisecond, RosterEvery: -1,
	}
	for _, f := range edit {
		f(&n.cfg)
	}
	n.startEdge()
	t.Cleanup(func() {
		if n.Edge != nil {
			n.Stop()
		}
		if ids := n.Runtime.IDs(); len(ids) > 0 {
			t.Errorf("sandboxes left in the runtime after the edge closed: %v", ids)
		}
	})
	return n
}

func (n *Node) startEdge() {
	n.t.Helper()
	conn, err := n.Bus.Connect("edgetest-"+n.Name, bus.RoleEdge, n.Name)
	if err != nil {
		n.t.Fatal(err)
	}
	cfg := n.cfg
	cfg.Bus = conn
	e, err := edge.New(cfg)
	if err != nil {
		conn.Close()
		n.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Start(ctx); err != nil {
		conn.Close()
		n.t.Fatal(err)
	}
	// The edge's subscription reaches the server before any call: a
	// round trip on its connection.
	if err := conn.NATS().Flush(); err != nil {
		n.t.Fatal(err)
	}
	n.Edge = e
	n.t.Cleanup(conn.Close)
}

// Stop closes the edge. A node started with KeepOnShutdown leaves its
// sandboxes running (as an upgrade does; records and sandboxes are what a
// kill -9 leaves too) for Restart to find.
func (n *Node) Stop() {
	n.t.Helper()
	e := n.Edge
	n.Edge = nil
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.Close(ctx); err != nil {
		n.t.Errorf("edge close: %v", err)
	}
}

// Restart starts a new edge on the same data directory and runtime, as
// after a crash or an upgrade: it reconciles what it finds.
func (n *Node) Restart(edit ...func(*edge.Config)) {
	n.t.Helper()
	for _, f := range edit {
		f(&n.cfg)
	}
	n.startEdge()
}

// Call sends op to the node as the apiserver would; headers (optional)
// are the request's (bus.HeaderScope, bus.HeaderSandbox).
func (n *Node) Call(op string, req, out any, headers ...map[string]string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if len(headers) > 0 {
		ctx = bus.WithHeaders(ctx, headers[0])
	}
	return n.Conn.Call(ctx, bus.EdgeSubject(n.Name), op, req, out, nil)
}

// Create creates a sandbox of the test image with spec's other fields.
func (n *Node) Create(spec api.CreateSandboxRequest) (*api.Sandbox, error) {
	if spec.Image == "" {
		spec.Image = Image
	}
	var sb api.Sandbox
	if err := n.Call(edge.OpCreate, &edge.CreateRequest{ID: edge.NewSandboxID(n.Name), Spec: spec}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Get is the sandbox's view.
func (n *Node) Get(id string) (*api.Sandbox, error) {
	var sb api.Sandbox
	if err := n.Call(edge.OpGet, &edge.IDRequest{ID: id}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Delete deletes a sandbox.
func (n *Node) Delete(id string) error {
	return n.Call(edge.OpDelete, &edge.IDRequest{ID: id}, nil)
}

// Exec runs a command in a sandbox (the fake agent's language) and
// collects its output as the apiserver does.
func (n *Node) Exec(id, cmd string) (*api.ExecResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var res api.ExecResult
	var stdout, stderr strings.Builder
	err := n.Conn.Call(ctx, bus.EdgeSubject(n.Name), edge.OpExec, &edge.ExecRequest{ID: id, Exec: api.ExecRequest{Cmd: cmd}}, &res, func(c bus.Chunk) error {
		if c.Stream == "stderr" {
			stderr.Write(c.Data)
		} else {
			stdout.Write(c.Data)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	res.Stdout, res.Stderr = stdout.String(), stderr.String()
	return &res, nil
}

// WaitState waits (up to 20 s: the host may be loaded) until the sandbox
// is in state, and returns its view.
func (n *Node) WaitState(id, state string) *api.Sandbox {
	n.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		sb, err := n.Get(id)
		if err == nil && sb.State == state {
			return sb
		}
		if time.Now().After(deadline) {
			n.t.Fatalf("sandbox %s not %s after 20 s: %+v %v", id, state, sb, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// APIError is err as an *api.Error, nil when it is none.
func APIError(err error) *api.Error {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae
	}
	return nil
}
