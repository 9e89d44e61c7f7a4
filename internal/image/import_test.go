package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

func writeDockerArchive(t *testing.T, img v1.Image) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "docker.tar")
	tag, err := name.NewTag("example.com/test:1")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(p, tag, img); err != nil {
		t.Fatal(err)
	}
	return p
}

// writeLayout writes a multi-platform OCI layout: an arm64 decoy and the
// amd64 test image.
func writeLayout(t *testing.T, img v1.Image) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	decoy := testImage(t, "arm64")
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: decoy, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendIndex(idx); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tarTree archives dir (gzip when gz) with the system tar.
func tarTree(t *testing.T, dir string, gz bool) string {
	t.Helper()
	out := filepath.Join(t.TempDir(), "archive.tar")
	args := []string{"-C", dir, "--xattrs", "-cf", out, "."}
	if gz {
		out += ".gz"
		args = []string{"-C", dir, "--xattrs", "-czf", out, "."}
	}
	if b, err := exec.Command("tar", args...).CombinedOutput(); err != nil {
		t.Fatalf("tar: %v: %s", err, b)
	}
	return out
}

// checkTestImage verifies the overlay form of testImage's layers.
func checkTestImage(t *testing.T, img *Image, dirs []string) {
	t.Helper()
	if len(dirs) != 2 || len(img.Layers) != 2 {
		t.Fatalf("want 2 layers, got %v / %v", dirs, img.Layers)
	}
	if !strings.HasSuffix(dirs[1], strings.TrimPrefix(img.Layers[0], "sha256:")) {
		t.Fatalf("layer dirs not top-most first: %v vs %v", dirs, img.Layers)
	}
	top, bottom := dirs[0], dirs[1]
	if b, err := os.ReadFile(filepath.Join(bottom, "etc/a")); err != nil || string(b) != "a" {
		t.Fatalf("bottom etc/a: %q %v", b, err)
	}
	st := lstat(t, filepath.Join(top, "etc/a"))
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Fatalf("whiteout etc/a: mode %o rdev %d, want a 0/0 char device", st.Mode, st.Rdev)
	}
	if _, err := os.Lstat(filepath.Join(top, "etc/.wh.a")); !os.IsNotExist(err) {
		t.Fatalf(".wh.a kept: %v", err)
	}
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(filepath.Join(top, "d"), "trusted.overlay.opaque", buf)
	if err != nil || string(buf[:n]) != "y" {
		t.Fatalf("opaque xattr on d: %q %v", buf[:n], err)
	}
	if st := lstat(t, filepath.Join(top, "bin/su")); st.Mode&0o7777 != 0o4755 {
		t.Fatalf("bin/su mode %o, want 4755", st.Mode&0o7777)
	}
	if st := lstat(t, filepath.Join(top, "bin/sg")); st.Mode&0o7777 != 0o2711 {
		t.Fatalf("bin/sg mode %o, want 2711", st.Mode&0o7777)
	}
	if img.Config.Cmd[0] != "/bin/sh" || !slices.Contains(img.Config.Env, "ARCH=amd64") {
		t.Fatalf("config %+v", img.Config)
	}
}

func TestImportDockerArchive(t *testing.T) {
	requireRoot(t)
	s := newStore(t)
	ctx := context.Background()
	img, err := s.Import(ctx, writeDockerArchive(t, testImage(t, "amd64")), "example.com/test:1")
	if err != nil {
		t.Fatal(err)
	}
	got, dirs := mountImage(t, s, "example.com/test:1")
	if got.Digest != img.Digest || !strings.HasPrefix(img.Digest, "sha256:") || img.Size == 0 {
		t.Fatalf("resolve %+v vs import %+v", got, img)
	}
	checkTestImage(t, got, dirs)
	if a := got.API(); a.Digest != img.Digest || len(a.Layers) != 2 {
		t.Fatalf("api form %+v", a)
	}
	if _, _, err := s.Resolve(ctx, "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown name: %v", err)
	}
}

