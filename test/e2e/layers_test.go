package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// layerMounts lists the erofs mounts of server s (mount point -> source).
func layerMounts(t *testing.T, s *server) map[string]string {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(mi), "\n") {
		f := strings.Fields(l)
		for i := range f {
			if f[i] == "-" && i+2 < len(f) && f[i+1] == "erofs" && strings.HasPrefix(f[4], s.dataDir+"/") {
				out[f[4]] = f[i+2]
			}
		}
	}
	return out
}

func loopDevices(t *testing.T) int {
	out, _ := exec.Command("losetup", "-a").Output()
	return len(strings.Fields(string(out)))
}

// TestLayerMountsShared: every sandbox of an image uses the one file-backed
// mount of each layer; the mounts go with the last sandbox, and a kill -9
// of the server leaks none of them.
// waitNoLayerMounts waits (10 s at most) until no layer is mounted.
func waitNoLayerMounts(t *testing.T, s *server, when string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for m := layerMounts(t, s); len(m) != 0; m = layerMounts(t, s) {
		if time.Now().After(deadline) {
			t.Fatalf("layer mounts %s: %v", when, m)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestLayerMountsShared(t *testing.T) {
	// Not parallel: it counts the host's loop devices, and every server
	// that starts attaches one (its scratch filesystem, internal/scratch).
	// Recycled containers hold their fresh roots' layers until they
	// expire, after a second here.
	s := startServer(t, "--recycle-idle", "1s")
	ctx := context.Background()
	loops := loopDevices(t)
	var ids []string
	for i := 0; i < 3; i++ {
		ids = append(ids, s.create(t, api.CreateSandboxRequest{}).ID)
	}
	m := layerMounts(t, s)
	if len(m) != 1 {
		t.Fatalf("busybox has one layer; want one shared mount, got %v", m)
	}
	for p, src := range m {
		if !strings.HasPrefix(src, "/proc/self/fd/") { // the blob, by descriptor: no host path
			t.Fatalf("%s mounted from %s, not file-backed", p, src)
		}
	}
	if n := loopDevices(t); n != loops {
		t.Fatalf("loop devices %d -> %d", loops, n)
	}
	for _, id := range ids {
		if r := s.sh(t, id, "echo hi > /tmp/x && cat /tmp/x && ls /bin/busybox"); r.ExitCode != 0 || !strings.HasPrefix(r.Stdout, "hi\n") {
			t.Fatalf("exec: %+v", r)
		}
	}
	// The sandbox cannot write to the layer: its changes go to its own upper dir.
	if r := s.sh(t, ids[0], "rm /bin/ls && ls /bin/ls"); r.ExitCode == 0 {
		t.Fatalf("rm in sandbox 0: %+v", r)
	}
	if r := s.sh(t, ids[1], "ls /bin/ls"); r.ExitCode != 0 {
		t.Fatalf("another sandbox lost /bin/ls: %+v", r)
	}
	if _, err := s.C.Delete(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if len(layerMounts(t, s)) != 1 {
		t.Fatal("layer unmounted while in use")
	}
	// kill -9: the mount stays behind, the restart adopts the two live
	// sandboxes and keeps exactly their mount.
	s.kill9()
	s.start()
	if m := layerMounts(t, s); len(m) != 1 {
		t.Fatalf("after restart: %v", m)
	}
	if r := s.sh(t, ids[2], "cat /tmp/x"); r.Stdout != "hi\n" {
		t.Fatalf("adopted sandbox: %+v", r)
	}
	for _, id := range ids[1:] {
		if _, err := s.C.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	waitNoLayerMounts(t, s, "after the last sandbox and its recycled container")
	s.stop()
	assertNoLeaks(t, s)
}

// tarOf builds a layer tarball of (name, body) regular files; a body of
// "<dir>" makes a directory.
func tarOf(t *testing.T, files ...[2]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f[0], Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(f[1])), ModTime: time.Unix(1700000000, 0)}
		if f[1] == "<dir>" {
			h.Typeflag, h.Size, h.Mode = tar.TypeDir, 0, 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(f[1]))
		}
	}
	tw.Close()
	return buf.Bytes()
}

func (s *server) warren(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bins.warren, append([]string{"--url", s.URL, "--token", s.Token}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestNamedLayers(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()

	// From a tarball over the API: versions count up.
	l1, err := s.C.CreateLayerFromTar(ctx, "ws/demo", 0, bytes.NewReader(tarOf(t, [2]string{"work/", "<dir>"}, [2]string{"work/a.txt", "one"})))
	if err != nil {
		t.Fatal(err)
	}
	if l1.Name != "ws/demo" || l1.Version != 1 || l1.StoredSize == 0 || l1.Source != "tar" {
		t.Fatalf("layer %+v", l1)
	}
	l2, err := s.C.CreateLayerFromTar(ctx, "ws/demo", 0, bytes.NewReader(tarOf(t, [2]string{"work/a.txt", "two"})))
	if err != nil || l2.Version != 2 {
		t.Fatalf("second version: %+v %v", l2, err)
	}
	// The same version again: same content is fine, other content conflicts.
	if again, err := s.C.CreateLayerFromTar(ctx, "ws/demo", 2, bytes.NewReader(tarOf(t, [2]string{"work/a.txt", "two"}))); err != nil || again.Digest != l2.Digest {
		t.Fatalf("idempotent create: %+v %v", again, err)
	}
	if _, err := s.C.CreateLayerFromTar(ctx, "ws/demo", 2, bytes.NewReader(tarOf(t, [2]string{"x", "y"}))); !isCode(err, api.CodeConflict) {
		t.Fatalf("conflicting version: %v", err)
	}
	if got, err := s.C.Layer(ctx, "ws/demo"); err != nil || got.Version != 2 {
		t.Fatalf("latest: %+v %v", got, err)
	}
	if got, err := s.C.Layer(ctx, "ws/demo@1"); err != nil || got.Digest != l1.Digest {
		t.Fatalf("@1: %+v %v", got, err)
	}

	// From a directory with the CLI.
	dir := t.TempDir()
	os.MkdirAll(dir+"/opt/tk/bin", 0o755)
	os.WriteFile(dir+"/opt/tk/bin/hello", []byte("#!/bin/sh\necho hello from toolkit\n"), 0o755)
	if out, err := s.warren(t, "layer", "create", "--from-dir", dir, "--name", "toolkit/t", "--version", "3"); err != nil || !strings.HasPrefix(out, "toolkit/t@3 ") {
		t.Fatalf("cli create: %q %v", out, err)
	}
	if out, err := s.warren(t, "layer", "ls"); err != nil || !strings.Contains(out, "toolkit/t") || !strings.Contains(out, "ws/demo") {
		t.Fatalf("cli ls: %q %v", out, err)
	}

	// From a sandbox: an environment builder runs its setup and packs it.
	sb := s.create(t, api.CreateSandboxRequest{})
	s.sh(t, sb.ID, "mkdir -p /srv/app && echo built > /srv/app/out && rm /bin/vi && chmod u+s /bin/busybox && touch /srv/app/suid && chmod 4755 /srv/app/suid")
	if out, err := s.warren(t, "layer", "create", "--from-sandbox", sb.ID, "--name", "ws/built"); err != nil {
		t.Fatalf("from sandbox: %q %v", out, err)
	}
	lb, err := s.C.Layer(ctx, "ws/built@1")
	if err != nil || !strings.HasPrefix(lb.Source, "sandbox ") {
		t.Fatalf("built layer %+v %v", lb, err)
	}

	// Bad input: clear 4xx, nothing half-written.
	bad := []struct {
		name string
		body []byte
		code string
	}{
		{"Bad_Name", tarOf(t, [2]string{"a", "b"}), api.CodeInvalid},
		{"ws/../x", tarOf(t, [2]string{"a", "b"}), api.CodeInvalid},
		{"ws/trunc", tarOf(t, [2]string{"a", strings.Repeat("x", 4096)})[:1000], api.CodeInvalid},
		{"ws/garbage", []byte("this is not a tar archive at all, not even close.............."), api.CodeInvalid},
		{"ws/escape", tarOf(t, [2]string{"../../etc/evil", "x"}), api.CodeInvalid},
		{"ws/abs", tarOf(t, [2]string{"/etc/evil", "x"}), api.CodeInvalid},
		{"ws/empty", nil, api.CodeBadRequest},
	}
	for _, b := range bad {
		if _, err := s.C.CreateLayerFromTar(ctx, b.name, 0, bytes.NewReader(b.body)); !isCode(err, b.code) {
			t.Errorf("%s: want %s, got %v", b.name, b.code, err)
		}
	}
	for _, ref := range []string{"ws/nope", "ws/demo@9"} {
		if _, err := s.C.Layer(ctx, ref); !isCode(err, api.CodeNotFound) {
			t.Errorf("%s: %v", ref, err)
		}
	}
	if _, err := s.C.Layer(ctx, "ws/demo@x"); !isCode(err, api.CodeInvalid) {
		t.Errorf("bad version: %v", err)
	}
	if _, err := s.C.CreateLayerFromSandbox(ctx, "sb-e2e-nope", "ws/x", 0); !isCode(err, api.CodeNotFound) {
		t.Errorf("unknown sandbox: %v", err)
	}
	ls, err := s.C.Layers(ctx, "")
	if err != nil || len(ls) != 4 {
		t.Fatalf("layers after bad input: %d %v", len(ls), err)
	}
	if ents, _ := os.ReadDir(s.dataDir + "/images/tmp"); len(ents) != 0 {
		t.Fatalf("tmp left: %v", ents)
	}

	// Delete one version, then the name; gc keeps what images use.
	if gone, err := s.C.DeleteLayer(ctx, "ws/demo@1"); err != nil || len(gone) != 1 {
		t.Fatalf("delete @1: %v %v", gone, err)
	}
	if _, err := s.C.DeleteLayer(ctx, "ws/demo@1"); !isCode(err, api.CodeNotFound) {
		t.Fatalf("second delete: %v", err)
	}
	if out, err := s.warren(t, "layer", "rm", "ws/demo"); err != nil || out != "ws/demo@2\n" {
		t.Fatalf("cli rm: %q %v", out, err)
	}
	if r, err := s.C.GCLayers(ctx); err != nil || len(r.Removed) != 0 {
		t.Fatalf("gc after deletes: %+v %v", r, err)
	}
}

func isCode(err error, code string) bool {
	var ae *warren.APIError
	return errors.As(err, &ae) && ae.Code == code
}

func TestCompositionAndProtectedToolkit(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	mk := func(name string, body []byte) {
		t.Helper()
		if _, err := s.C.CreateLayerFromTar(ctx, name, 0, bytes.NewReader(body)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	mk("ws/base", tarOf(t, [2]string{"work/", "<dir>"}, [2]string{"work/a", "1"}, [2]string{"work/b", "b"}))
	mk("ws/base", tarOf(t, [2]string{"work/a", "2"}))
	// An upper layer: deletes work/b (OCI whiteout), adds work/c.
	mk("ws/over", tarOf(t, [2]string{"work/", "<dir>"}, [2]string{"work/.wh.b", ""}, [2]string{"work/c", "c"}))

	sb := s.create(t, api.CreateSandboxRequest{Layers: []api.LayerAttachment{{Layer: "ws/base@1"}, {Layer: "ws/over"}}})
	if len(sb.Layers) != 2 || sb.Layers[0] != "ws/base@1" || sb.Layers[1] != "ws/over@1" {
		t.Fatalf("sandbox layers %v", sb.Layers)
	}
	r := s.sh(t, sb.ID, "echo $(cat /work/a); ls /work; ls /bin/busybox")
	if r.Stdout != "1\na\nc\n/bin/busybox\n" {
		t.Fatalf("composed root: %q %q", r.Stdout, r.Stderr)
	}
	if r := s.sh(t, sb.ID, "echo x > /work/a && cat /work/a"); r.Stdout != "x\n" {
		t.Fatalf("write over a layer: %+v", r)
	}

	// Unknown layers and bad attachments: clear errors.
	for _, c := range []struct {
		l    []api.LayerAttachment
		code string
	}{
		{[]api.LayerAttachment{{Layer: "ws/none"}}, api.CodeNotFound},
		{[]api.LayerAttachment{{Layer: "ws/base@7"}}, api.CodeNotFound},
		{[]api.LayerAttachment{{Layer: "WS"}}, api.CodeInvalid},
		{[]api.LayerAttachment{{Layer: "ws/base", Mount: "relative"}}, api.CodeInvalid},
		{[]api.LayerAttachment{{Layer: "ws/base", Mount: "/proc/x"}}, api.CodeInvalid},
		{[]api.LayerAttachment{{Layer: "ws/base", Mount: "/a/../b"}}, api.CodeInvalid},
		{[]api.LayerAttachment{{Layer: "ws/base", Protected: true}}, api.CodeInvalid},
		{[]api.LayerAttachment{{Layer: "ws/base", Mount: "/x"}, {Layer: "ws/over", Mount: "/x/y"}}, api.CodeInvalid},
	} {
		if _, err := s.C.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Layers: c.l}); !isCode(err, c.code) {
			t.Errorf("%+v: want %s, got %v", c.l, c.code, err)
		}
	}
	if code, body := s.rawRequest(t, "POST", "/v1/sandboxes", "", []byte(`{"image":"busybox","layers":[{"layer":"ws/base","bogus":1}]}`), nil); code != 400 {
		t.Errorf("unknown attachment field: %d %s", code, body)
	}

	// A toolkit: a static busybox of its own.
	dir := t.TempDir()
	os.MkdirAll(dir+"/bin", 0o755)
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("SKIP: no /bin/busybox")
	}
	os.WriteFile(dir+"/bin/busybox", bb, 0o755)
	os.Symlink("busybox", dir+"/bin/sh")
	os.WriteFile(dir+"/bin/grade", []byte("#!/opt/toolkit/bin/sh\necho graded by toolkit\n"), 0o755)
	if out, err := s.warren(t, "layer", "create", "--from-dir", dir, "--name", "toolkit/h"); err != nil {
		t.Fatalf("toolkit: %q %v", out, err)
	}
	tk := s.create(t, api.CreateSandboxRequest{Layers: []api.LayerAttachment{{Layer: "ws/base"}, {Layer: "toolkit/h", Mount: "/opt/toolkit", Protected: true}}})
	if r := s.sh(t, tk.ID, "echo $(cat /work/a); /opt/toolkit/bin/grade"); r.Stdout != "2\ngraded by toolkit\n" {
		t.Fatalf("toolkit sandbox: %+v", r)
	}
	// Root in the sandbox cannot modify, remount, unmount or shadow it.
	for _, attack := range []string{
		"touch /opt/toolkit/x",
		"rm -f /opt/toolkit/bin/grade",
		"echo evil > /opt/toolkit/bin/grade",
		"mount -o remount,rw /opt/toolkit",
		"umount /opt/toolkit",
		"umount -l /opt/toolkit",
		"mv /opt/toolkit /opt/other",
		"mv /opt /opt2",
		"rm -rf /opt",
		"mount -t tmpfs none /opt/toolkit",
		"mount --bind /tmp /opt",
	} {
		if r := s.sh(t, tk.ID, attack+" 2>&1; test -x /opt/toolkit/bin/grade && /opt/toolkit/bin/grade"); r.Stdout == "" || !strings.HasSuffix(r.Stdout, "graded by toolkit\n") {
			t.Errorf("after %q the toolkit is gone or changed: %+v", attack, r)
		}
	}
	// The agent under test replaces the sandbox's shell and busybox.
	if r := s.sh(t, tk.ID, "cp /bin/busybox /tmp/busybox && /tmp/busybox rm -f /bin/sh /bin/busybox && printf '#!/tmp/busybox sh\\necho pwned\\n' > /bin/busybox && /tmp/busybox chmod 755 /bin/busybox && /tmp/busybox ln -s busybox /bin/sh"); r.ExitCode != 0 {
		t.Fatalf("replace: %+v", r)
	}
	if r, err := s.C.Exec(ctx, tk.ID, api.ExecRequest{Argv: []string{"sh", "-c", "echo hi"}}); err != nil || r.Stdout != "pwned\n" {
		t.Fatalf("the sandbox's own shell was not replaced: %+v %v", r, err)
	}
	// The trusted shell is not dumpable, so a child cannot read its
	// /proc/$$/exe: readlink shows its own program (the toolkit's busybox,
	// first on PATH). The sandbox's own shell would have printed "pwned".
	r, err = s.C.Exec(ctx, tk.ID, api.ExecRequest{Cmd: "echo $PATH; readlink /proc/self/exe; grade; echo $(cat /work/a)", Trusted: true, Session: "default"})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(r.Stdout, "\n")
	if r.ExitCode != 0 || len(lines) < 4 || !strings.HasPrefix(lines[0], "/opt/toolkit/bin:") ||
		lines[1] != "/opt/toolkit/bin/busybox" || lines[2] != "graded by toolkit" || lines[3] != "2" {
		t.Fatalf("trusted exec: %+v", r)
	}
	r, err = s.C.Exec(ctx, tk.ID, api.ExecRequest{Argv: []string{"grade"}, Trusted: true})
	if err != nil || r.Stdout != "graded by toolkit\n" {
		t.Fatalf("trusted argv: %+v %v", r, err)
	}
	if _, err := s.C.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "true", Trusted: true}); !isCode(err, api.CodeBadRequest) {
		t.Fatalf("trusted without a toolkit: %v", err)
	}
}

