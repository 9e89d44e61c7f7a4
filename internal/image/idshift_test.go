package image

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestChangesShiftIDs: the writable layer of a sandbox in a user namespace
// holds host ids of its range (root is host id base); a layer packed from
// it, either way (tar or direct), records the ids the sandbox saw, and
// keeps a setuid bit the layer below had.
func TestChangesShiftIDs(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	const base = 3 << 20
	lower := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(lower, "su"), []byte("x"), 0o755))
	must(unix.Chmod(filepath.Join(lower, "su"), 0o4755))
	mkUpper := func() string {
		upper := t.TempDir()
		must(os.WriteFile(filepath.Join(upper, "rootfile"), []byte("r"), 0o644))
		must(os.Lchown(filepath.Join(upper, "rootfile"), base, base))
		must(os.Mkdir(filepath.Join(upper, "home"), 0o755))
		must(os.Lchown(filepath.Join(upper, "home"), base, base))
		must(os.WriteFile(filepath.Join(upper, "home", "user"), []byte("u"), 0o600))
		must(os.Lchown(filepath.Join(upper, "home", "user"), base+1000, base+1001))
		must(os.Symlink("user", filepath.Join(upper, "home", "link")))
		must(os.Lchown(filepath.Join(upper, "home", "link"), base+1000, base+1000))
		must(os.WriteFile(filepath.Join(upper, "su"), []byte("y"), 0o755))
		must(os.Lchown(filepath.Join(upper, "su"), base, base))
		must(unix.Chmod(filepath.Join(upper, "su"), 0o4755))
		must(os.WriteFile(filepath.Join(upper, "stray"), nil, 0o644))
		must(os.Lchown(filepath.Join(upper, "stray"), 5, 5)) // outside the range
		fixed := unix.NsecToTimespec(1_700_000_000_123_456_789)
		must(filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
			must(err)
			return unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{fixed, fixed}, unix.AT_SYMLINK_NOFOLLOW)
		}))
		return upper
	}
	s := newStore(t)
	a, err := s.CreateLayerFromChanges(ctx, "ws/shift-tar", 0, mkUpper(), []string{lower}, base, "tar")
	must(err)
	s2 := newStore(t)
	b, err := s2.CreateLayerFromPrivateChanges(ctx, "ws/shift-direct", 0, mkUpper(), []string{lower}, base, "direct")
	must(err)
	if a.Digest != b.Digest {
		t.Errorf("tar and direct packs differ: %s / %s", a.Digest, b.Digest)
	}
	want := "home 0:0 40755\nhome/link 1000:1000 120777\nhome/user 1000:1001 100600\n" +
		"rootfile 0:0 100644\nstray 65534:65534 100644\nsu 0:0 104755\n"
	for _, c := range []struct {
		s      *LocalStore
		digest string
	}{{s, a.Digest}, {s2, b.Digest}} {
		m, err := NewMounter(filepath.Join(t.TempDir(), "mnt"), c.s)
		must(err)
		dirs, err := m.Acquire("t", []string{c.digest})
		must(err)
		var out strings.Builder
		for _, rel := range []string{"home", "home/link", "home/user", "rootfile", "stray", "su"} {
			st := lstat(t, filepath.Join(dirs[0], rel))
			fmt.Fprintf(&out, "%s %d:%d %o\n", rel, st.Uid, st.Gid, st.Mode)
		}
		m.Release("t")
		m.Close()
		if out.String() != want {
			t.Errorf("layer %s:\n%s\nwant:\n%s", c.digest, out.String(), want)
		}
	}
}