func TestImportOCILayoutAndArchive(t *testing.T) {
	requireRoot(t)
	s := newStore(t)
	ctx := context.Background()
	img := testImage(t, "amd64")
	dir := writeLayout(t, img)
	a, err := s.Import(ctx, dir, "oci-dir")
	if err != nil {
		t.Fatal(err)
	}
	_, dirs := mountImage(t, s, "oci-dir")
	checkTestImage(t, a, dirs)

	for _, gz := range []bool{false, true} {
		b, err := s.Import(ctx, tarTree(t, dir, gz), "oci-archive")
		if err != nil {
			t.Fatalf("gz=%v: %v", gz, err)
		}
		if b.Digest != a.Digest {
			t.Fatalf("archive digest %s != layout digest %s", b.Digest, a.Digest)
		}
	}
	// The docker form of the same image has the same layers and config.
	c, err := s.Import(ctx, writeDockerArchive(t, img), "docker")
	if err != nil {
		t.Fatal(err)
	}
	if c.Digest != a.Digest {
		t.Fatalf("docker digest %s != oci digest %s", c.Digest, a.Digest)
	}
	if layers, _, tmp := visible(t, s); len(layers) != 2 || len(tmp) != 0 {
		t.Fatalf("layers %v tmp %v", layers, tmp)
	}
}

func TestImportRandomImage(t *testing.T) {
	requireRoot(t)
	s := newStore(t)
	img, err := random.Image(1024, 3)
	if err != nil {
		t.Fatal(err)
	}
	// random.Image has no platform in its config; that is accepted.
	got, err := s.Import(context.Background(), writeDockerArchive(t, img), "random")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.ConfigFile()
	for i, d := range want.RootFS.DiffIDs {
		if got.Layers[i] != d.String() {
			t.Fatalf("layer %d: %s, want %s", i, got.Layers[i], d)
		}
	}
}

