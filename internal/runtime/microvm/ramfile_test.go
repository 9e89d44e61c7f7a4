package microvm

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSealedCopy: the copy holds the file's bytes, its holes stay holes,
// and nothing changes it (write, hole punch, shared writable mapping all
// refused), while a private writable mapping works and leaves it as it was.
func TestSealedCopy(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ram")
	const size = 8 << 20
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("guest page "), 400)
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(want, 3<<20); err != nil {
		t.Fatal(err)
	}
	f.Close()

	mf, err := sealedCopy(p, "test-ram")
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Close()
	got := make([]byte, len(want))
	if _, err := mf.ReadAt(got, 3<<20); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the copy's bytes: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(mf.Fd()), &st); err != nil || st.Size != size || st.Blocks*512 > 1<<20 {
		t.Errorf("size %d, %d bytes allocated of %d (holes must stay holes): %v", st.Size, st.Blocks*512, size, err)
	}
	if _, err := mf.WriteAt([]byte("x"), 0); err == nil {
		t.Error("write succeeded")
	}
	if err := unix.Fallocate(int(mf.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 3<<20, 4096); !errors.Is(err, unix.EPERM) {
		t.Errorf("hole punch: %v, want EPERM", err)
	}
	if _, err := unix.Mmap(int(mf.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED); err == nil {
		t.Error("a shared writable mapping succeeded")
	}
	m, err := unix.Mmap(int(mf.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	if err != nil {
		t.Fatalf("private writable mapping: %v", err)
	}
	copy(m[3<<20:], "changed")
	unix.Munmap(m)
	if _, err := mf.ReadAt(got, 3<<20); err != nil || !bytes.Equal(got, want) {
		t.Errorf("a private mapping's write reached the memfd: %v", err)
	}
	// A QEMU opens it again by path, read-write, as root does.
	g, err := os.OpenFile("/proc/self/fd/"+strconv.Itoa(int(mf.Fd())), os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer g.Close()
	if _, err := g.WriteAt([]byte("x"), 0); err == nil {
		t.Error("a write through a reopened descriptor succeeded")
	}
}
