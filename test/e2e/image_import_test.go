package e2e

import (
	"archive/tar"
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/warrenhq/warren/api"
)

// rootfsTar is a root filesystem tarball: the host's static busybox as
// /bin/busybox and /bin/sh, and a marker file.
func rootfsTar(t *testing.T) []byte {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("SKIP would hide this: the e2e tests need the host's static busybox: %v", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range []*tar.Header{
		{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb))},
		{Name: "bin/sh", Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777},
		{Name: "bin/cat", Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777},
		{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "etc/marker", Typeflag: tar.TypeReg, Mode: 0o644, Size: 9},
		{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		switch h.Name {
		case "bin/busybox":
			tw.Write(bb)
		case "etc/marker":
			tw.Write([]byte("uploaded\n"))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// TestImageImportUpload imports a root filesystem tarball through the API
// (the CLI's default): the server stores it, a sandbox runs it; bad input
// is a 4xx.
func TestImageImportUpload(t *testing.T) {
	parallel(t)
	s := startServer(t)
	p := filepath.Join(t.TempDir(), "rootfs.tar")
	if err := os.WriteFile(p, rootfsTar(t), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := s.warren(t, "image", "import", p, "--name", "up/rootfs:1")
	if err != nil || !strings.Contains(out, "up/rootfs:1 sha256:") {
		t.Fatalf("import: %v\n%s", err, out)
	}
	sb := s.create(t, api.CreateSandboxRequest{Image: "up/rootfs:1"})
	if r := s.sh(t, sb.ID, "cat /etc/marker"); r.ExitCode != 0 || r.Stdout != "uploaded\n" {
		t.Fatalf("sandbox of the uploaded image: %+v", r)
	}
	// A build FROM it: the image sets no PATH, so $PATH in an ENV is the
	// sandbox's default one.
	bdir := t.TempDir()
	writeFiles(t, bdir, map[string]string{"Dockerfile": "FROM up/rootfs:1\nENV PATH=/opt/bin:$PATH\nRUN echo $PATH > /path.txt\n"})
	if out, err := s.warren(t, "image", "build", "-t", "up/built", bdir); err != nil {
		t.Fatalf("build FROM the uploaded image: %v\n%s", err, out)
	}
	built := s.create(t, api.CreateSandboxRequest{Image: "up/built"})
	want := "/opt/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
	if r := s.sh(t, built.ID, "cat /path.txt; echo $PATH"); r.Stdout != want+want {
		t.Fatalf("PATH in the build and in the image: %q, want %q twice", r.Stdout, want)
	}
	// A directory is sent as a tar.
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"etc/marker": "from a dir\n"})
	if out, err := s.warren(t, "image", "import", dir, "--name", "up/dir"); err != nil {
		t.Fatalf("import a directory: %v\n%s", err, out)
	}
	// An OCI layout directory is sent as an OCI archive; its config comes
	// along.
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(rootfsTar(t))), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin", "FROM_LAYOUT=yes"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	lp, err := layout.Write(t.TempDir(), empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	if out, err := s.warren(t, "image", "import", string(lp), "--name", "up/layout"); err != nil {
		t.Fatalf("import an OCI layout: %v\n%s", err, out)
	}
	ls := s.create(t, api.CreateSandboxRequest{Image: "up/layout"})
	if r := s.sh(t, ls.ID, "echo $FROM_LAYOUT; cat /etc/marker"); r.Stdout != "yes\nuploaded\n" {
		t.Fatalf("sandbox of the OCI layout: %+v", r)
	}
	for _, tc := range []struct {
		path string
		body []byte
	}{
		{"/v1/images:import?name=" + "bad%20name", []byte("x")},
		{"/v1/images:import", []byte("x")},
		{"/v1/images:import?name=up/empty", nil},
		{"/v1/images:import?name=up/garbage", bytes.Repeat([]byte("not an archive "), 100)},
	} {
		code, resp := s.rawRequest(t, http.MethodPost, tc.path, "", tc.body, map[string]string{"Content-Type": "application/x-tar"})
		if code < 400 || code >= 500 {
			t.Errorf("POST %s: %d %s", tc.path, code, resp)
		}
	}
}

// TestDebianImage checks the bundled debian:12 image (the tarball of
// scripts/build-debian-image.sh named by WARREN_DEBIAN_TAR; building it
// takes minutes): the tools an agent reaches for are there, and the Python
// standard library is byte-compiled, so importing it writes nothing.
func TestDebianImage(t *testing.T) {
	parallel(t)
	p := os.Getenv("WARREN_DEBIAN_TAR")
	if p == "" {
		t.Skip("SKIP: set WARREN_DEBIAN_TAR to the output of scripts/build-debian-image.sh")
	}
	s := startServer(t)
	t0 := time.Now()
	out, err := s.warren(t, "image", "import", p, "--name", "debian:12")
	if err != nil {
		t.Fatalf("import: %v\n%s", err, out)
	}
	t.Logf("imported through the API in %v: %s", time.Since(t0), out)
	sb := s.create(t, api.CreateSandboxRequest{Image: "debian:12", CPU: 0.5})
	for _, cmd := range []string{
		"git --version", "curl --version", "ps -e", "less --version", "patch --version", "diff --version",
		"cmp --version", "xz --version", "bzip2 --help", "unzip -v", "bash --version",
		"test -s /etc/ssl/certs/ca-certificates.crt",
		"python3 -m venv /tmp/venv && /tmp/venv/bin/python -c 'import sys; print(sys.prefix)'",
	} {
		if r := s.sh(t, sb.ID, cmd); r.ExitCode != 0 {
			t.Errorf("%s: exit %d\n%s%s", cmd, r.ExitCode, r.Stdout, r.Stderr)
		}
	}
	// Importing the standard library loads byte-code and compiles nothing:
	// in a fresh sandbox, the first `python3 -m unittest` (timed), then
	// python's own report of the byte-code it wrote, then the __pycache__
	// directories that appeared.
	fresh := s.create(t, api.CreateSandboxRequest{Image: "debian:12", CPU: 0.5})
	first := s.sh(t, fresh.ID, "cd /tmp && python3 -m unittest")
	if first.ExitCode != 0 {
		t.Errorf("python3 -m unittest: %+v", first)
	}
	t.Logf("first python3 -m unittest in a fresh sandbox at 0.5 CPU: %.0f ms", first.DurationMs)
	r := s.sh(t, fresh.ID, `python3 -v -c 'import json, unittest, asyncio, email.mime.text, http.client, venv' 2>&1 | grep -c "^# created" || true
find / -xdev -name __pycache__ -newer /etc/hostname 2>/dev/null | wc -l
find /usr/lib/python3.11 -name '*.pyc' | wc -l`)
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) != 3 {
		t.Fatalf("python check: %+v", r)
	}
	created, newCache, pycs := lines[0], lines[1], lines[2]
	if created != "0" || newCache != "0" {
		t.Errorf("python compiled the standard library in the sandbox: %s modules written, %s new __pycache__ dirs", created, newCache)
	}
	if n, err := strconv.Atoi(pycs); err != nil || n < 500 {
		t.Errorf("%s .pyc files in the image's standard library, want hundreds", pycs)
	}
}