func makeRootfs(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "rootfs")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "bin"), 0o755))
	must(os.MkdirAll(filepath.Join(dir, "tmp"), 0o755))
	must(unix.Chmod(filepath.Join(dir, "tmp"), 0o1777))
	must(os.WriteFile(filepath.Join(dir, "bin/tool"), []byte("tool"), 0o755))
	must(unix.Chmod(filepath.Join(dir, "bin/tool"), 0o4755))
	must(os.Link(filepath.Join(dir, "bin/tool"), filepath.Join(dir, "bin/tool2")))
	must(os.Symlink("tool", filepath.Join(dir, "bin/sh")))
	must(unix.Mkfifo(filepath.Join(dir, "fifo"), 0o600))
	must(os.MkdirAll(filepath.Join(dir, "dev"), 0o755))
	must(unix.Mknod(filepath.Join(dir, "dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	must(os.WriteFile(filepath.Join(dir, "owned"), nil, 0o640))
	must(os.Lchown(filepath.Join(dir, "owned"), 1234, 5678))
	must(unix.Setxattr(filepath.Join(dir, "owned"), "user.note", []byte("hi"), 0))
	return dir
}

func checkRootfs(t *testing.T, layer string) {
	t.Helper()
	if st := lstat(t, filepath.Join(layer, "bin/tool")); st.Mode&0o7777 != 0o4755 || st.Nlink != 2 {
		t.Fatalf("bin/tool mode %o nlink %d", st.Mode&0o7777, st.Nlink)
	}
	if l, err := os.Readlink(filepath.Join(layer, "bin/sh")); err != nil || l != "tool" {
		t.Fatalf("bin/sh -> %q %v", l, err)
	}
	if st := lstat(t, filepath.Join(layer, "tmp")); st.Mode&0o7777 != 0o1777 {
		t.Fatalf("tmp mode %o", st.Mode&0o7777)
	}
	if st := lstat(t, filepath.Join(layer, "fifo")); st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Fatalf("fifo mode %o", st.Mode)
	}
	if _, err := os.Lstat(filepath.Join(layer, "dev/null")); !os.IsNotExist(err) {
		t.Fatalf("device node dev/null kept: %v", err)
	}
	st := lstat(t, filepath.Join(layer, "owned"))
	if st.Uid != 1234 || st.Gid != 5678 || st.Mode&0o777 != 0o640 {
		t.Fatalf("owned: %d:%d %o", st.Uid, st.Gid, st.Mode)
	}
	buf := make([]byte, 16)
	if n, err := unix.Getxattr(filepath.Join(layer, "owned"), "user.note", buf); err != nil || string(buf[:n]) != "hi" {
		t.Fatalf("xattr: %q %v", buf[:n], err)
	}
}

func TestImportRootfs(t *testing.T) {
	requireRoot(t)
	s := newStore(t)
	ctx := context.Background()
	root := makeRootfs(t)
	a, err := s.Import(ctx, root, "from-dir")
	if err != nil {
		t.Fatal(err)
	}
	_, dirs := mountImage(t, s, "from-dir")
	checkRootfs(t, dirs[0])
	again, err := s.Import(ctx, root, "from-dir")
	if err != nil || again.Digest != a.Digest {
		t.Fatalf("re-import of the same dir: %v, digest %s vs %s", err, again.Digest, a.Digest)
	}
	for _, gz := range []bool{false, true} {
		img, err := s.Import(ctx, tarTree(t, root, gz), "from-tar")
		if err != nil {
			t.Fatalf("gz=%v: %v", gz, err)
		}
		_, dirs := mountImage(t, s, "from-tar")
		if len(dirs) != 1 || len(img.Layers) != 1 {
			t.Fatalf("resolve: %v", dirs)
		}
		checkRootfs(t, dirs[0])
	}
}

func TestFailedImportLeavesNothing(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	big := strings.Repeat("x", 64<<10)
	good := mkTar(t, dirE("a/"), fileE("a/1", big), fileE("a/2", big))

	// A truncated rootfs tarball.
	s := newStore(t)
	p := filepath.Join(t.TempDir(), "trunc.tar")
	if err := os.WriteFile(p, good[:len(good)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(ctx, p, "trunc"); err == nil {
		t.Fatal("truncated tarball imported")
	}
	if l, i, tmp := visible(t, s); len(l)+len(i)+len(tmp) != 0 {
		t.Fatalf("left behind: layers %v images %v tmp %v", l, i, tmp)
	}

	// An image whose second layer is corrupt: the good first layer must
	// not become visible either.
	img, err := mutate.AppendLayers(empty.Image, layerOf(t, good), layerOf(t, mkTar(t, fileE("b", big))))
	if err != nil {
		t.Fatal(err)
	}
	dir := writeLayout(t, img)
	ls, _ := img.Layers()
	d, _ := ls[1].Digest()
	blob := filepath.Join(dir, "blobs", "sha256", d.Hex)
	b, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(blob, b[:len(b)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Import(ctx, dir, "corrupt"); err == nil {
		t.Fatal("corrupt layout imported")
	} else {
		t.Logf("corrupt layout: %v", err)
	}
	if l, i, tmp := visible(t, s); len(l)+len(i)+len(tmp) != 0 {
		t.Fatalf("left behind: layers %v images %v tmp %v", l, i, tmp)
	}

	// The first layer unpacks completely, the second is cut short.
	srcs := []layerSource{
		{open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(good)), nil }},
		{open: func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(good[:len(good)-2000])), nil }},
	}
	if _, err := s.importLayers(ctx, "half", Config{}, srcs); err == nil {
		t.Fatal("truncated second layer imported")
	} else {
		t.Logf("truncated second layer: %v", err)
	}
	if l, i, tmp := visible(t, s); len(l)+len(i)+len(tmp) != 0 {
		t.Fatalf("left behind: layers %v images %v tmp %v", l, i, tmp)
	}
}

func TestTraversalRejected(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "victim"), []byte("safe"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := map[string][]ent{
		"dotdot":             {fileE("../outside/evil", "x")},
		"dotdot-inner":       {dirE("a/"), fileE("a/../../outside/evil", "x")},
		"absolute":           {fileE(outside+"/evil", "x")},
		"symlink-parent":     {symE("l", outside), fileE("l/evil", "x")},
		"symlink-rel-parent": {symE("l", "../../../.."+outside), fileE("l/evil", "x")},
		"symlink-dir-entry":  {symE("l", outside), dirE("l/sub/")},
		"hardlink-out":       {hardE("h", "../outside/victim")},
		"hardlink-abs":       {hardE("h", outside+"/victim")},
		"hardlink-via-link":  {symE("l", outside), hardE("h", "l/victim")},
		"hardlink-missing":   {hardE("h", "etc/passwd")},
		"symlink-then-write": {symE("f", outside+"/victim"), hardE("g", "f"), fileE("f/x", "x")},
		"device-node":        {{name: "disk", typ: tar.TypeBlock, mode: 0o600}},
		"char-device":        {dirE("etc/"), {name: "etc/mem", typ: tar.TypeChar, mode: 0o600}},
	}
	for name, ents := range cases {
		t.Run(name, func(t *testing.T) {
			s := newStore(t)
			p := filepath.Join(t.TempDir(), "evil.tar")
			if err := os.WriteFile(p, mkTar(t, ents...), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := s.Import(ctx, p, "evil")
			if err == nil {
				t.Fatal("imported")
			}
			t.Log(err)
			if l, i, tmp := visible(t, s); len(l)+len(i)+len(tmp) != 0 {
				t.Fatalf("left behind: layers %v images %v tmp %v", l, i, tmp)
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 {
				t.Fatalf("outside changed: %v", ents)
			}
			if b, _ := os.ReadFile(filepath.Join(outside, "victim")); string(b) != "safe" {
				t.Fatalf("victim changed: %q", b)
			}
		})
	}
}

func TestUnpackReplacesWithoutFollowing(t *testing.T) {
	requireRoot(t)
	base := t.TempDir()
	victim := filepath.Join(base, "victim")
	if err := os.WriteFile(victim, []byte("safe"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(base, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	// A symlink, then a regular file of the same name: the file replaces
	// the link, it is never written through it. Same for a hard link.
	tb := mkTar(t, symE("f", victim), fileE("f", "new"), fileE("g", "g"), hardE("h", "g"), fileE("h", "h"),
		xattrE(fileE("x", ""), "trusted.overlay.opaque", "y"))
	if _, err := Unpack(context.Background(), bytes.NewReader(tb), root, Limits{}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "safe" {
		t.Fatalf("written through symlink: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "f")); string(b) != "new" {
		t.Fatalf("f = %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "g")); string(b) != "g" {
		t.Fatalf("written through hard link: g = %q", b)
	}
	if _, err := unix.Lgetxattr(filepath.Join(root, "x"), "trusted.overlay.opaque", make([]byte, 4)); err == nil {
		t.Fatal("overlay xattr taken from the archive")
	}
}

func TestUnpackLimits(t *testing.T) {
	requireRoot(t)
	tb := mkTar(t, fileE("a", "12345"), fileE("b", "12345"))
	if _, err := Unpack(context.Background(), bytes.NewReader(tb), t.TempDir(), Limits{MaxBytes: 8}); err == nil {
		t.Fatal("byte limit not enforced")
	}
	if _, err := Unpack(context.Background(), bytes.NewReader(tb), t.TempDir(), Limits{MaxEntries: 1}); err == nil {
		t.Fatal("entry limit not enforced")
	}
}

func TestDedupAndRemove(t *testing.T) {
	requireRoot(t)
	s := newStore(t)
	ctx := context.Background()
	img := testImage(t, "amd64")
	if _, err := s.Import(ctx, writeDockerArchive(t, img), "a"); err != nil {
		t.Fatal(err)
	}
	_, dirsA, _ := s.Resolve(ctx, "a") // blob paths
	before := lstat(t, dirsA[0]).Ino
	if _, err := s.Import(ctx, writeLayout(t, img), "b"); err != nil {
		t.Fatal(err)
	}
	_, dirsB, _ := s.Resolve(ctx, "b")
	if !slices.Equal(dirsA, dirsB) || lstat(t, dirsB[0]).Ino != before {
		t.Fatalf("layers not shared: %v vs %v", dirsA, dirsB)
	}
	if l, i, _ := visible(t, s); len(l) != 2 || len(i) != 2 {
		t.Fatalf("layers %v images %v", l, i)
	}
	if err := s.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Resolve(ctx, "b"); err != nil {
		t.Fatalf("b lost its layers: %v", err)
	}
	if err := s.Remove(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if l, i, tmp := visible(t, s); len(l)+len(i)+len(tmp) != 0 {
		t.Fatalf("left: %v %v %v", l, i, tmp)
	}
	if err := s.Remove(ctx, "b"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second remove: %v", err)
	}
}

func TestConcurrentImportsOfOneLayer(t *testing.T) {
	requireRoot(t)
	s := newStore(t)
	p := writeDockerArchive(t, testImage(t, "amd64"))
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		go func(i int) {
			_, err := s.Import(context.Background(), p, "c"+string(rune('0'+i)))
			errs <- err
		}(i)
	}
	for i := 0; i < 4; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if l, i, tmp := visible(t, s); len(l) != 2 || len(i) != 4 || len(tmp) != 0 {
		t.Fatalf("layers %v images %v tmp %v", l, i, tmp)
	}
}

func TestNames(t *testing.T) {
	for _, n := range []string{"busybox", "debian:12", "ghcr.io/org/x:tag", "a@sha256:00", "ws/django-1234"} {
		if err := ValidName(n); err != nil {
			t.Errorf("%q: %v", n, err)
		}
	}
	for _, n := range []string{"", "../x", "a/../b", "/abs", "a//b", "a/", ".hidden", "a\x00b", "a b", "a%2Fb",
		strings.Repeat("a", 201)} {
		if ValidName(n) == nil {
			t.Errorf("%q accepted", n)
		}
	}
	requireRoot(t)
	s := newStore(t)
	ctx := context.Background()
	root := makeRootfs(t)
	for _, n := range []string{"ghcr.io/org/x:tag", "debian:12"} {
		if _, err := s.Import(ctx, root, n); err != nil {
			t.Fatal(err)
		}
	}
	imgs, err := s.List(ctx)
	if err != nil || len(imgs) != 2 || imgs[0].Name != "debian:12" || imgs[1].Name != "ghcr.io/org/x:tag" {
		t.Fatalf("list: %+v %v", imgs, err)
	}
	if _, err := s.Import(ctx, root, "../evil"); err == nil {
		t.Fatal("bad name imported")
	}
}

// TestOverlayHidesWhitedOut mounts the layers of testImage as an overlay
// and checks the kernel honours the converted whiteouts.
func TestOverlayHidesWhitedOut(t *testing.T) {
	requireRoot(t)
	s := newStore(t)
	ctx := context.Background()
	if _, err := s.Import(ctx, writeDockerArchive(t, testImage(t, "amd64")), "ov"); err != nil {
		t.Fatal(err)
	}
	_, dirs := mountImage(t, s, "ov")
	base := t.TempDir()
	upper, work, mnt := filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "mnt")
	for _, d := range []string{upper, work, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := "lowerdir=" + strings.Join(dirs, ":") + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", mnt, "overlay", 0, opts); err != nil {
		t.Skipf("SKIP: overlay mount: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	if _, err := os.Lstat(filepath.Join(mnt, "etc/a")); !os.IsNotExist(err) {
		t.Fatalf("whited-out etc/a visible: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(mnt, "etc/b")); err != nil || string(b) != "b" {
		t.Fatalf("etc/b: %q %v", b, err)
	}
	ents, err := os.ReadDir(filepath.Join(mnt, "d"))
	if err != nil || len(ents) != 1 || ents[0].Name() != "z" {
		t.Fatalf("opaque d shows %v (%v), want only z", ents, err)
	}
	if st := lstat(t, filepath.Join(mnt, "bin/su")); st.Mode&0o7777 != 0o4755 {
		t.Fatalf("setuid lost in overlay: %o", st.Mode)
	}
}

func TestEnsureBusybox(t *testing.T) {
	requireRoot(t)
	if _, err := os.Stat("/bin/busybox"); err != nil {
		t.Skip("SKIP: /bin/busybox missing (busybox-static)")
	}
	s := newStore(t)
	ctx := context.Background()
	a, err := s.EnsureBusybox(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.EnsureBusybox(ctx)
	if err != nil || b.Digest != a.Digest || !b.CreatedAt.Equal(a.CreatedAt) {
		t.Fatalf("second call rebuilt or failed: %v %+v", err, b)
	}
	_, dirs := mountImage(t, s, BusyboxImage)
	root := dirs[0]
	if l, err := os.Readlink(filepath.Join(root, "bin/sh")); err != nil || l != "busybox" {
		t.Fatalf("bin/sh -> %q %v", l, err)
	}
	if st := lstat(t, filepath.Join(root, "tmp")); st.Mode&0o7777 != 0o1777 {
		t.Fatalf("tmp mode %o", st.Mode&0o7777)
	}
	for _, f := range []string{"etc/passwd", "etc/group", "etc/hostname", "etc/resolv.conf", "root", "home", "proc", "sys", "dev"} {
		if _, err := os.Lstat(filepath.Join(root, f)); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(filepath.Join(root, "bin/busybox"), "echo", "ok").Output()
	if err != nil || string(out) != "ok\n" {
		t.Fatalf("busybox: %q %v", out, err)
	}

	// Deterministic: another store builds the same digest, quickly.
	s2 := newStore(t)
	start := time.Now()
	c, err := s2.EnsureBusybox(ctx)
	if err != nil || c.Digest != a.Digest {
		t.Fatalf("digest differs: %v %s vs %s", err, c.Digest, a.Digest)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("EnsureBusybox took %v", d)
	} else {
		t.Logf("EnsureBusybox build: %v", d)
	}
}

// Sanity: a gzip-compressed docker archive is read too.
func TestImportGzipDockerArchive(t *testing.T) {
	requireRoot(t)
	p := writeDockerArchive(t, testImage(t, "amd64"))
	raw, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(raw)
	zw.Close()
	gp := p + ".gz"
	if err := os.WriteFile(gp, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	s := newStore(t)
	img, err := s.Import(context.Background(), gp, "gz")
	if err != nil {
		t.Fatal(err)
	}
	_, dirs := mountImage(t, s, "gz")
	checkTestImage(t, img, dirs)
}
