package image

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func needQemuImg(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("SKIP: qemu-img missing (scripts/install-deps.sh installs qemu-utils)")
	}
}

func qimg(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("qemu-img", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("qemu-img %v: %v: %s", args, err, out)
	}
	return string(out)
}

// patch writes b at off in the file p.
func patch(t *testing.T, p string, off int64, b []byte) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestImportDisk: a raw and a qcow2 disk import as self-contained qcow2
// files that keep their content; removing the images removes the files.
func TestImportDisk(t *testing.T) {
	needQemuImg(t)
	ctx := context.Background()
	s := newStore(t)
	dir := t.TempDir()
	raw := filepath.Join(dir, "d.raw")
	if err := os.WriteFile(raw, []byte(strings.Repeat("warren-disk!", 1<<16)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(raw, 8<<20); err != nil {
		t.Fatal(err)
	}
	img, err := s.ImportDisk(ctx, raw, "disk:raw", "")
	if err != nil {
		t.Fatalf("ImportDisk raw: %v", err)
	}
	if img.Disk == nil || img.Disk.Format != DiskRaw || img.Disk.VirtualSize != 8<<20 || len(img.Layers) != 0 {
		t.Fatalf("image %+v disk %+v", img, img.Disk)
	}
	p, got, err := s.ResolveDisk(ctx, "disk:raw")
	if err != nil || got.Disk == nil {
		t.Fatalf("ResolveDisk: %v %v", got, err)
	}
	var info qemuImgInfo
	if err := json.Unmarshal([]byte(qimg(t, "info", "--output=json", "-f", "qcow2", p)), &info); err != nil {
		t.Fatal(err)
	}
	if info.Format != "qcow2" || info.BackingFilename != "" || info.VirtualSize != 8<<20 {
		t.Errorf("stored disk: %+v", info)
	}
	back := filepath.Join(dir, "back.raw")
	qimg(t, "convert", "-f", "qcow2", "-O", "raw", p, back)
	if out, err := exec.Command("cmp", raw, back).CombinedOutput(); err != nil {
		t.Errorf("stored content differs: %s", out)
	}

	q := filepath.Join(dir, "d.qcow2")
	qimg(t, "convert", "-f", "raw", "-O", "qcow2", raw, q)
	img2, err := s.ImportDisk(ctx, q, "disk:q", "")
	if err != nil {
		t.Fatalf("ImportDisk qcow2: %v", err)
	}
	if img2.Disk.Format != DiskQcow2 || img2.Disk.Digest != img.Disk.Digest {
		t.Errorf("qcow2 import %+v, want the raw one's digest %s", img2.Disk, img.Disk.Digest)
	}
	if err := s.Remove(ctx, "disk:raw"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Errorf("disk removed while disk:q still uses it: %v", err)
	}
	if err := s.Remove(ctx, "disk:q"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); !os.IsNotExist(err) {
		t.Errorf("disk left after its last image went: %v", err)
	}
	if _, _, err := s.ResolveDisk(ctx, "disk:q"); !errors.Is(err, ErrNotFound) {
		t.Errorf("ResolveDisk after Remove: %v", err)
	}
}

// TestImportDiskRefused: corrupt images, backing files, data files and
// unknown formats are refused with ErrBadDisk and a reason; a raw file
// whose bytes look like a qcow2 with a backing file is only bytes.
func TestImportDiskRefused(t *testing.T) {
	needQemuImg(t)
	ctx := context.Background()
	s := newStore(t)
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret.raw")
	if err := os.WriteFile(secret, []byte(strings.Repeat("host secret\n", 1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	mk := func(name string, args ...string) string {
		p := filepath.Join(dir, name)
		qimg(t, append(append([]string{"create", "-q"}, args[:len(args)-1]...), p, args[len(args)-1])...)
		return p
	}
	backed := mk("backed.qcow2", "-f", "qcow2", "-b", secret, "-F", "raw", "1M")
	datafile := mk("datafile.qcow2", "-f", "qcow2", "-o", "data_file="+filepath.Join(dir, "data.raw"), "1M")
	corruptBit := mk("corrupt.qcow2", "-f", "qcow2", "1M")
	patch(t, corruptBit, 72+7, []byte{2}) // incompatible_features: bit 1, "corrupt"
	badL1 := mk("badl1.qcow2", "-f", "qcow2", "1M")
	patch(t, badL1, 40, []byte{0, 0, 0, 0, 0, 0, 0x12, 0x34}) // l1_table_offset unaligned
	garbage := filepath.Join(dir, "garbage.qcow2")
	if err := os.WriteFile(garbage, []byte(strings.Repeat("not a disk ", 100)), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty.raw")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	vmdk := mk("x.vmdk", "-f", "vmdk", "1M")
	for _, c := range []struct{ path, format, want string }{
		{backed, "", "backing file"},
		{datafile, "", "data file"},
		{corruptBit, "", "corrupt"},
		{badL1, "", "cannot read it as qcow2"},
		{garbage, "", "cannot read it as qcow2"},
		{empty, "", "virtual size 0"},
		{vmdk, "", "format must be qcow2 or raw"},
		{vmdk, "vmdk", "format must be qcow2 or raw"},
		{backed, "vmdk", "format must be qcow2 or raw"},
	} {
		_, err := s.ImportDisk(ctx, c.path, "refused:1", c.format)
		if !errors.Is(err, ErrBadDisk) || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), c.path) {
			t.Errorf("%s (%q): %v, want ErrBadDisk saying %q", filepath.Base(c.path), c.format, err, c.want)
		}
	}
	if _, _, err := s.Resolve(ctx, "refused:1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("a refused import left an image: %v", err)
	}
	// The backed qcow2 renamed .raw is a raw disk of its own bytes: the
	// guest would see the header, never the secret.
	asRaw := filepath.Join(dir, "backed-bytes.raw")
	if err := os.Rename(backed, asRaw); err != nil {
		t.Fatal(err)
	}
	img, err := s.ImportDisk(ctx, asRaw, "bytes:1", "")
	if err != nil {
		t.Fatalf("raw import of qcow2 bytes: %v", err)
	}
	p, _, _ := s.ResolveDisk(ctx, "bytes:1")
	out := filepath.Join(dir, "out.raw")
	qimg(t, "convert", "-f", "qcow2", "-O", "raw", p, out)
	b, _ := os.ReadFile(out)
	if strings.Contains(string(b), "host secret") || !strings.HasPrefix(string(b), "QFI\xfb") || img.Disk.Format != DiskRaw {
		t.Errorf("raw import of qcow2 bytes: %d bytes, prefix %q, format %s", len(b), b[:4], img.Disk.Format)
	}
}