// TestLayerFromSandboxComposes: a builder's changes, packed and stacked on
// the same base, reproduce its root: deletions and opaque directories
// honoured, privileges the base did not have dropped.
func TestLayerFromSandboxComposes(t *testing.T) {
	parallel(t)
	s := startServer(t)
	ctx := context.Background()
	b := s.create(t, api.CreateSandboxRequest{})
	s.sh(t, b.ID, "mkdir -p /srv/app && echo built > /srv/app/out && rm /bin/vi && rm -rf /home && mkdir /home && echo new > /home/only && "+
		"touch /srv/app/suid && chmod 4755 /srv/app/suid && mkfifo /srv/app/fifo")
	l, err := s.C.CreateLayerFromSandbox(ctx, b.ID, "ws/built", 0)
	if err != nil {
		t.Fatal(err)
	}
	if l.Version != 1 || !strings.HasPrefix(l.Source, "sandbox "+b.ID) {
		t.Fatalf("layer %+v", l)
	}
	sb := s.create(t, api.CreateSandboxRequest{Layers: []api.LayerAttachment{{Layer: "ws/built"}}})
	r := s.sh(t, sb.ID, "cat /srv/app/out; ls /bin/vi; ls /home; stat -c %a /srv/app/suid; test -p /srv/app/fifo && echo fifo")
	if r.Stdout != "built\nonly\n755\nfifo\n" {
		t.Fatalf("composed from a sandbox: %q %q", r.Stdout, r.Stderr)
	}
	// A device node in the changes cannot be packed. In a user namespace
	// the sandbox cannot make one at all.
	if r := s.sh(t, b.ID, "mknod /srv/app/disk b 7 0"); r.ExitCode != 0 {
		if !strings.Contains(r.Stderr, "not permitted") {
			t.Fatalf("mknod: %+v", r)
		}
		return
	}
	if _, err := s.C.CreateLayerFromSandbox(ctx, b.ID, "ws/built", 0); !isCode(err, api.CodeInvalid) {
		t.Fatalf("device node packed: %v", err)
	}
}

