package scratch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const btrfsIocSync = 0x9408 // _IO(0x94, 8)

// openBtrfs opens a 1 GiB scratch space on the btrfs backend, whatever
// the kernel's first choice would be, and closes it (checking that no
// mount or loop device is left) at the end of the test.
func openBtrfs(tb testing.TB, dir string) *Scratch {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("SKIP: needs root (loop devices, mount)")
	}
	saved := filesystems
	filesystems = slices.DeleteFunc(slices.Clone(saved), func(f fsKind) bool {
		return f.name != "btrfs"
	})
	s, err := Open(context.Background(), dir, 1<<30)
	filesystems = saved
	if err != nil {
		tb.Fatal(err)
	}
	if s.FSType() != "btrfs" {
		s.Close()
		tb.Skip("SKIP: btrfs with quotas does not mount here (needs CONFIG_BTRFS_FS and mkfs.btrfs)")
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Error(err)
		}
		if m, _ := findMount(dir); m != nil {
			tb.Errorf("%s still mounted", dir)
		}
		if l := loopsForTB(tb, dir+".img"); l != "" {
			tb.Errorf("loop device left: %s", l)
		}
	})
	return s
}

func loopsForTB(tb testing.TB, img string) string {
	// losetup -a would do; sysfs avoids a process per check.
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var hits []string
	for _, b := range backing {
		if f, err := os.ReadFile(b); err == nil && strings.HasPrefix(strings.TrimSpace(string(f)), img) {
			hits = append(hits, b)
		}
	}
	return strings.Join(hits, " ")
}

