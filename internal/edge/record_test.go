package edge

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteRecordInPlace: records shrink and grow in place without a byte
// of an older version left, and a file over a page is left to the caller.
func TestWriteRecordInPlace(t *testing.T) {
	p := filepath.Join(t.TempDir(), "sb.json")
	for _, v := range []string{strings.Repeat("a", 900), "b", strings.Repeat("c", 300), strings.Repeat("d", 4000)} {
		b, _ := json.Marshal(map[string]string{"v": v})
		done, err := writeRecordInPlace(p, b)
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
	if done, err := writeRecordInPlace(p, []byte("{}")); done || err != nil {
		t.Fatalf("over a page: done=%v err=%v", done, err)
	}
}
