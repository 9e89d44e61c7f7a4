package bus

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warrenhq/warren/api"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestAuthRolesWork: with authentication on, each role can do what warren
// needs of it: the edge opens every bucket and stream it uses, serves its
// subject and publishes heartbeats; the apiserver calls the edge and hears
// its heartbeats. Anonymous clients and a server without an auth
// directory are refused.
func TestAuthRolesWork(t *testing.T) {
	dir := t.TempDir()
	if _, err := StartEmbedded(EmbeddedConfig{DataDir: dir}); err == nil {
		t.Fatal("a server without credentials started")
	}
	auth, err := EnsureAuth(filepath.Join(dir, "auth"), []string{"n1", "n2"})
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	srv, err := StartEmbedded(EmbeddedConfig{DataDir: dir, Listen: addr, Auth: auth})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	if nc, err := nats.Connect("nats://" + addr); err == nil {
		nc.Close()
		t.Fatal("anonymous client connected")
	}
	apic, err := srv.Connect("api", RoleAPIServer, "")
	if err != nil {
		t.Fatal(err)
	}
	defer apic.Close()
	edge, err := Dial(DialConfig{URLs: "nats://" + addr, NKeySeed: auth.Path(RoleEdge, "n1"), Role: RoleEdge, Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	defer edge.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if err := apic.EnsureBuckets(ctx); err != nil {
		t.Fatalf("apiserver makes the buckets: %v", err)
	}
	for _, b := range []string{BucketSnapshots, BucketTrajectories} {
		r, err := edge.Records(ctx, b)
		if err != nil {
			t.Fatalf("edge opens %s: %v", b, err)
		}
		if err := r.Put(ctx, "k", map[string]int{"v": 1}); err != nil {
			t.Fatalf("edge writes %s: %v", b, err)
		}
	}
	if _, err := edge.TrajectoryLog(ctx); err != nil {
		t.Fatalf("edge opens the trajectory log: %v", err)
	}
	in, err := edge.TrajectoryInputs(ctx)
	if err != nil {
		t.Fatalf("edge opens the inputs: %v", err)
	}
	if _, err := in.Put(ctx, "k1", []byte("hello")); err != nil {
		t.Fatalf("edge writes an input: %v", err)
	}
	st, err := edge.Storage(ctx)
	if err != nil {
		t.Fatalf("edge opens the storage account: %v", err)
	}
	if err := st.Add(ctx, "p1", 5); err != nil {
		t.Fatalf("edge charges stored bytes: %v", err)
	}
	if b, err := in.Get(ctx, "k1"); err != nil || string(b) != "hello" {
		t.Fatalf("edge reads an input: %q %v", b, err)
	}
	if _, err := edge.OpenLost(ctx); err != nil {
		t.Fatalf("edge opens lost: %v", err)
	}
	ev, err := edge.OpenEvents(ctx)
	if err != nil {
		t.Fatalf("edge opens events: %v", err)
	}
	if err := ev.Publish(ctx, api.Event{Type: "test"}, "t1"); err != nil {
		t.Fatalf("edge publishes an event: %v", err)
	}
	if _, err := edge.KeyValue(ctx, BucketRoster, 0); err != nil {
		t.Fatalf("edge opens the roster: %v", err)
	}
	if _, err := edge.DataPlaneKey(ctx); err != nil {
		t.Fatalf("edge reads the data-plane key: %v", err)
	}

	// The edge cannot make, remove or reconfigure streams: a stream it
	// made could source warren-iam's messages into one it may read.
	js := edge.JetStream()
	short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
	if _, err := js.CreateStream(short, jetstream.StreamConfig{Name: "KV_warren-steal",
		Sources: []*jetstream.StreamSource{{Name: "KV_warren-iam"}}}); err == nil {
		t.Error("the edge created a stream")
	}
	cancelShort()
	short, cancelShort = context.WithTimeout(ctx, 3*time.Second)
	if err := js.DeleteStream(short, "KV_"+BucketRoster); err == nil {
		t.Error("the edge deleted the roster's stream")
	}
	cancelShort()
	if kv, err := edge.KeyValue(ctx, BucketDataPlane, 0); err == nil {
		short, cancelShort := context.WithTimeout(ctx, 3*time.Second)
		if _, err := kv.Put(short, dataPlaneKey, []byte("0123456789abcdef0123")); err == nil {
			t.Error("the edge replaced the data-plane key")
		}
		cancelShort()
	}

	// The apiserver calls the edge (its replies reach the apiserver's inbox).
	if _, err := edge.Serve(ctx, EdgeSubject("n1"), "", func(ctx context.Context, op string, body []byte, w *Replier) (any, error) {
		if !Unscoped(ctx) {
			t.Errorf("a call without a scope carries no root marker")
		}
		return map[string]string{"op": op}, w.Chunk("stdout", []byte("x"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := edge.NATS().Flush(); err != nil {
		t.Fatal(err)
	}
	var out map[string]string
	var chunks int
	if err := apic.Call(ctx, EdgeSubject("n1"), "list", struct{}{}, &out, func(Chunk) error { chunks++; return nil }); err != nil || out["op"] != "list" || chunks != 1 {
		t.Fatalf("apiserver calls the edge: %v %v %d", err, out, chunks)
	}
	if err := apic.Call(ctx, EdgeSubject("n1"), "list", struct{}{}, &out, nil); err != nil {
		t.Fatalf("apiserver calls the edge (shared inbox): %v", err)
	}
	beat := make(chan []byte, 1)
	if _, err := apic.Subscribe(SubjectHeartbeat, func(b []byte) {
		select {
		case beat <- b:
		default:
		}
	}); err != nil {
		t.Fatal(err)
	}
	_ = apic.NATS().Flush()
	if err := edge.Publish(SubjectHeartbeat, "n1"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-beat:
	case <-time.After(10 * time.Second):
		t.Fatal("the apiserver heard no heartbeat")
	}

	// The edge of n1 cannot serve n2's subject, and an apiserver cannot
	// publish heartbeats.
	if err := apic.NATS().Publish(SubjectHeartbeat, []byte(`"n1"`)); err == nil {
		_ = apic.NATS().Flush()
		if le := apic.NATS().LastError(); le == nil || !strings.Contains(strings.ToLower(le.Error()), "permissions violation") {
			t.Errorf("an apiserver published a heartbeat (last error %v)", le)
		}
	}
	if _, err := edge.NATS().Subscribe(EdgeSubject("n2")+".>", func(*nats.Msg) {}); err == nil {
		if err := edge.NATS().Flush(); err == nil {
			if le := edge.NATS().LastError(); le == nil || !strings.Contains(strings.ToLower(le.Error()), "permissions violation") {
				t.Errorf("edge n1 subscribed to n2's subjects (last error %v)", le)
			}
		}
	}
}
