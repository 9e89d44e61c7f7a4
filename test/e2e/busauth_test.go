package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/warrenhq/warren/api"
)

// permErrs collects the asynchronous permission violations of a connection.
func permErrs() (chan error, nats.Option) {
	ch := make(chan error, 64)
	return ch, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case ch <- err:
		default:
		}
	})
}

func wantViolation(t *testing.T, ch chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		if !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Errorf("%s: want a permissions violation, got %v", what, err)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("%s: allowed (no permissions violation)", what)
	}
}

// TestBusAuth: the NATS server of `warren serve` refuses anonymous
// clients; the edge's credentials reach neither warren-iam nor another
// node's subjects nor the apiserver's replies; and an edge refuses a
// request that carries no scope and no root marker.
func TestBusAuth(t *testing.T) {
	parallel(t)
	natsAddr := freePort(t)
	s := startServer(t, "--nats-listen", natsAddr)
	url := "nats://" + natsAddr
	authDir := filepath.Join(s.dataDir, "nats-auth")

	// 1. No credentials: refused.
	anon, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err == nil {
		t.Errorf("a client without credentials connected")
	} else {
		anon = nil
	}

	// 2. A request without a scope (and without the root marker) is refused
	// by the edge, even from the apiserver's credentials.
	apic := anon // (a server that lets anyone in lets this test in too)
	if apic == nil {
		apiSeed, err := nats.NkeyOptionFromSeed(filepath.Join(authDir, "apiserver.nk"))
		if err != nil {
			t.Fatalf("apiserver credentials: %v", err)
		}
		if apic, err = nats.Connect(url, apiSeed, nats.CustomInboxPrefix("_INBOX_apiserver")); err != nil {
			t.Fatalf("connect with the apiserver's credentials: %v", err)
		}
	}
	defer apic.Close()
	m := nats.NewMsg("warren.edge.e2e.list")
	m.Header.Set("Warren-Op", "list")
	m.Data = []byte(`{}`)
	resp, err := apic.RequestMsg(m, 10*time.Second)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	if kind := resp.Header.Get("Warren-Kind"); kind != "error" {
		t.Errorf("a request without a scope was answered %q: %s", kind, resp.Data)
	} else {
		var e api.Error
		_ = json.Unmarshal(resp.Data, &e)
		if e.Code != api.CodeForbidden {
			t.Errorf("want forbidden, got %+v", e)
		}
	}

	// 3. The edge's credentials.
	checkEdgeCredentials(t, url, filepath.Join(authDir, "edge-e2e.nk"), "e2e")

	// The API still works end to end (the apiserver sets the marker).
	sb := s.create(t, api.CreateSandboxRequest{})
	if r := s.sh(t, sb.ID, "echo ok"); strings.TrimSpace(r.Stdout) != "ok" {
		t.Errorf("exec through the API: %+v", r)
	}
}

// drain empties ch of what arrived so far.
func drain(ch chan error) chan struct{} {
	done := make(chan struct{})
	go func() {
		time.Sleep(500 * time.Millisecond)
		for {
			select {
			case <-ch:
			default:
				close(done)
				return
			}
		}
	}()
	return done
}

// checkEdgeCredentials: the credentials of the edge node (seedFile) reach
// neither warren-iam, nor another node's subjects, nor anyone's replies,
// and cannot send requests to an edge.
func checkEdgeCredentials(t *testing.T, url, seedFile, node string) {
	t.Helper()
	errs, onErr := permErrs()
	seed, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatalf("edge credentials: %v", err)
	}
	edge, err := nats.Connect(url, seed, onErr, nats.CustomInboxPrefix("_INBOX_edge."+node))
	if err != nil {
		t.Fatalf("connect with the edge's credentials: %v", err)
	}
	defer edge.Close()
	js, err := jetstream.New(edge)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if kv, err := js.KeyValue(ctx, "warren-iam"); err == nil {
		if keys, err := kv.ListKeys(ctx); err == nil {
			for k := range keys.Keys() {
				t.Errorf("the edge read warren-iam key %s", k)
				break
			}
		}
	}
	<-drain(errs)
	if err := edge.Publish("$KV.warren-iam.token.forged", []byte(`{"role":"admin"}`)); err == nil {
		wantViolation(t, errs, "edge writes warren-iam")
	}
	if err := edge.Publish("warren.edge.other.list", []byte(`{}`)); err == nil {
		wantViolation(t, errs, "edge publishes to another node")
	}
	if err := edge.Publish("warren.edge."+node+".list", []byte(`{}`)); err == nil {
		wantViolation(t, errs, "edge publishes to its own request subject (as an apiserver)")
	}
	for _, subj := range []string{"_INBOX.>", "_INBOX_apiserver.>", "warren.edge.other.>", ">"} {
		if _, err := edge.SubscribeSync(subj); err == nil {
			_ = edge.Flush()
			wantViolation(t, errs, "edge subscribes to "+subj)
		}
	}

}
