package snapshot

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestPruneUnchanged: the diff against the previous snapshot keeps what
// changed, drops what did not, whiteouts what went, packs a directory
// made opaque since whole and un-marks one that was opaque already.
func TestPruneUnchanged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root (whiteout device nodes, trusted.* xattrs)")
	}
	dir := t.TempDir()
	w := func(rel, data string) {
		t.Helper()
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	w("same", "a")
	w("edited", "a")
	w("gone", "a")
	w("d/gone", "a")
	w("d/same", "a")
	w("op/old", "a")
	w("was-op/same", "a")
	if err := unix.Lsetxattr(filepath.Join(dir, "was-op"), opaqueXattr, []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	prev, err := ScanManifest(dir)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	w("edited", "b")
	w("new", "a")
	for _, rel := range []string{"gone", "d/gone"} {
		if err := os.Remove(filepath.Join(dir, rel)); err != nil {
			t.Fatal(err)
		}
	}
	// op: removed and made again (overlay marks it opaque).
	if err := os.RemoveAll(filepath.Join(dir, "op")); err != nil {
		t.Fatal(err)
	}
	w("op/fresh", "a")
	if err := unix.Lsetxattr(filepath.Join(dir, "op"), opaqueXattr, []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	var before unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "d"), &before); err != nil {
		t.Fatal(err)
	}
	cur, err := PruneUnchanged(dir, prev)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cur["same"]; !ok || len(cur) != 9 {
		t.Fatalf("the manifest of the layer as it was: %d entries %v", len(cur), cur)
	}
	exists := func(rel string) bool {
		_, err := os.Lstat(filepath.Join(dir, rel))
		return err == nil
	}
	whiteout := func(rel string) bool {
		var st unix.Stat_t
		return unix.Lstat(filepath.Join(dir, rel), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
	}
	for _, rel := range []string{"same", "d/same", "was-op/same"} {
		if exists(rel) {
			t.Errorf("%s did not change but is in the diff", rel)
		}
	}
	for _, rel := range []string{"edited", "new", "op/fresh", "d", "was-op", "op"} {
		if !exists(rel) {
			t.Errorf("%s changed but is not in the diff", rel)
		}
	}
	for _, rel := range []string{"gone", "d/gone"} {
		if !whiteout(rel) {
			t.Errorf("%s went but has no whiteout", rel)
		}
	}
	if exists("op/old") {
		t.Error("op/old: under a directory made opaque since, nothing of before belongs in the diff")
	}
	var b [4]byte
	if _, err := unix.Lgetxattr(filepath.Join(dir, "was-op"), opaqueXattr, b[:]); err == nil {
		t.Error("was-op stays opaque: it would hide its unchanged entries in the chain below")
	}
	if _, err := unix.Lgetxattr(filepath.Join(dir, "op"), opaqueXattr, b[:]); err != nil {
		t.Error("op lost its opaque mark: the earlier layers' entries would show through")
	}
	var after unix.Stat_t
	if err := unix.Lstat(filepath.Join(dir, "d"), &after); err != nil {
		t.Fatal(err)
	}
	if after.Mtim != before.Mtim {
		t.Errorf("d's mtime changed from %v to %v by the pruning", before.Mtim, after.Mtim)
	}
}
