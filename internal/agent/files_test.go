package agent_test

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/agentproto"
)

func (a *testAgent) call(op string, body, out any) error {
	return a.c.Call(ctx(a.t), op, body, out, nil)
}

func (a *testAgent) read(p string) ([]byte, *agentproto.FileInfo, error) {
	var buf bytes.Buffer
	var fi agentproto.FileInfo
	err := a.c.Call(ctx(a.t), agentproto.OpFileRead, &agentproto.PathRequest{Path: p}, &fi, func(r *agentproto.Response) error {
		buf.Write(r.Data)
		return nil
	})
	return buf.Bytes(), &fi, err
}

func TestFileOps(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	var fi agentproto.FileInfo
	// write creates parents; default mode 0644.
	if err := a.call(agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/a/b/c.txt", Data: []byte("hello")}, &fi); err != nil {
		t.Fatal(err)
	}
	if fi.Size != 5 || fi.Mode != 0o644 || fi.Type != "file" || fi.Name != "c.txt" || fi.Path != "/a/b/c.txt" {
		t.Fatalf("write info: %+v", fi)
	}
	if b, _ := os.ReadFile(filepath.Join(a.root, "a/b/c.txt")); string(b) != "hello" {
		t.Fatalf("on disk: %q", b)
	}
	if err := a.call(agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/a/b/c.txt", Data: []byte(" world"), Append: true}, &fi); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 200_000) // 3.2 MB: several chunks
	if err := a.call(agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/big", Data: big, Mode: 0o4755}, &fi); err != nil {
		t.Fatal(err)
	}
	if fi.Mode != 0o755 {
		t.Fatalf("setuid kept: %o", fi.Mode)
	}
	data, rfi, err := a.read("/big")
	if err != nil || !bytes.Equal(data, big) || rfi.Size != int64(len(big)) {
		t.Fatalf("read big: %v len %d %+v", err, len(data), rfi)
	}
	data, _, err = a.read("/a/./b/../b/c.txt")
	if err != nil || string(data) != "hello world" {
		t.Fatalf("read: %v %q", err, data)
	}
	_, _, err = a.read("/a")
	wantCode(t, err, agentproto.ErrIsDir)
	_, _, err = a.read("/nope")
	wantCode(t, err, agentproto.ErrNotFound)
	_, _, err = a.read("a/b/c.txt")
	wantCode(t, err, agentproto.ErrInvalid)
	_, _, err = a.read("/a\x00b")
	wantCode(t, err, agentproto.ErrInvalid)
	wantCode(t, a.call(agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/a/b", Data: []byte("x")}, nil), agentproto.ErrIsDir)
	wantCode(t, a.call(agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/a/b/c.txt/d", Data: []byte("x")}, nil), agentproto.ErrNotDir)

	// stat: lstat semantics.
	os.Symlink("b/c.txt", filepath.Join(a.root, "a/link"))
	if err := a.call(agentproto.OpFileStat, &agentproto.PathRequest{Path: "/a/link"}, &fi); err != nil {
		t.Fatal(err)
	}
	if fi.Type != "symlink" || fi.Target != "b/c.txt" {
		t.Fatalf("stat link: %+v", fi)
	}
	if err := a.call(agentproto.OpFileStat, &agentproto.PathRequest{Path: "/"}, &fi); err != nil || fi.Type != "dir" {
		t.Fatalf("stat /: %v %+v", err, fi)
	}
	data, _, err = a.read("/a/link")
	if err != nil || string(data) != "hello world" {
		t.Fatalf("read via link: %v %q", err, data)
	}

	// mkdir
	if err := a.call(agentproto.OpFileMkdir, &agentproto.MkdirRequest{Path: "/m", Mode: 0o700}, &fi); err != nil || fi.Mode != 0o700 || fi.Type != "dir" {
		t.Fatalf("mkdir: %v %+v", err, fi)
	}
	wantCode(t, a.call(agentproto.OpFileMkdir, &agentproto.MkdirRequest{Path: "/m"}, nil), agentproto.ErrExists)
	wantCode(t, a.call(agentproto.OpFileMkdir, &agentproto.MkdirRequest{Path: "/x/y/z"}, nil), agentproto.ErrNotFound)
	if err := a.call(agentproto.OpFileMkdir, &agentproto.MkdirRequest{Path: "/x/y/z", Parents: true}, &fi); err != nil {
		t.Fatal(err)
	}
	if err := a.call(agentproto.OpFileMkdir, &agentproto.MkdirRequest{Path: "/x/y/z", Parents: true}, &fi); err != nil {
		t.Fatalf("mkdir -p existing: %v", err)
	}

	// list, sorted
	var fl agentproto.FileList
	if err := a.call(agentproto.OpFileList, &agentproto.PathRequest{Path: "/a"}, &fl); err != nil {
		t.Fatal(err)
	}
	if len(fl.Files) != 2 || fl.Files[0].Name != "b" || fl.Files[0].Type != "dir" || fl.Files[1].Name != "link" || fl.Files[1].Path != "/a/link" {
		t.Fatalf("list: %+v", fl)
	}
	wantCode(t, a.call(agentproto.OpFileList, &agentproto.PathRequest{Path: "/big"}, &fl), agentproto.ErrNotDir)

	// rename
	if err := a.call(agentproto.OpFileRename, &agentproto.RenameRequest{From: "/big", To: "/m/big2"}, nil); err != nil {
		t.Fatal(err)
	}
	wantCode(t, a.call(agentproto.OpFileRename, &agentproto.RenameRequest{From: "/big", To: "/m/big3"}, nil), agentproto.ErrNotFound)
	wantCode(t, a.call(agentproto.OpFileRename, &agentproto.RenameRequest{From: "/", To: "/m/root"}, nil), agentproto.ErrInvalid)

	// remove
	wantCode(t, a.call(agentproto.OpFileRemove, &agentproto.RemoveRequest{Path: "/a"}, nil), agentproto.ErrNotEmpty)
	if err := a.call(agentproto.OpFileRemove, &agentproto.RemoveRequest{Path: "/a/link"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(a.root, "a/b/c.txt")); err != nil {
		t.Fatal("removing a symlink removed its target")
	}
	if err := a.call(agentproto.OpFileRemove, &agentproto.RemoveRequest{Path: "/a", Recursive: true}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(a.root, "a")); !os.IsNotExist(err) {
		t.Fatal("recursive remove left /a")
	}
	wantCode(t, a.call(agentproto.OpFileRemove, &agentproto.RemoveRequest{Path: "/a"}, nil), agentproto.ErrNotFound)
	wantCode(t, a.call(agentproto.OpFileRemove, &agentproto.RemoveRequest{Path: "/", Recursive: true}, nil), agentproto.ErrInvalid)
	if err := a.call(agentproto.OpFileRemove, &agentproto.RemoveRequest{Path: "/x"}, nil); !agentproto.IsCode(err, agentproto.ErrNotEmpty) {
		t.Fatalf("remove non-empty: %v", err)
	}
}

// TestSymlinkEscape: symlinks to / or ../.. inside the root resolve inside it.
func TestSymlinkEscape(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	outside := filepath.Join(filepath.Dir(a.root), "outside")
	os.WriteFile(outside, []byte("host secret"), 0o644)
	os.MkdirAll(filepath.Join(a.root, "etc"), 0o755)
	os.WriteFile(filepath.Join(a.root, "etc/hostname"), []byte("sandbox"), 0o644)
	os.Symlink("/", filepath.Join(a.root, "toroot"))
	os.Symlink("../../../../../../etc", filepath.Join(a.root, "up"))
	os.Symlink("../outside", filepath.Join(a.root, "out"))
	os.Symlink("/proc/self/root", filepath.Join(a.root, "magic"))

	data, _, err := a.read("/up/hostname")
	if err != nil || string(data) != "sandbox" {
		t.Fatalf("../ symlink: %v %q", err, data)
	}
	data, _, err = a.read("/toroot/etc/hostname")
	if err != nil || string(data) != "sandbox" {
		t.Fatalf("/ symlink: %v %q", err, data)
	}
	_, _, err = a.read("/out")
	wantCode(t, err, agentproto.ErrNotFound)
	_, _, err = a.read("/../outside")
	wantCode(t, err, agentproto.ErrNotFound)
	_, _, err = a.read("/magic/etc/passwd")
	if err == nil {
		t.Fatal("magic link followed")
	}
	if err := a.call(agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/toroot/written", Data: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(a.root, "written")); err != nil {
		t.Fatal("write through / symlink did not land in the root")
	}
	if _, err := os.Stat("/written"); err == nil {
		os.Remove("/written")
		t.Fatal("write escaped to the host root")
	}
	// Appending through a link that points out resolves inside the root
	// (where its target does not exist).
	err = a.call(agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/out", Data: []byte("x"), Append: true}, nil)
	wantCode(t, err, agentproto.ErrNotFound)
	if b, _ := os.ReadFile(outside); string(b) != "host secret" {
		t.Fatalf("outside file changed: %q", b)
	}
	if err := a.call(agentproto.OpFileMkdir, &agentproto.MkdirRequest{Path: "/up/sub", Parents: true}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(a.root, "etc/sub")); err != nil {
		t.Fatal("mkdir through ../ symlink did not land in the root")
	}
	var fl agentproto.FileList
	if err := a.call(agentproto.OpFileList, &agentproto.PathRequest{Path: "/toroot"}, &fl); err != nil {
		t.Fatal(err)
	}
	names := []string{}
	for _, f := range fl.Files {
		names = append(names, f.Name)
	}
	if !sort.StringsAreSorted(names) || !strings.Contains(strings.Join(names, ","), "toroot") {
		t.Fatalf("list of / via symlink: %v", names)
	}
	// rename into a symlinked dir stays inside.
	if err := a.call(agentproto.OpFileRename, &agentproto.RenameRequest{From: "/written", To: "/up/moved"}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(a.root, "etc/moved")); err != nil {
		t.Fatal("rename through symlink did not land in the root")
	}
}

func tarOf(t *testing.T, entries []tar.Header, bodies map[string]string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		if b, ok := bodies[h.Name]; ok {
			h.Size = int64(len(b))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if b, ok := bodies[h.Name]; ok {
			tw.Write([]byte(b))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// tarPut uploads data in small pieces.
func (a *testAgent) tarPut(dir string, data []byte, piece int) (*agentproto.TarPutResult, error) {
	var res agentproto.TarPutResult
	req := agentproto.TarPutRequest{Path: dir}
	for {
		n := min(piece, len(data))
		req.Data, data = data[:n], data[n:]
		req.Final = len(data) == 0
		if err := a.call(agentproto.OpTarPut, &req, &res); err != nil {
			return nil, err
		}
		req.Handle = res.Handle
		if req.Final {
			return &res, nil
		}
	}
}

func TestTarRoundTrip(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	src := filepath.Join(a.root, "src")
	os.MkdirAll(filepath.Join(src, "d/e"), 0o755)
	os.WriteFile(filepath.Join(src, "f.txt"), []byte("file f"), 0o640)
	os.WriteFile(filepath.Join(src, "d/e/g"), bytes.Repeat([]byte("g"), 600_000), 0o755)
	os.Symlink("../f.txt", filepath.Join(src, "d/l"))

	var tarball bytes.Buffer
	if err := a.c.Call(ctx(t), agentproto.OpTarGet, &agentproto.PathRequest{Path: "/src"}, nil, func(r *agentproto.Response) error {
		if r.Stream != agentproto.StreamData || len(r.Data) > agentproto.ChunkSize {
			t.Errorf("bad chunk %q %d", r.Stream, len(r.Data))
		}
		tarball.Write(r.Data)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(bytes.NewReader(tarball.Bytes()))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == "d/l" && (h.Typeflag != tar.TypeSymlink || h.Linkname != "../f.txt") {
			t.Fatalf("symlink entry: %+v", h)
		}
	}
	if got := strings.Join(names, ","); got != "d/,d/e/,d/e/g,d/l,f.txt" {
		t.Fatalf("tar entries: %s", got)
	}

	res, err := a.tarPut("/dst/x", tarball.Bytes(), 100_000)
	if err != nil {
		t.Fatal(err)
	}
	if res.Files != 5 {
		t.Fatalf("files %d", res.Files)
	}
	dst := filepath.Join(a.root, "dst/x")
	for _, n := range []string{"f.txt", "d/e/g"} {
		want, _ := os.ReadFile(filepath.Join(src, n))
		got, err := os.ReadFile(filepath.Join(dst, n))
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%s differs: %v", n, err)
		}
	}
	if st, _ := os.Stat(filepath.Join(dst, "f.txt")); st.Mode().Perm() != 0o640 {
		t.Fatalf("mode %v", st.Mode())
	}
	if l, _ := os.Readlink(filepath.Join(dst, "d/l")); l != "../f.txt" {
		t.Fatalf("symlink %q", l)
	}

	// A single file tars as its base name.
	tarball.Reset()
	if err := a.c.Call(ctx(t), agentproto.OpTarGet, &agentproto.PathRequest{Path: "/src/f.txt"}, nil, func(r *agentproto.Response) error {
		tarball.Write(r.Data)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	h, err := tar.NewReader(&tarball).Next()
	if err != nil || h.Name != "f.txt" || h.Size != 6 {
		t.Fatalf("single file tar: %v %+v", err, h)
	}
}

func TestTarPutRejects(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	outside := filepath.Join(filepath.Dir(a.root), "escaped")
	cases := map[string][]tar.Header{
		"dotdot":   {{Name: "../escaped", Typeflag: tar.TypeReg, Mode: 0o644}},
		"inner":    {{Name: "a/../../escaped", Typeflag: tar.TypeReg, Mode: 0o644}},
		"absolute": {{Name: "/escaped", Typeflag: tar.TypeReg, Mode: 0o644}},
		"symlink": {
			{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"},
			{Name: "l/escaped", Typeflag: tar.TypeReg, Mode: 0o644},
		},
		"symlinkup": {
			{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../../.."},
			{Name: "l/escaped", Typeflag: tar.TypeReg, Mode: 0o644},
		},
		"hardlink": {{Name: "h", Typeflag: tar.TypeLink, Linkname: "../../escaped"}},
	}
	for name, hs := range cases {
		data := tarOf(t, hs, map[string]string{"../escaped": "x", "a/../../escaped": "x", "/escaped": "x", "l/escaped": "x"})
		_, err := a.tarPut("/t-"+name, data, 1<<20)
		if err == nil {
			t.Errorf("%s: accepted", name)
		} else if !agentproto.IsCode(err, agentproto.ErrInvalid) {
			t.Errorf("%s: %v", name, err)
		}
		for _, p := range []string{outside, filepath.Join(a.root, "escaped"), "/escaped"} {
			if _, err := os.Stat(p); err == nil {
				os.Remove(p)
				t.Errorf("%s: wrote %s", name, p)
			}
		}
	}
	// setuid/setgid bits are dropped; devices are skipped.
	data := tarOf(t, []tar.Header{
		{Name: "suid", Typeflag: tar.TypeReg, Mode: 0o6755},
		{Name: "null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3},
	}, map[string]string{"suid": "#!/bin/sh\n"})
	if _, err := a.tarPut("/t-suid", data, 1<<20); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(a.root, "t-suid/suid"))
	if err != nil || st.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 || st.Mode().Perm() != 0o755 {
		t.Fatalf("suid: %v %v", err, st.Mode())
	}
	if _, err := os.Lstat(filepath.Join(a.root, "t-suid/null")); err == nil {
		t.Fatal("device node extracted")
	}
	wantCode(t, a.call(agentproto.OpTarPut, &agentproto.TarPutRequest{Handle: "tar-nope", Final: true}, nil), agentproto.ErrNotFound)
}

// TestTarPutAtomic: a rejected archive leaves the directory as it was:
// nothing of it extracted (the symlink before the bad entry included), no
// file it would have replaced changed, no staging left behind.
func TestTarPutAtomic(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	dir := filepath.Join(a.root, "t-atomic")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "keep"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	data := tarOf(t, []tar.Header{
		{Name: "keep", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "sub/new", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/"},
		{Name: "l/escaped", Typeflag: tar.TypeReg, Mode: 0o644},
	}, map[string]string{"keep": "new", "sub/new": "x", "l/escaped": "x"})
	if _, err := a.tarPut("/t-atomic", data, 1<<20); !agentproto.IsCode(err, agentproto.ErrInvalid) {
		t.Fatalf("bad archive: %v", err)
	}
	var got []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && p != dir {
			r, _ := filepath.Rel(dir, p)
			got = append(got, r)
		}
		return nil
	})
	if strings.Join(got, " ") != "keep sub" {
		t.Fatalf("after a rejected archive the directory holds %v", got)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "keep")); string(b) != "old" {
		t.Fatalf("keep = %q", b)
	}
	// A good archive still merges into what is there.
	data = tarOf(t, []tar.Header{
		{Name: "keep", Typeflag: tar.TypeReg, Mode: 0o600},
		{Name: "sub/", Typeflag: tar.TypeDir, Mode: 0o750},
		{Name: "sub/new", Typeflag: tar.TypeReg, Mode: 0o644},
		{Name: "sub/hl", Typeflag: tar.TypeLink, Linkname: "sub/new"},
		{Name: "old-hl", Typeflag: tar.TypeLink, Linkname: "keep"},
		{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "sub/new"},
	}, map[string]string{"keep": "new", "sub/new": "x"})
	res, err := a.tarPut("/t-atomic", data, 1<<20)
	if err != nil || res.Files != 6 {
		t.Fatalf("good archive: %+v %v", res, err)
	}
	for p, want := range map[string]string{"keep": "new", "sub/new": "x", "sub/hl": "x", "old-hl": "new", "l": "x"} {
		if b, err := os.ReadFile(filepath.Join(dir, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q %v, want %q", p, b, err, want)
		}
	}
	if st, err := os.Stat(filepath.Join(dir, "sub")); err != nil || st.Mode().Perm() != 0o750 {
		t.Errorf("sub: %v %v", st.Mode(), err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 4 {
		t.Errorf("entries %v", ents)
	}
}

// TestWriteAtOffsets: the writes of one upload, each at its offset, sent
// as payloads together and in reverse order, make the file whole; a write
// at an offset neither creates a file nor writes into a directory.
func TestWriteAtOffsets(t *testing.T) {
	a := startAgent(t, agentproto.SetupConfig{})
	if err := a.call(agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/up/f", Data: []byte("0123")}, nil); err != nil {
		t.Fatal(err)
	}
	const piece, pieces = 1 << 20, 6
	want := bytes.Repeat([]byte("0123"), 1)
	for i := range pieces {
		want = append(want, bytes.Repeat([]byte{byte('a' + i)}, piece)...)
	}
	errs := make(chan error, pieces)
	for i := pieces - 1; i >= 0; i-- {
		go func() {
			off := int64(4 + i*piece)
			errs <- a.c.CallPayload(ctx(t), agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/up/f", At: true, Offset: off},
				want[off:off+piece], nil, nil)
		}()
	}
	for range pieces {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(a.root, "up/f")); !bytes.Equal(got, want) {
		t.Fatalf("file of %d bytes after the offset writes, want the %d written", len(got), len(want))
	}
	wantCode(t, a.call(agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/up/none", At: true, Data: []byte("x")}, nil), agentproto.ErrNotFound)
	wantCode(t, a.call(agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/up", At: true, Data: []byte("x")}, nil), agentproto.ErrIsDir)
	wantCode(t, a.call(agentproto.OpFileWrite, &agentproto.WriteRequest{Path: "/up/f", At: true, Offset: -1, Data: []byte("x")}, nil), agentproto.ErrInvalid)
}
