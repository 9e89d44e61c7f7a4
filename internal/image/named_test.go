package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestNamedLayersAndGC(t *testing.T) {
	requireRoot(t)
	s := newStore(t)
	ctx := context.Background()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "f"), []byte("v1"), 0o644)
	l1, err := s.CreateLayerFromDir(ctx, "ws/x", 0, dir)
	if err != nil || l1.Version != 1 || l1.Source != "dir" {
		t.Fatalf("%+v %v", l1, err)
	}
	os.WriteFile(filepath.Join(dir, "f"), []byte("v2"), 0o644)
	l2, err := s.CreateLayerFromDir(ctx, "ws/x", 0, dir)
	if err != nil || l2.Version != 2 || l2.Digest == l1.Digest {
		t.Fatalf("%+v %v", l2, err)
	}
	// Another name with the same content shares the blob.
	l3, err := s.CreateLayerFromDir(ctx, "ws/y", 5, dir)
	if err != nil || l3.Version != 5 || l3.Digest != l2.Digest {
		t.Fatalf("%+v %v", l3, err)
	}
	if _, err := s.CreateLayerFromDir(ctx, "ws/y", 5, t.TempDir()); !errors.Is(err, ErrExists) {
		t.Fatalf("rewrite of a version: %v", err)
	}
	for _, bad := range []string{"", "A", "/x", "x/", "x//y", "x/../y", "-x", "x y", "x@1"} {
		if _, err := s.CreateLayerFromDir(ctx, bad, 0, dir); !errors.Is(err, ErrInvalid) {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	for _, bad := range []string{"ws/x@0", "ws/x@-1", "ws/x@01", "ws/x@a", "ws/x@"} {
		if _, err := s.ResolveLayer(ctx, bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ref %q: %v", bad, err)
		}
	}
	if l, err := s.ResolveLayer(ctx, "ws/x"); err != nil || l.Version != 2 {
		t.Fatalf("latest: %+v %v", l, err)
	}
	if _, err := s.ResolveLayer(ctx, "ws/x@3"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing version: %v", err)
	}
	if l, _, _ := visible(t, s); len(l) != 2 {
		t.Fatalf("blobs %v", l)
	}

	// Reference counting: v1's blob is mounted, then its name goes; the
	// blob stays until the mount goes. v2's blob is shared with ws/y.
	m, _ := NewMounter(filepath.Join(t.TempDir(), "mnt"), s)
	t.Cleanup(func() { m.Close() })
	if _, err := m.Acquire("sb", []string{l1.Digest}); err != nil {
		t.Fatal(err)
	}
	if gone, err := s.DeleteLayer(ctx, "ws/x", 0); err != nil || len(gone) != 2 {
		t.Fatalf("delete all versions: %v %v", gone, err)
	}
	if l, _, _ := visible(t, s); len(l) != 2 {
		t.Fatalf("a used or still-named blob was collected: %v", l)
	}
	m.Release("sb")
	if l, _, _ := visible(t, s); len(l) != 1 {
		t.Fatalf("unused blob kept after its last mount: %v", l)
	}
	if r, err := s.GC(ctx); err != nil || len(r.Removed) != 0 || r.Kept != 1 {
		t.Fatalf("gc: %+v %v", r, err)
	}
	if _, err := s.DeleteLayer(ctx, "ws/x", 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("delete again: %v", err)
	}
	if _, err := s.DeleteLayer(ctx, "ws/y", 5); err != nil {
		t.Fatal(err)
	}
	if l, i, tmp := visible(t, s); len(l)+len(i)+len(tmp) != 0 {
		t.Fatalf("left: %v %v %v", l, i, tmp)
	}
}

// TestTarChanges packs an overlay upper dir: whiteouts and opaque dirs
// become OCI entries, privileges the lower layer lacked are dropped.
func TestTarChanges(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	lower, upper := t.TempDir(), t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(lower, "passwd"), []byte("x"), 0o755))
	must(unix.Chmod(filepath.Join(lower, "passwd"), 0o4755))
	must(os.WriteFile(filepath.Join(upper, "passwd"), []byte("y"), 0o755)) // copied up, setuid kept
	must(unix.Chmod(filepath.Join(upper, "passwd"), 0o4755))
	must(os.WriteFile(filepath.Join(upper, "minted"), []byte("z"), 0o755)) // new setuid: dropped
	must(unix.Chmod(filepath.Join(upper, "minted"), 0o6755))
	must(unix.Mknod(filepath.Join(upper, "deleted"), unix.S_IFCHR, 0))
	must(os.Mkdir(filepath.Join(upper, "opq"), 0o755))
	must(unix.Setxattr(filepath.Join(upper, "opq"), "trusted.overlay.opaque", []byte("y"), 0))
	must(os.WriteFile(filepath.Join(upper, "opq/in"), nil, 0o644))
	s := newStore(t)
	l, err := s.CreateLayerFromChanges(ctx, "ws/c", 0, upper, []string{lower}, 0, "sandbox sb-x")
	if err != nil {
		t.Fatal(err)
	}
	m, _ := NewMounter(filepath.Join(t.TempDir(), "mnt"), s)
	t.Cleanup(func() { m.Close() })
	dirs, err := m.Acquire("t", []string{l.Digest})
	if err != nil {
		t.Fatal(err)
	}
	d := dirs[0]
	if st := lstat(t, filepath.Join(d, "passwd")); st.Mode&0o7777 != 0o4755 {
		t.Fatalf("copied-up setuid file: %o", st.Mode&0o7777)
	}
	if st := lstat(t, filepath.Join(d, "minted")); st.Mode&0o7777 != 0o755 {
		t.Fatalf("minted setuid file: %o", st.Mode&0o7777)
	}
	if st := lstat(t, filepath.Join(d, "deleted")); st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Fatal("whiteout lost")
	}
	if !isOpaque(filepath.Join(d, "opq")) {
		t.Fatal("opaque lost")
	}
	must(unix.Mknod(filepath.Join(upper, "disk"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))))
	if _, err := s.CreateLayerFromChanges(ctx, "ws/c", 0, upper, []string{lower}, 0, "sandbox sb-x"); !errors.Is(err, ErrBadContent) {
		t.Fatalf("device node: %v", err)
	}
}

