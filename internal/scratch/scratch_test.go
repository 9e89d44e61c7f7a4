package scratch

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func mounted(t *testing.T, dir string) bool {
	t.Helper()
	m, err := findMount(dir)
	if err != nil {
		t.Fatal(err)
	}
	return m != nil
}

func loopsFor(t *testing.T, img string) string {
	t.Helper()
	out, err := exec.Command("losetup", "-a").Output()
	if err != nil {
		t.Fatal(err)
	}
	var hits []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, img) {
			hits = append(hits, l)
		}
	}
	return strings.Join(hits, "\n")
}

// openLimited opens a 1 GiB scratch space or skips when XFS quota is not
// possible here.
func openLimited(t *testing.T, dir string) *Scratch {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root (loop devices, mount)")
	}
	s, err := Open(context.Background(), dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Limited() {
		s.Close()
		t.Skip("SKIP: no filesystem with project quotas mounts here (this kernel: CONFIG_XFS_QUOTA and CONFIG_QFMT_V2 unset)")
	}
	return s
}

// writeUntilFull writes up to max bytes into p and returns what was
// written and the error that stopped it.
func writeUntilFull(p string, max int64) (int64, error) {
	f, err := os.Create(p)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 1<<20)
	var n int64
	for n < max {
		m, err := f.Write(buf)
		n += int64(m)
		if err != nil {
			f.Close()
			return n, err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return n, err
	}
	return n, f.Close()
}

func TestScratchLimit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "scratch")
	s := openLimited(t, dir)
	closed := false
	t.Cleanup(func() {
		if !closed {
			s.Close()
		}
	})

	start := time.Now()
	const n = 100
	for i := 0; i < n; i++ {
		id := "bench-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if _, err := s.Alloc(id, 1<<20); err != nil {
			t.Fatal(err)
		}
	}
	per := time.Since(start) / n
	t.Logf("Alloc: %v each", per)
	if per > time.Millisecond {
		t.Errorf("Alloc costs %v, want well under 1 ms", per)
	}
	for i := 0; i < n; i++ {
		if err := s.Free("bench-" + string(rune('a'+i%26)) + string(rune('a'+i/26))); err != nil {
			t.Fatal(err)
		}
	}

	sb, err := s.Alloc("sb-1", 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Alloc("sb-1", 8<<20); err == nil {
		t.Fatal("double Alloc succeeded")
	}
	other, err := s.Alloc("sb-2", 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	// Subdirectories inherit the project (overlay upper/work live there).
	if err := os.MkdirAll(filepath.Join(sb, "upper/deep"), 0o755); err != nil {
		t.Fatal(err)
	}
	written, err := writeUntilFull(filepath.Join(sb, "upper/deep/big"), 32<<20)
	if !errors.Is(err, syscall.EDQUOT) && !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("wrote %d bytes past an 8 MiB limit: %v", written, err)
	}
	t.Logf("stopped after %d bytes: %v", written, err)
	used, err := s.Usage("sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if used < 4<<20 || used > 8<<20 {
		t.Fatalf("usage %d, want about the 8 MiB limit", used)
	}
	// The neighbour is unaffected.
	if _, err := writeUntilFull(filepath.Join(other, "f"), 16<<20); err != nil {
		t.Fatalf("neighbour: %v", err)
	}
	if u, _ := s.Usage("sb-2"); u < 16<<20 {
		t.Fatalf("neighbour usage %d", u)
	}

	ids, err := s.List()
	if err != nil || !slices.Equal(ids, []string{"sb-1", "sb-2"}) {
		t.Fatalf("list %v %v", ids, err)
	}
	if err := s.Free("sb-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sb); !os.IsNotExist(err) {
		t.Fatalf("freed dir still there: %v", err)
	}
	if err := s.Free("sb-1"); err != nil {
		t.Fatalf("second Free: %v", err)
	}

	// Close: no mount, no loop device left.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	closed = true
	if mounted(t, dir) {
		t.Fatal("still mounted after Close")
	}
	if l := loopsFor(t, dir+".img"); l != "" {
		t.Fatalf("loop device left: %s", l)
	}

	// Reopen: the same image, sb-2 and its limit are back.
	s2 := openLimited(t, dir)
	defer func() {
		if err := s2.Close(); err != nil {
			t.Error(err)
		}
		if mounted(t, dir) || loopsFor(t, dir+".img") != "" {
			t.Error("mount or loop device left after second Close")
		}
	}()
	if ids, _ := s2.List(); !slices.Equal(ids, []string{"sb-2"}) {
		t.Fatalf("after reopen: %v", ids)
	}
	if u, err := s2.Usage("sb-2"); err != nil || u < 16<<20 {
		t.Fatalf("usage after reopen %d %v", u, err)
	}
	if _, err := writeUntilFull(filepath.Join(other, "g"), 64<<20); !errors.Is(err, syscall.EDQUOT) && !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("limit lost across reopen: %v", err)
	}
	// A new allocation gets a project id (btrfs: subvolume) distinct from sb-2's.
	key := s2.projectOf
	if s2.FSType() == "btrfs" {
		key = func(id string) (uint32, error) { sv, err := s2.subvolID(id); return uint32(sv), err }
	}
	p2, _ := key("sb-2")
	if _, err := s2.Alloc("sb-3", 1<<20); err != nil {
		t.Fatal(err)
	}
	if p3, _ := key("sb-3"); p3 == p2 || p3 == 0 {
		t.Fatalf("project ids %d and %d", p2, p3)
	}
}

