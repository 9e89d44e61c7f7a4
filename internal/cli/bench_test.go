package cli

import (
	"encoding/csv"
	"os"
	"path/filepath"
	"testing"
)

// A run appends its rows to the history; the header is written once.
func TestAppendCSVHistory(t *testing.T) {
	p := filepath.Join(t.TempDir(), "history.csv")
	run := [][]string{{"2026-12-01 18:00", "warren bench", "2 × cpu", "exec round trip `true` p50", "0.80", "ms", "a, note | with \"quotes\""}}
	for i := 0; i < 2; i++ {
		if err := appendCSV(p, run); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[0][0] != "date" || rows[1][6] != run[0][6] || rows[2][3] != run[0][3] {
		t.Fatalf("history: %q", rows)
	}
}
