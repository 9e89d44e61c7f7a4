package agent

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/image"
)

// TestUpperTreeRoundTrip: an overlay upper directory (a new file with a
// user xattr, a hard link, a symlink, a whiteout, an opaque directory, a
// socket) packed by upperTree and unpacked by the edge's unpacker gives
// the same upper directory back, the socket left out. (The freeze of
// OpUpperTar is not run here: it would freeze the host's filesystem; the
// e2e TestMicroVMSnapshot runs it in a guest.)
func TestUpperTreeRoundTrip(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: whiteouts (mknod) and trusted.* xattrs need root")
	}
	src, dst := t.TempDir(), t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "work/sub"), 0o750))
	must(os.WriteFile(filepath.Join(src, "work/sub/f"), []byte("data"), 0o640))
	must(os.Chown(filepath.Join(src, "work/sub/f"), 1000, 1001))
	must(unix.Setxattr(filepath.Join(src, "work/sub/f"), "user.tag", []byte("v"), 0))
	must(os.Link(filepath.Join(src, "work/sub/f"), filepath.Join(src, "work/hard")))
	must(os.Symlink("sub/f", filepath.Join(src, "work/link")))
	must(os.MkdirAll(filepath.Join(src, "etc"), 0o755))
	must(unix.Mknod(filepath.Join(src, "etc/group"), unix.S_IFCHR, 0))
	must(os.MkdirAll(filepath.Join(src, "opq"), 0o755))
	must(unix.Setxattr(filepath.Join(src, "opq"), "trusted.overlay.opaque", []byte("y"), 0))
	must(unix.Setxattr(filepath.Join(src, "opq"), "trusted.overlay.origin", []byte("x"), 0))
	must(os.WriteFile(filepath.Join(src, "opq/new"), nil, 0o600))
	must(unix.Mknod(filepath.Join(src, "work/sock"), unix.S_IFSOCK|0o600, 0))

	fd, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(err)
	defer unix.Close(fd)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	must(upperTree(context.Background(), tw, fd, "", map[[2]uint64]string{}))
	must(tw.Close())
	var names []string
	tr := tar.NewReader(bytes.NewReader(buf.Bytes()))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	sort.Strings(names)
	want := []string{"etc/", "etc/.wh.group", "opq/", "opq/.wh..wh..opq", "opq/new", "work/", "work/hard", "work/link", "work/sub/", "work/sub/f"}
	if len(names) != len(want) {
		t.Fatalf("tar entries %q, want %q", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("tar entries %q, want %q", names, want)
		}
	}
	if _, err := image.Unpack(context.Background(), &buf, dst, image.Limits{}); err != nil {
		t.Fatal(err)
	}
	var st, st2 unix.Stat_t
	must(unix.Lstat(filepath.Join(dst, "work/sub/f"), &st))
	must(unix.Lstat(filepath.Join(dst, "work/hard"), &st2))
	if st.Uid != 1000 || st.Gid != 1001 || st.Mode&0o7777 != 0o640 || st.Ino != st2.Ino || st.Nlink != 2 {
		t.Errorf("work/sub/f: uid %d gid %d mode %o, hard link same inode %v", st.Uid, st.Gid, st.Mode&0o7777, st.Ino == st2.Ino)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "work/sub/f")); string(b) != "data" {
		t.Errorf("content %q", b)
	}
	v := make([]byte, 8)
	if n, err := unix.Getxattr(filepath.Join(dst, "work/sub/f"), "user.tag", v); err != nil || string(v[:n]) != "v" {
		t.Errorf("user.tag: %q %v", v[:max(n, 0)], err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "work/link")); err != nil || l != "sub/f" {
		t.Errorf("symlink: %q %v", l, err)
	}
	must(unix.Lstat(filepath.Join(dst, "etc/group"), &st))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout: mode %o rdev %d", st.Mode, st.Rdev)
	}
	if n, err := unix.Getxattr(filepath.Join(dst, "opq"), "trusted.overlay.opaque", v); err != nil || string(v[:n]) != "y" {
		t.Errorf("opaque: %v", err)
	}
	if _, err := unix.Getxattr(filepath.Join(dst, "opq"), "trusted.overlay.origin", v); err == nil {
		t.Error("overlay's origin xattr was packed")
	}
	if _, err := os.Lstat(filepath.Join(dst, "work/sock")); err == nil {
		t.Error("a socket was packed")
	}
}