func TestScratchReuseMounted(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "scratch")
	s := openLimited(t, dir)
	defer s.Close()
	if _, err := s.Alloc("keep", 1<<20); err != nil {
		t.Fatal(err)
	}
	// A second Open (as after an edge restart without unmount) reuses it.
	s2, err := Open(context.Background(), dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	defer unixCloseOnly(s2) // before s.Close: an open root fd keeps the mount busy
	if !s2.Limited() || s2.loopDev != s.loopDev || s2.FSType() != s.FSType() {
		t.Fatalf("not reused: limited=%v dev %s vs %s", s2.Limited(), s2.loopDev, s.loopDev)
	}
	if s2.FSType() == "btrfs" {
		if ids, err := s2.List(); err != nil || !slices.Equal(ids, []string{"keep"}) {
			t.Fatalf("list after reuse: %v %v", ids, err)
		}
		// The limit still holds through the second handle.
		if _, err := writeUntilFull(filepath.Join(s2.Dir(), "keep", "f"), 8<<20); !errors.Is(err, syscall.EDQUOT) {
			t.Fatalf("limit lost across reuse: %v", err)
		}
		return
	}
	if p, _ := s2.projectOf("keep"); s2.projects[p] != "keep" {
		t.Fatalf("project map not rebuilt: %v", s2.projects)
	}
}

// unixCloseOnly drops s's descriptor without unmounting (the other handle
// owns the mount in this test).
func unixCloseOnly(s *Scratch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	syscall.Close(s.rootfd)
	s.rootfd = -1
	s.closed = true
}

func TestScratchFallback(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "plain")
	// A directory where an image file cannot be created forces the fallback.
	if err := os.MkdirAll(dir+".img", 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := Open(context.Background(), dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Limited() {
		t.Fatal("limited without an image")
	}
	d, err := s.Alloc("a", 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "f"), make([]byte, 8192), 0o644); err != nil {
		t.Fatal(err)
	}
	if u, err := s.Usage("a"); err != nil || u < 8192 {
		t.Fatalf("usage %d %v", u, err)
	}
	if err := s.Free("a"); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", ".", "..", "a/b", ".hidden"} {
		if _, err := s.Alloc(bad, 1); err == nil {
			t.Fatalf("id %q accepted", bad)
		}
	}
}

// TestLoopAutoclear checks the loop device lifecycle without quotas: the
// image mounts through an auto-clearing loop device that disappears with
// the unmount.
func TestLoopAutoclear(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root")
	}
	base := t.TempDir()
	dir, img := filepath.Join(base, "mnt"), filepath.Join(base, "mnt.img")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := makeImage(context.Background(), img, 1<<30, filesystems[0].mkfs); err != nil {
		t.Fatal(err)
	}
	if fs, err := imageFS(img); err != nil || fs != "xfs" {
		t.Fatalf("imageFS: %q %v", fs, err)
	}
	dev, err := mountLoop(img, dir, "xfs", "")
	if err != nil {
		t.Fatal(err)
	}
	if !mounted(t, dir) || loopsFor(t, img) == "" {
		syscall.Unmount(dir, 0)
		t.Fatal("not mounted through a loop device")
	}
	// Closing a Scratch unmounts and waits for the device to go.
	s := &Scratch{dir: dir, limited: true, loopDev: dev, rootfd: -1}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if mounted(t, dir) {
		t.Fatal("still mounted")
	}
	if l := loopsFor(t, img); l != "" {
		t.Fatalf("loop device left: %s", l)
	}
}

// TestScratchSealed: the writable layers are out of reach of the host's
// other users (0700), and their filesystem is nosuid and nodev, also when
// it was mounted before without those flags.
func TestScratchSealed(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "scratch")
	s := openLimited(t, dir)
	defer s.Close()
	check := func(when string) {
		t.Helper()
		st, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o700 {
			t.Errorf("%s: %s is %v", when, dir, st.Mode().Perm())
		}
		m, err := findMount(dir)
		if err != nil || m == nil {
			t.Fatalf("%s: not mounted: %v", when, err)
		}
		if !m.hasOpt("nosuid") || !m.hasOpt("nodev") {
			t.Errorf("%s: mount options %s", when, m.mountOpts)
		}
	}
	check("new")
	// As if an older warren had mounted it: suid and dev allowed, 0711.
	if err := syscall.Mount("", dir, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_NOATIME, ""); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	s2, err := Open(context.Background(), dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	defer unixCloseOnly(s2)
	check("reused")

	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.MkdirAll(plain+".img", 0o755); err != nil { // forces the fallback
		t.Fatal(err)
	}
	s3, err := Open(context.Background(), plain, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if st, err := os.Stat(plain); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("plain directory: %v %v", st.Mode(), err)
	}
}
