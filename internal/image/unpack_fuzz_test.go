package image

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// FuzzUnpack feeds arbitrary archives to the extractor. Whatever it
// accepts or rejects, nothing outside the layer root may change. `go test`
// runs the seeds; `go test -fuzz FuzzUnpack ./internal/image` explores.
func FuzzUnpack(f *testing.F) {
	if os.Geteuid() != 0 {
		f.Skip("SKIP: needs root")
	}
	outside := f.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("safe"), 0o644); err != nil {
		f.Fatal(err)
	}
	seeds := [][]ent{
		{dirE("./"), dirE("a/"), fileE("a/b", "hello"), symE("a/l", "b"), hardE("a/h", "a/b")},
		{fileE("../escape", "x")},
		{fileE(outside+"/abs", "x")},
		{symE("l", outside), fileE("l/evil", "x")},
		{symE("l", "../../"+outside), dirE("l/d/")},
		{symE("f", victim), fileE("f", "replaced")},
		{hardE("h", "../victim")},
		{symE("l", outside), hardE("h", "l/victim")},
		{dirE("d/"), fileE("d/.wh..wh..opq", ""), fileE("d/.wh.gone", ""), fileE(".wh..wh.plnk", "")},
		{modeE(fileE("su", "x"), 0o4755), {name: "fifo", typ: '6', mode: 0o600}, {name: "null", typ: '3', mode: 0o666}},
		{fileE("x", "1"), dirE("x/"), fileE("x", "2")},
		{xattrE(fileE("x", ""), "user.a", "b"), xattrE(fileE("y", ""), "trusted.overlay.redirect", "/etc")},
	}
	for _, s := range seeds {
		f.Add(mkTar(f, s...))
	}
	f.Add([]byte("not a tar at all"))
	f.Add(mkTar(f, fileE("big", "0123456789"))[:700])

	// One base directory for all iterations (t.TempDir per input makes
	// fuzzing, and especially minimisation, several times slower).
	base := f.TempDir()
	root := filepath.Join(base, "root")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.RemoveAll(root); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(root, 0o755); err != nil {
			t.Fatal(err)
		}
		_, _ = Unpack(context.Background(), bytes.NewReader(data), root, Limits{MaxEntries: 200, MaxBytes: 1 << 20})
		ents, err := os.ReadDir(base)
		if err != nil || len(ents) != 1 || ents[0].Name() != "root" {
			t.Fatalf("something escaped next to the root: %v %v", ents, err)
		}
		ents, err = os.ReadDir(outside)
		if err != nil || len(ents) != 1 {
			t.Fatalf("outside directory changed: %v %v", ents, err)
		}
		if b, _ := os.ReadFile(victim); !bytes.Equal(b, []byte("safe")) {
			t.Fatalf("victim changed: %q", b)
		}
	})
}
