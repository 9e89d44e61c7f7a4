package image

import (
	"archive/tar"
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

type ent struct {
	name   string
	typ    byte
	body   string
	link   string
	mode   int64
	uid    int
	xattrs map[string]string
}

func dirE(n string) ent             { return ent{name: n, typ: tar.TypeDir, mode: 0o755} }
func fileE(n, body string) ent      { return ent{name: n, typ: tar.TypeReg, body: body, mode: 0o644} }
func symE(n, target string) ent     { return ent{name: n, typ: tar.TypeSymlink, link: target, mode: 0o777} }
func hardE(n, target string) ent    { return ent{name: n, typ: tar.TypeLink, link: target} }
func modeE(e ent, mode int64) ent   { e.mode = mode; return e }
func ownerE(e ent, uid int) ent     { e.uid = uid; return e }
func xattrE(e ent, k, v string) ent { e.xattrs = map[string]string{k: v}; return e }

func mkTar(t testing.TB, ents ...ent) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Uid: e.uid, Gid: e.uid,
			Size: int64(len(e.body)), ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func layerOf(t testing.TB, b []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// testImage is a two-layer image whose upper layer deletes etc/a (a
// whiteout), replaces d/ (opaque) and adds a setuid binary.
func testImage(t testing.TB, arch string) v1.Image {
	t.Helper()
	lower := mkTar(t, dirE("etc/"), fileE("etc/a", "a"), fileE("etc/b", "b"), dirE("d/"), fileE("d/x", "x"), fileE("d/y", "y"))
	upper := mkTar(t, dirE("etc/"), fileE("etc/.wh.a", ""), dirE("d/"), fileE("d/.wh..wh..opq", ""), fileE("d/z", "z"),
		dirE("bin/"), ownerE(modeE(fileE("bin/su", "#!"), 0o4755), 0), modeE(fileE("bin/sg", "#!"), 0o2711))
	img, err := mutate.AppendLayers(empty.Image, layerOf(t, lower), layerOf(t, upper))
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Env = []string{"PATH=/bin", "ARCH=" + arch}
	cf.Config.Cmd = []string{"/bin/sh"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func newStore(t testing.TB) *LocalStore {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	// Private images and snapshots: only root may enter the store.
	if st, err := os.Stat(s.Dir()); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("store directory: %v %v", st.Mode(), err)
	}
	return s
}

// visible lists what a store shows: layer dirs, image files, tmp entries.
func visible(t testing.TB, s *LocalStore) (layers, images, tmp []string) {
	t.Helper()
	ls := func(d string) []string {
		ents, err := os.ReadDir(filepath.Join(s.Dir(), d))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range ents {
			out = append(out, e.Name())
		}
		sort.Strings(out)
		return out
	}
	for _, n := range ls("blobs/sha256") {
		if filepath.Ext(n) == ".erofs" {
			layers = append(layers, n)
		}
	}
	return layers, ls("images"), ls("tmp")
}

// mountImage resolves name and mounts its layers (top-most first) for the
// test; they are unmounted when it ends.
func mountImage(t testing.TB, s *LocalStore, name string) (*Image, []string) {
	t.Helper()
	img, _, err := s.Resolve(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewMounter(filepath.Join(t.TempDir(), "mnt"), s)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, 0, len(img.Layers))
	for i := len(img.Layers) - 1; i >= 0; i-- {
		ids = append(ids, img.Layers[i])
	}
	dirs, err := m.Acquire("test", ids)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	})
	return img, dirs
}

func lstat(t testing.TB, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

func requireRoot(t testing.TB) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root (chown, mknod, trusted xattrs)")
	}
}