func TestBtrfsQuotaAndFree(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "scratch")
	s := openBtrfs(t, dir)
	if s.qgroupsDir == "" {
		t.Fatal("no sysfs qgroups dir")
	}
	mode, _ := os.ReadFile(filepath.Join(s.qgroupsDir, "mode"))
	t.Logf("quota mode: %s", strings.TrimSpace(string(mode)))
	if _, err := os.Stat("/sys/fs/btrfs/features/simple_quota"); err == nil && strings.TrimSpace(string(mode)) != "squota" {
		t.Errorf("kernel has simple quotas but mode is %q", mode)
	}

	d, err := s.Alloc("a", 4<<20)
	if err != nil {
		t.Fatal(err)
	}
	sv, err := s.subvolID("a")
	if err != nil {
		t.Fatal(err)
	}
	qg := filepath.Join(s.qgroupsDir, fmt.Sprintf("0_%d", sv))
	if b, err := os.ReadFile(filepath.Join(qg, "max_referenced")); err != nil || strings.TrimSpace(string(b)) != "4194304" {
		t.Fatalf("qgroup limit %q %v", b, err)
	}
	// Usage counts written data before it is committed.
	if err := os.WriteFile(filepath.Join(d, "f"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if u, err := s.Usage("a"); err != nil || u < 1<<20 || u > 2<<20 {
		t.Fatalf("usage of uncommitted 1 MiB: %d %v", u, err)
	}
	// Plain files and dirs at the root are not sandboxes.
	if err := os.Mkdir(filepath.Join(dir, "plain"), 0o755); err != nil {
		t.Fatal(err)
	}
	if ids, err := s.List(); err != nil || !slices.Equal(ids, []string{"a"}) {
		t.Fatalf("list %v %v", ids, err)
	}

	// Free removes the subvolume at once and its qgroup once the cleaner
	// has dropped it.
	if err := s.Free("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d); !os.IsNotExist(err) {
		t.Fatalf("subvolume still there: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		// BTRFS_IOC_SYNC commits and wakes the cleaner, which drops the
		// subvolume and (Linux 6.10+) its qgroup; left alone that happens
		// within a commit interval.
		if err := btrfsIoctl(s.rootfd, btrfsIocSync, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(qg); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("qgroup 0/%d not removed after Free", sv)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("qgroup gone %v after Free", 5*time.Second-time.Until(deadline))

	// A fresh Alloc of the same id gets a new subvolume (ids are never reused).
	if _, err := s.Alloc("a", 1<<20); err != nil {
		t.Fatal(err)
	}
	if sv2, _ := s.subvolID("a"); sv2 == sv {
		t.Fatalf("subvolume id %d reused", sv)
	}
	if err := s.Free("a"); err != nil {
		t.Fatal(err)
	}
	if err := s.Free("a"); err != nil {
		t.Fatalf("second Free: %v", err)
	}

	// The fallback path (SUBVOL_CREATE, then QGROUP_LIMIT) limits too.
	s.noInherit = true
	if _, err := s.Alloc("v1", 2<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := writeUntilFull(filepath.Join(dir, "v1", "f"), 8<<20); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("fallback path: no limit: %v", err)
	}
	if err := s.Free("v1"); err != nil {
		t.Fatal(err)
	}
	s.noInherit = false

	// The sweep (run by Open) keeps live qgroups and leaves the one of a
	// subvolume still being dropped (the kernel refuses: EBUSY).
	if _, err := s.Alloc("live", 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Alloc("dead", 1<<20); err != nil {
		t.Fatal(err)
	}
	liveSV, _ := s.subvolID("live")
	deadSV, _ := s.subvolID("dead")
	if err := s.Free("dead"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.btrfsSweepQgroups(); err != nil {
		t.Fatal(err)
	}
	groups, err := s.btrfsQgroups()
	if err != nil || !slices.Contains(groups, liveSV) {
		t.Fatalf("qgroups after sweep: %v %v (live 0/%d, dead 0/%d)", groups, err, liveSV, deadSV)
	}
	t.Logf("qgroups after sweep: %v (live 0/%d, dead 0/%d)", groups, liveSV, deadSV)
	if _, err := writeUntilFull(filepath.Join(dir, "live", "f"), 4<<20); !errors.Is(err, syscall.EDQUOT) {
		t.Fatalf("live limit lost after sweep: %v", err)
	}
}

// TestBtrfsOverlay mounts an overlay whose upper and work dirs live in a
// sandbox subvolume and checks the limit holds through it.
func TestBtrfsOverlay(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "scratch")
	s := openBtrfs(t, dir)
	d, err := s.Alloc("ov", 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	upper, work := filepath.Join(d, "upper"), filepath.Join(d, "work")
	for _, p := range []string{upper, work} {
		if err := os.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	lower, merged := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(lower, "old"), []byte("lower"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		t.Fatalf("overlay on a btrfs subvolume: %v", err)
	}
	unmounted := false
	t.Cleanup(func() {
		if !unmounted {
			unix.Unmount(merged, 0)
		}
	})
	// Copy-up, whiteout and new files land in the subvolume.
	if err := os.WriteFile(filepath.Join(merged, "old"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(merged, "old")); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(upper, "old"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Fatalf("no whiteout in upper: %v mode %o", err, st.Mode)
	}
	n, err := writeUntilFull(filepath.Join(merged, "big"), 32<<20)
	if !errors.Is(err, syscall.EDQUOT) && !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("wrote %d bytes through overlay past an 8 MiB limit: %v", n, err)
	}
	t.Logf("overlay write stopped after %d bytes: %v", n, err)
	if u, err := s.Usage("ov"); err != nil || u < 4<<20 || u > 8<<20 {
		t.Fatalf("usage %d %v", u, err)
	}
	if err := unix.Unmount(merged, 0); err != nil {
		t.Fatal(err)
	}
	unmounted = true
	if err := s.Free("ov"); err != nil {
		t.Fatal(err)
	}
	if ids, _ := s.List(); len(ids) != 0 {
		t.Fatalf("left: %v", ids)
	}
}

// BenchmarkAllocFree measures one sandbox's scratch lifecycle on btrfs:
// Alloc (subvolume + qgroup limit) and Free (subvolume + qgroup delete).
// "inherit" sets the limit in the creating ioctl, "limit-ioctl" is the
// fallback SUBVOL_CREATE + QGROUP_LIMIT.
func BenchmarkAllocFree(b *testing.B) {
	for _, noInherit := range []bool{false, true} {
		name := map[bool]string{false: "inherit", true: "limit-ioctl"}[noInherit]
		b.Run(name, func(b *testing.B) {
			dir := filepath.Join(b.TempDir(), "scratch")
			s := openBtrfs(b, dir)
			s.noInherit = noInherit
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				id := fmt.Sprintf("b%d", i)
				if _, err := s.Alloc(id, 64<<20); err != nil {
					b.Fatal(err)
				}
				if err := s.Free(id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkUsage measures one Usage call on a btrfs sandbox.
func BenchmarkUsage(b *testing.B) {
	dir := filepath.Join(b.TempDir(), "scratch")
	s := openBtrfs(b, dir)
	if _, err := s.Alloc("u", 64<<20); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.Usage("u"); err != nil {
			b.Fatal(err)
		}
	}
}

func TestBtrfsClone(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "scratch")
	s := openBtrfs(t, dir)
	d, err := s.Alloc("src", 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "f"), []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, release, err := s.Clone("src")
	if err != nil {
		t.Fatal(err)
	}
	// Later changes on either side stay on that side.
	if err := os.WriteFile(filepath.Join(d, "f"), []byte("two"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c, "g"), []byte("clone"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(c, "f")); string(b) != "one" {
		t.Fatalf("clone sees %q", b)
	}
	if _, err := os.Stat(filepath.Join(d, "g")); err == nil {
		t.Fatal("a write to the clone reached the source")
	}
	if ids, _ := s.List(); len(ids) != 1 || ids[0] != "src" {
		t.Fatalf("List shows the clone: %v", ids)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c); err == nil {
		t.Fatal("clone left after release")
	}
	// A clone left by a dead process goes at the next Open.
	if _, _, err := s.Clone("src"); err != nil {
		t.Fatal(err)
	}
	if n := s.sweepClones(); n != 1 {
		t.Fatalf("swept %d clones, want 1", n)
	}
	if _, _, err := s.Clone("../x"); err == nil {
		t.Fatal("bad id accepted")
	}
	// The source keeps its disk limit (8 MiB) after being cloned.
	if err := os.WriteFile(filepath.Join(d, "big"), make([]byte, 16<<20), 0o644); err == nil {
		t.Fatal("16 MiB written past the 8 MiB limit after a clone")
	}
	if err := s.Free("src"); err != nil {
		t.Fatal(err)
	}
}
