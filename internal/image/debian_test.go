package image

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestImportDebianTarball imports the tarball of scripts/build-debian-image.sh
// when WARREN_DEBIAN_TAR names it (the build takes a minute, so it is not
// part of the default run).
func TestImportDebianTarball(t *testing.T) {
	p := os.Getenv("WARREN_DEBIAN_TAR")
	if p == "" {
		t.Skip("SKIP: set WARREN_DEBIAN_TAR to the output of scripts/build-debian-image.sh")
	}
	requireRoot(t)
	s := newStore(t)
	start := time.Now()
	img, err := s.Import(context.Background(), p, "debian:12")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("imported %s (%d bytes) in %v", img.Digest, img.Size, time.Since(start))
	_, dirs := mountImage(t, s, "debian:12")
	out, err := exec.Command("chroot", dirs[0], "/usr/bin/python3", "-c", "print(6*7)").CombinedOutput()
	if err != nil || string(out) != "42\n" {
		t.Fatalf("python3 in the image: %q %v", out, err)
	}
	// The tools an agent reaches for, and the byte-compiled standard
	// library (docs/operations.md, "The bundled debian:12 image").
	for _, p := range []string{"bin/bash", "usr/bin/git", "usr/bin/curl", "usr/bin/ps", "usr/bin/less", "usr/bin/patch",
		"usr/bin/diff", "usr/lib/python3.11/venv/__init__.py", "usr/lib/python3.11/json/__pycache__/__init__.cpython-311.pyc",
		"usr/lib/python3.11/unittest/__pycache__/main.cpython-311.pyc"} {
		if _, err := os.Lstat(filepath.Join(dirs[0], p)); err != nil {
			t.Error(err)
		}
	}
}
