package e2e

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

// TestE2BEnvdWatcher drives the polling watcher (CreateWatcher,
// GetWatcherEvents, RemoveWatcher; the Python SDK's sync watch_dir) as
// Connect unary calls: events between polls, recursion, removal, and that
// another project's key reaches no watcher.
func TestE2BEnvdWatcher(t *testing.T) {
	parallel(t)
	e2bAddr := freePort(t)
	s := startServer(t, "--e2b-listen", e2bAddr)
	ctx := context.Background()
	base := "http://" + e2bAddr
	if _, err := s.C.CreateProject(ctx, api.CreateProjectRequest{Name: "wb"}); err != nil {
		t.Fatal(err)
	}
	tk, err := s.C.CreateToken(ctx, api.CreateTokenRequest{Principal: "watch-b", Project: "wb"})
	if err != nil {
		t.Fatal(err)
	}
	a := &e2bClient{base: base, key: s.Token}
	e := a.createEnvd(t, "create", `{"templateID":"busybox"}`, s.C)
	s.sh(t, e.id, "mkdir -p /w/sub && echo old > /w/old.txt")

	w := e.rpc(t, "CreateWatcher", `{"path":"/w","recursive":true,"includeEntry":true}`, 200, "")
	id, _ := w["watcherId"].(string)
	if id == "" {
		t.Fatalf("CreateWatcher: %v", w)
	}
	events := func() map[string]string {
		t.Helper()
		m := e.rpc(t, "GetWatcherEvents", fmt.Sprintf(`{"watcherId":%q}`, id), 200, "")
		out := map[string]string{}
		evs, _ := m["events"].([]any)
		for _, x := range evs {
			ev := x.(map[string]any)
			out[ev["name"].(string)] = ev["type"].(string)
		}
		return out
	}
	if got := events(); len(got) != 0 {
		t.Fatalf("events before any change: %v", got)
	}
	s.sh(t, e.id, "echo new > /w/new.txt; echo deep > /w/sub/d.txt; rm /w/old.txt")
	got := events()
	if got["new.txt"] != "EVENT_TYPE_CREATE" || got["sub/d.txt"] != "EVENT_TYPE_CREATE" || got["old.txt"] != "EVENT_TYPE_REMOVE" || len(got) != 3 {
		t.Fatalf("events: %v", got)
	}
	if got := events(); len(got) != 0 {
		t.Fatalf("events are answered once: %v", got)
	}
	// Another project's key reaches no watcher.
	keyB := "e2b_" + hex.EncodeToString([]byte(tk.Secret))
	other := &envdClient{base: base, id: e.id, token: keyB}
	other.rpc(t, "GetWatcherEvents", fmt.Sprintf(`{"watcherId":%q}`, id), 404, "not_found")
	other.rpc(t, "RemoveWatcher", fmt.Sprintf(`{"watcherId":%q}`, id), 404, "not_found")
	other.rpc(t, "CreateWatcher", `{"path":"/w"}`, 404, "not_found")
	e.rpc(t, "CreateWatcher", `{"path":"/w/new.txt"}`, 400, "invalid_argument")
	e.rpc(t, "CreateWatcher", `{"path":"/nope"}`, 404, "not_found")
	e.rpc(t, "RemoveWatcher", fmt.Sprintf(`{"watcherId":%q}`, id), 200, "")
	if m := e.rpc(t, "GetWatcherEvents", fmt.Sprintf(`{"watcherId":%q}`, id), 404, "not_found"); !strings.Contains(fmt.Sprint(m["message"]), id) {
		t.Fatalf("removed watcher: %v", m)
	}
}
