package scratch

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSpaceIsRealSpace: a sparse image larger than the host filesystem
// reports what the host can really back, and a new image by default is
// no larger than the host has free beyond its reserve.
func TestSpaceIsRealSpace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root (loop devices, mount)")
	}
	base := t.TempDir()
	var hst unix.Statfs_t
	if err := unix.Statfs(base, &hst); err != nil {
		t.Fatal(err)
	}
	hostFree := int64(hst.Bavail) * hst.Bsize
	huge := max(hostFree*4, 1<<40)
	s, err := Open(context.Background(), filepath.Join(base, "w"), huge)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !s.Limited() {
		t.Skip("SKIP: no quota-capable image filesystem mounts here")
	}
	total, avail, err := s.Space()
	if err != nil {
		t.Fatal(err)
	}
	var ist unix.Stat_t
	if err := unix.Stat(filepath.Join(base, "w.img"), &ist); err != nil {
		t.Fatal(err)
	}
	t.Logf("image %d GiB, host free %d GiB: space %d GiB, available %d GiB", huge>>30, hostFree>>30, total>>30, avail>>30)
	// Other processes may free space on the host between the two reads.
	const slack = 256 << 20
	if total > hostFree+ist.Blocks*512+slack || avail > hostFree+slack {
		t.Fatalf("space %d/%d beyond the host's %d free (+%d of image)", total, avail, hostFree, ist.Blocks*512)
	}
	if d := defaultSize(base); d > hostFree-hostReserve(int64(hst.Blocks)*hst.Bsize) && d > 1<<30 {
		t.Fatalf("default image size %d beyond the host's free %d less its reserve", d, hostFree)
	}
}
