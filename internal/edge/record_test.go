package edge

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/warrenhq/warren/api"
)

// TestWriteRecordInPlace: records shrink and grow in place without a byte
// of an older version left, and a file over a page is left to the caller.
func TestWriteRecordInPlace(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sb.json")
	for _, v := range []string{strings.Repeat("a", 900), "b", strings.Repeat("c", 300), strings.Repeat("d", 4000)} {
		b, _ := json.Marshal(map[string]string{"v": v})
		done, err := writeRecordInPlace(p, b, os.O_CREATE)
		if err != nil || !done {
			t.Fatalf("%d bytes: done=%v err=%v", len(b), done, err)
		}
		var got map[string]string
		raw, _ := os.ReadFile(p)
		if err := json.Unmarshal(raw, &got); err != nil || got["v"] != v {
			t.Fatalf("read back %d bytes: %v %q", len(raw), err, raw)
		}
	}
	if err := os.WriteFile(p, make([]byte, recordPage+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if done, err := writeRecordInPlace(p, []byte("{}"), 0); done || err != nil {
		t.Fatalf("over a page: done=%v err=%v", done, err)
	}
}

// TestSpareRecords: a dropped record's file (inode) serves the next new
// record, and a spare renamed but not yet rewritten (a crash in between)
// is dropped at load rather than taken for the sandbox it now names.
func TestSpareRecords(t *testing.T) {
	e := &Edge{cfg: Config{DataDir: t.TempDir(), Node: "n1"}, log: slog.New(slog.DiscardHandler)}
	if err := os.MkdirAll(e.recordsDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	ino := func(id string) uint64 {
		fi, err := os.Stat(e.recordPath(id))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	rec := func(id string) *record {
		return &record{Sandbox: api.Sandbox{ID: id, Node: "n1", State: api.StateRunning}}
	}
	a, b, c := "sb-n1-aaaaaaaa", "sb-n1-bbbbbbbb", "sb-n1-cccccccc"
	if err := e.persist(rec(a)); err != nil {
		t.Fatal(err)
	}
	first := ino(a)
	e.dropRecord(a)
	if _, err := os.Stat(e.recordPath(a)); !os.IsNotExist(err) {
		t.Fatalf("dropped record still there: %v", err)
	}
	if err := e.persist(rec(b)); err != nil {
		t.Fatal(err)
	}
	if ino(b) != first {
		t.Error("the new record did not reuse the dropped one's file")
	}
	e.dropRecord(b)
	e.takeSpareRecord(e.recordPath(c)) // crash before the write
	recs, err := e.loadRecords()
	if err != nil || len(recs) != 0 {
		t.Fatalf("load: %+v %v", recs, err)
	}
	if ents, _ := os.ReadDir(e.recordsDir()); len(ents) != 0 {
		t.Errorf("left in the records dir: %v", ents)
	}
}
