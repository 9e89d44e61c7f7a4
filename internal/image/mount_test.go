package image

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// erofsMounts lists (mount point, source) of the erofs mounts under dir.
func erofsMounts(t *testing.T, dir string) map[string]string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		for i, f := range fields {
			if f == "-" && i+2 < len(fields) && fields[i+1] == "erofs" && strings.HasPrefix(fields[4], dir+"/") {
				out[fields[4]] = fields[i+2]
			}
		}
	}
	return out
}

func TestMounterSharesOneFileBackedMount(t *testing.T) {
	requireRoot(t)
	s := newStore(t)
	ctx := context.Background()
	img, err := s.Import(ctx, writeDockerArchive(t, testImage(t, "amd64")), "x")
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMounter(filepath.Join(t.TempDir(), "mnt"), s)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close() })
	a, err := m.Acquire("sb-a", img.Layers)
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Acquire("sb-b", img.Layers)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(a, ",") != strings.Join(b, ",") {
		t.Fatalf("holders got different dirs: %v %v", a, b)
	}
	got := erofsMounts(t, m.Dir())
	if len(got) != 2 {
		t.Fatalf("want one mount per layer (2), got %v", got)
	}
	for p, src := range got {
		// File-backed: the source is the store's regular file (given by
		// descriptor, so that no host path shows), not /dev/loopN.
		if !strings.HasPrefix(src, "/proc/self/fd/") {
			t.Fatalf("%s mounted from %q, want the blob file by descriptor", p, src)
		}
	}
	if n, mounts := m.Stats(); n != 2 || mounts != 2 {
		t.Fatalf("stats %d %d", n, mounts)
	}
	// A layer in use survives garbage collection even when nothing names it.
	if err := s.Remove(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	if l, _, _ := visible(t, s); len(l) != 2 {
		t.Fatalf("in-use layers collected: %v", l)
	}
	m.Release("sb-a")
	if len(erofsMounts(t, m.Dir())) != 2 {
		t.Fatal("unmounted while sb-b still holds the layers")
	}
	m.Release("sb-b")
	m.Release("sb-b") // idempotent
	if got := erofsMounts(t, m.Dir()); len(got) != 0 {
		t.Fatalf("still mounted: %v", got)
	}
	// The last release collected the unnamed layers.
	if l, i, tmp := visible(t, s); len(l)+len(i)+len(tmp) != 0 {
		t.Fatalf("left: %v %v %v", l, i, tmp)
	}
	if _, err := m.Acquire("sb-c", img.Layers); err == nil {
		t.Fatal("mounted a collected layer")
	}
	if ents, _ := os.ReadDir(m.Dir()); len(ents) != 0 {
		t.Fatalf("mount points left: %v", ents)
	}
}

func TestMounterReconcile(t *testing.T) {
	requireRoot(t)
	s := newStore(t)
	ctx := context.Background()
	img, err := s.Import(ctx, writeDockerArchive(t, testImage(t, "amd64")), "x")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "mnt")
	m1, _ := NewMounter(dir, s)
	if _, err := m1.Acquire("live", img.Layers[:1]); err != nil {
		t.Fatal(err)
	}
	if _, err := m1.Acquire("dead", img.Layers); err != nil {
		t.Fatal(err)
	}
	// A crashed edge: m1 is forgotten with its mounts in place; a stray
	// directory and a doubly-mounted point are left too.
	_ = os.Mkdir(filepath.Join(dir, "stray"), 0o755)
	top := filepath.Join(dir, strings.TrimPrefix(img.Layers[1], "sha256:"))
	if err := unix.Mount(s.BlobPath(img.Layers[1]), top, "erofs", unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	m2, _ := NewMounter(dir, s)
	t.Cleanup(func() { _ = m2.Close() })
	if err := m2.Reconcile(map[string][]string{"live": img.Layers[:1]}); err != nil {
		t.Fatal(err)
	}
	got := erofsMounts(t, dir)
	if len(got) != 1 {
		t.Fatalf("after reconcile: %v", got)
	}
	if !m2.InUse(strings.TrimPrefix(img.Layers[0], "sha256:")) || m2.InUse(strings.TrimPrefix(img.Layers[1], "sha256:")) {
		t.Fatal("references not rebuilt")
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("mount points: %v", ents)
	}
	if err := m2.Close(); err != nil {
		t.Fatal(err)
	}
	if got := erofsMounts(t, dir); len(got) != 0 {
		t.Fatalf("after close: %v", got)
	}
}

// TestMigrateUnpackedStore opens a store of the first format (unpacked
// layer directories) and finds every image working from EROFS layers.
func TestMigrateUnpackedStore(t *testing.T) {
	requireRoot(t)
	dir := filepath.Join(t.TempDir(), "images")
	// Build the old layout by hand: one layer dir in overlay form.
	h := strings.Repeat("ab", 32)
	ldir := filepath.Join(dir, "layers", "sha256", h)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(ldir, "etc"), 0o755))
	must(os.MkdirAll(filepath.Join(ldir, "opq"), 0o755))
	must(os.WriteFile(filepath.Join(ldir, "etc/hello"), []byte("hi"), 0o644))
	must(unix.Mknod(filepath.Join(ldir, "etc/gone"), unix.S_IFCHR, 0))
	must(unix.Setxattr(filepath.Join(ldir, "opq"), "trusted.overlay.opaque", []byte("y"), 0))
	must(os.WriteFile(ldir+".json", []byte(`{"size":2048}`), 0o644))
	must(os.MkdirAll(filepath.Join(dir, "images"), 0o755))
	old := Image{Name: "old", Layers: []string{"sha256:" + h}, Size: 2048, CreatedAt: time.Now().UTC()}
	old.Digest = digestOf(old.Config, old.Layers)
	b, _ := json.Marshal(old)
	must(os.WriteFile(filepath.Join(dir, "images", "old.json"), b, 0o644))

	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "layers")); !os.IsNotExist(err) {
		t.Fatalf("old layer directories kept: %v", err)
	}
	img, dirs := mountImage(t, s, "old")
	if img.Digest != old.Digest {
		t.Fatalf("digest changed: %s", img.Digest)
	}
	if b, err := os.ReadFile(filepath.Join(dirs[0], "etc/hello")); err != nil || string(b) != "hi" {
		t.Fatalf("etc/hello: %q %v", b, err)
	}
	if st := lstat(t, filepath.Join(dirs[0], "etc/gone")); st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Fatal("whiteout lost")
	}
	if !isOpaque(filepath.Join(dirs[0], "opq")) {
		t.Fatal("opaque marker lost")
	}
	if m, err := s.layerMeta(h); err != nil || m.Size != 2048 || m.ErofsSize == 0 {
		t.Fatalf("meta %+v %v", m, err)
	}
	// Opening again is a no-op.
	if _, err := Open(dir); err != nil {
		t.Fatal(err)
	}
}