// TestImagePull pulls from go-containerregistry's in-memory registry on
// loopback and runs the image.
func TestImagePull(t *testing.T) {
	parallel(t)
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("SKIP: no /bin/busybox")
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb))})
	tw.Write(bb)
	tw.WriteHeader(&tar.Header{Name: "bin/sh", Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777})
	tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "etc/pulled", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3})
	tw.Write([]byte("yes"))
	tw.Close()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/bin", "PULLED=1"}})
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := name.ParseReference(host + "/tools/bb:1")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}

	s := startServer(t)
	ctx := context.Background()
	got, err := s.C.PullImage(ctx, ref.String(), "bb")
	if err != nil {
		t.Fatal(err)
	}
	if got.Name != "bb" || len(got.Layers) != 1 {
		t.Fatalf("pulled %+v", got)
	}
	if out, err := s.warren(t, "image", "pull", ref.String()); err != nil || !strings.HasPrefix(out, ref.String()+" sha256:") {
		t.Fatalf("cli pull: %q %v", out, err)
	}
	sb := s.create(t, api.CreateSandboxRequest{Image: "bb"})
	if r := s.sh(t, sb.ID, "cat /etc/pulled; echo $PULLED"); r.Stdout != "yes1\n" {
		t.Fatalf("pulled image: %+v", r)
	}
	if _, err := s.C.PullImage(ctx, host+"/tools/none:1", ""); !isCode(err, api.CodeNotFound) {
		t.Fatalf("unknown image: %v", err)
	}
	if _, err := s.C.PullImage(ctx, "Bad Ref", ""); !isCode(err, api.CodeInvalid) {
		t.Fatalf("bad ref: %v", err)
	}
	if code, _ := s.rawRequest(t, "POST", "/v1/images", "", []byte(`{}`), nil); code != 422 {
		t.Fatalf("missing ref: %d", code)
	}
}
