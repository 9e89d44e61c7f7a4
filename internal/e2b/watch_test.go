package e2b

import (
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	efs "github.com/warrenhq/warren/api/e2b/filesystem"
)

// TestWatchDiff checks the events between two listings of a watched tree.
func TestWatchDiff(t *testing.T) {
	t0 := time.Unix(100, 0)
	old := watchSnap{
		"/w/a.txt":     {Path: "/w/a.txt", Type: "file", Size: 1, ModTime: t0, Mode: 0o644},
		"/w/b.txt":     {Path: "/w/b.txt", Type: "file", Size: 1, ModTime: t0, Mode: 0o644},
		"/w/sub":       {Path: "/w/sub", Type: "dir", ModTime: t0, Mode: 0o755},
		"/w/gone.txt":  {Path: "/w/gone.txt", Type: "file", Size: 1, ModTime: t0, Mode: 0o644},
		"/w/same.txt":  {Path: "/w/same.txt", Type: "file", Size: 1, ModTime: t0, Mode: 0o644},
		"/w/flip":      {Path: "/w/flip", Type: "file", ModTime: t0},
		"/w/chmod.txt": {Path: "/w/chmod.txt", Type: "file", Size: 1, ModTime: t0, Mode: 0o644},
	}
	cur := watchSnap{
		"/w/a.txt":     {Path: "/w/a.txt", Type: "file", Size: 2, ModTime: t0, Mode: 0o644},                  // grew
		"/w/b.txt":     {Path: "/w/b.txt", Type: "file", Size: 1, ModTime: t0.Add(time.Second), Mode: 0o644}, // rewritten
		"/w/sub":       {Path: "/w/sub", Type: "dir", ModTime: t0.Add(time.Second), Mode: 0o755},             // a dir's mtime is no write
		"/w/sub/new":   {Path: "/w/sub/new", Type: "file", ModTime: t0},
		"/w/same.txt":  {Path: "/w/same.txt", Type: "file", Size: 1, ModTime: t0, Mode: 0o644},
		"/w/flip":      {Path: "/w/flip", Type: "dir", ModTime: t0},
		"/w/chmod.txt": {Path: "/w/chmod.txt", Type: "file", Size: 1, ModTime: t0, Mode: 0o600},
	}
	got := map[string]efs.EventType{}
	for _, ev := range diff("/w", old, cur, true) {
		got[ev.Name] = ev.Type
		if ev.Type != efs.EventType_EVENT_TYPE_REMOVE && ev.Entry == nil {
			t.Fatalf("%s: no entry with includeEntry", ev.Name)
		}
	}
	want := map[string]efs.EventType{
		"a.txt": efs.EventType_EVENT_TYPE_WRITE, "b.txt": efs.EventType_EVENT_TYPE_WRITE,
		"sub/new": efs.EventType_EVENT_TYPE_CREATE, "gone.txt": efs.EventType_EVENT_TYPE_REMOVE,
		"flip": efs.EventType_EVENT_TYPE_CREATE, "chmod.txt": efs.EventType_EVENT_TYPE_CHMOD,
	}
	if len(got) != len(want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("events %v, want %v", got, want)
		}
	}
	if evs := diff("/", watchSnap{}, watchSnap{"/x": api.FileInfo{Path: "/x", Type: "file"}}, false); len(evs) != 1 || evs[0].Name != "x" || evs[0].Entry != nil {
		t.Fatalf("watching /: %v", evs)
	}
}