func FuzzParseLayerRef(f *testing.F) {
	for _, s := range []string{"ws/x", "ws/x@3", "a@", "@1", "x@99999999999", "ws/../x", "A/b", "x/y/z@1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ref string) {
		name, v, err := ParseLayerRef(ref)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("%q: error not marked invalid: %v", ref, err)
			}
			return
		}
		if ValidLayerName(name) != nil || v < 0 || v > MaxLayerVersion {
			t.Fatalf("%q accepted as %q@%d", ref, name, v)
		}
		if filepath.Clean("/"+name) != "/"+name {
			t.Fatalf("%q: name %q is not clean", ref, name)
		}
	})
}

// TestFullDiskMidImport: a store on a tiny filesystem fills up during the
// import: a clear ErrNoSpace, nothing half-written visible, and the store
// still works for what fits.
func TestFullDiskMidImport(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=3m"); err != nil {
		t.Skipf("SKIP: tmpfs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	s, err := Open(filepath.Join(dir, "store"))
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	big := make([]byte, 4<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	os.WriteFile(filepath.Join(src, "big"), big, 0o644)
	_, err = s.CreateLayerFromDir(context.Background(), "ws/big", 0, src)
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("want ErrNoSpace, got %v", err)
	}
	if l, i, tmp := visible(t, s); len(l)+len(i)+len(tmp) != 0 {
		t.Fatalf("left behind: %v %v %v", l, i, tmp)
	}
	if ls, _ := s.ListLayers(context.Background(), ""); len(ls) != 0 {
		t.Fatalf("layers: %v", ls)
	}
	small := t.TempDir()
	os.WriteFile(filepath.Join(small, "f"), []byte("fits"), 0o644)
	if _, err := s.CreateLayerFromDir(context.Background(), "ws/small", 0, small); err != nil {
		t.Fatalf("store unusable after a full disk: %v", err)
	}
}

// TestPrivateChangesEqualTarPath packs the same upper dir both ways: the
// direct path (normalise in place, EROFS straight from it) must give the
// same diff id and the same tree as tar → unpack → EROFS.
func TestPrivateChangesEqualTarPath(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	lower := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(lower, "passwd"), []byte("x"), 0o755))
	must(unix.Chmod(filepath.Join(lower, "passwd"), 0o4755))
	mkUpper := func() string {
		upper := t.TempDir()
		must(unix.Setxattr(upper, "trusted.overlay.impure", []byte("y"), 0))
		must(os.WriteFile(filepath.Join(upper, "passwd"), []byte("y"), 0o755))
		must(unix.Chmod(filepath.Join(upper, "passwd"), 0o4755))
		must(os.WriteFile(filepath.Join(upper, "minted"), []byte("z"), 0o755))
		must(unix.Chmod(filepath.Join(upper, "minted"), 0o6755))
		must(unix.Mknod(filepath.Join(upper, "deleted"), unix.S_IFCHR, 0))
		must(unix.Mknod(filepath.Join(upper, "sock"), unix.S_IFSOCK|0o600, 0))
		must(unix.Mkfifo(filepath.Join(upper, "fifo"), 0o640))
		must(os.Mkdir(filepath.Join(upper, "opq"), 0o750))
		must(unix.Setxattr(filepath.Join(upper, "opq"), "trusted.overlay.opaque", []byte("y"), 0))
		must(os.Mkdir(filepath.Join(upper, "bin"), 0o755))
		must(unix.Setxattr(filepath.Join(upper, "bin"), "trusted.overlay.origin", []byte("\x00\xfb"), 0))
		must(os.WriteFile(filepath.Join(upper, "opq/in"), []byte("data"), 0o644))
		must(unix.Setxattr(filepath.Join(upper, "opq/in"), "user.note", []byte("kept"), 0))
		must(os.Link(filepath.Join(upper, "opq/in"), filepath.Join(upper, "bin/link")))
		must(os.Symlink("../opq/in", filepath.Join(upper, "bin/sym")))
		must(os.Lchown(filepath.Join(upper, "bin/sym"), 7, 8))
		fixed := unix.NsecToTimespec(1_700_000_000_123_456_789)
		must(filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
			must(err)
			return unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{fixed, fixed}, unix.AT_SYMLINK_NOFOLLOW)
		}))
		return upper
	}
	s := newStore(t)
	a, err := s.CreateLayerFromChanges(ctx, "ws/a", 0, mkUpper(), []string{lower}, 0, "tar")
	must(err)
	b, err := s.CreateLayerFromPrivateChanges(ctx, "ws/b", 0, mkUpper(), []string{lower}, 0, "direct")
	must(err)
	if a.Digest != b.Digest || a.Entries != b.Entries || a.Size != b.Size {
		t.Fatalf("diff ids differ: %+v / %+v", a, b)
	}
	// The same digest: the store keeps one blob (the first). Compare the
	// direct image with the tar path's by packing into a second store.
	s2 := newStore(t)
	b2, err := s2.CreateLayerFromPrivateChanges(ctx, "ws/b", 0, mkUpper(), []string{lower}, 0, "direct")
	must(err)
	tree := func(s *LocalStore, digest string) string {
		m, _ := NewMounter(filepath.Join(t.TempDir(), "mnt"), s)
		t.Cleanup(func() { m.Close() })
		dirs, err := m.Acquire("t", []string{digest})
		must(err)
		var out strings.Builder
		must(filepath.WalkDir(dirs[0], func(p string, d fs.DirEntry, err error) error {
			must(err)
			if p == dirs[0] {
				return nil
			}
			st := lstat(t, p)
			rel, _ := filepath.Rel(dirs[0], p)
			fmt.Fprintf(&out, "%s %o %d:%d n%d r%d s%d", rel, st.Mode, st.Uid, st.Gid, st.Nlink, st.Rdev, st.Size)
			if st.Mode&unix.S_IFMT != unix.S_IFCHR { // a whiteout's time does not matter
				fmt.Fprintf(&out, " m%d.%d", st.Mtim.Sec, st.Mtim.Nsec)
			}
			if st.Mode&unix.S_IFMT == unix.S_IFREG {
				b, _ := os.ReadFile(p)
				fmt.Fprintf(&out, " %q", b)
			}
			for _, x := range []string{"user.note", "trusted.overlay.opaque", "trusted.overlay.origin"} {
				if v, err := getXattr(p, x); err == nil {
					fmt.Fprintf(&out, " %s=%q", x, v)
				}
			}
			out.WriteString("\n")
			return nil
		}))
		return out.String()
	}
	want, got := tree(s, a.Digest), tree(s2, b2.Digest)
	if want != got {
		t.Fatalf("trees differ:\ntar path:\n%s\ndirect:\n%s", want, got)
	}
	if !strings.Contains(got, `opq trusted.overlay.opaque="y"`) && !strings.Contains(got, `trusted.overlay.opaque="y"`) {
		t.Fatalf("opaque lost:\n%s", got)
	}
	// A device node goes the long way, which refuses it.
	up := mkUpper()
	must(unix.Mknod(filepath.Join(up, "disk"), unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))))
	if _, err := s.CreateLayerFromPrivateChanges(ctx, "ws/c", 0, up, []string{lower}, 0, "direct"); !errors.Is(err, ErrBadContent) {
		t.Fatalf("device node: %v", err)
	}
}

// TestQualifiedLayerNames: a project's layer lives under its qualified
// name, apart from the plain name of the same spelling and from another
// project's; malformed qualifications are invalid.
func TestQualifiedLayerNames(t *testing.T) {
	requireRoot(t)
	s := newStore(t)
	ctx := context.Background()
	for project, content := range map[string]string{"": "root", "p1": "one", "p2.c": "two"} {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "f"), []byte(content), 0o644)
		q := QualifiedLayerName(project, "ws/calc")
		if p, n := SplitLayerName(q); p != project || n != "ws/calc" {
			t.Fatalf("split %q: %q %q", q, p, n)
		}
		l, err := s.CreateLayerFromDir(ctx, q, 0, dir)
		if err != nil || l.Name != q || l.Version != 1 {
			t.Fatalf("create %q: %+v %v", q, l, err)
		}
	}
	all, err := s.ListLayers(ctx, "")
	if err != nil || len(all) != 3 {
		t.Fatalf("list: %+v %v", all, err)
	}
	digests := map[string]bool{}
	for _, l := range all {
		digests[l.Digest] = true
	}
	if len(digests) != 3 {
		t.Fatalf("three contents, %d digests", len(digests))
	}
	if l, err := s.ResolveLayer(ctx, "~p1/ws/calc@1"); err != nil || l.Name != "~p1/ws/calc" {
		t.Fatalf("resolve the qualified name: %+v %v", l, err)
	}
	if ls, err := s.ListLayers(ctx, "~p2.c/ws/calc"); err != nil || len(ls) != 1 {
		t.Fatalf("list one project's name: %+v %v", ls, err)
	}
	for _, bad := range []string{"~", "~/ws/x", "~p1", "~p1/", "~P1/x", "~p1/~p2/x", "~p1/../x", "~p1..x/y", "~.p1/x", "~p1-/x"} {
		if _, _, err := ParseLayerRef(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: %v, want invalid", bad, err)
		}
	}
}
