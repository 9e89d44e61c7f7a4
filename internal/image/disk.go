package image

// Disk images: the vm tier (internal/runtime/vm) boots a whole operating
// system with its own kernel and init from one. `warren image import --disk
// FILE` validates the file with qemu-img and stores it, converted to a
// self-contained qcow2, as
//
//	blobs/sha256/<hex>.qcow2     hex = sha256 of the stored file
//
// named by an image whose Disk says so (and which has no layers). Every
// sandbox of such an image gets a qcow2 overlay with the stored file as its
// read-only backing file: no per-sandbox copy.
//
// What import refuses (ErrBadDisk, a 400 through the API):
//   - a format other than qcow2 or raw (given, or from the file name);
//   - a backing file or an external data file: QEMU would open that host
//     path for the guest (a host-file-read attack);
//   - encryption, a qcow2 marked corrupt, one that `qemu-img check` finds
//     errors in, or anything qemu-img cannot read;
//   - a virtual size of 0 or above MaxDiskBytes.
// The format is never probed from the content alone: a raw file that holds a
// qcow2 header (with a backing file naming /etc/shadow, say) is imported as
// raw, i.e. as the bytes it is.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// ErrBadDisk wraps every refusal of a disk image at import (a 400 through
// the API).
var ErrBadDisk = errors.New("bad disk image")

// Disk formats import accepts.
const (
	DiskQcow2 = "qcow2"
	DiskRaw   = "raw"
)

// MaxDiskBytes bounds a disk image's virtual size (1 TiB).
const MaxDiskBytes = 1 << 40

// qemuImgTimeout bounds each qemu-img run on an untrusted file.
const qemuImgTimeout = 5 * time.Minute

// Disk is the disk image of an image of the vm tier.
type Disk struct {
	// Digest is "sha256:<hex>" of the stored qcow2 file.
	Digest string `json:"digest"`
	// Format is the imported file's format (qcow2 or raw); the stored
	// file is always qcow2.
	Format string `json:"format"`
	// VirtualSize is the disk's size as the guest sees it, in bytes.
	VirtualSize int64 `json:"virtual_size"`
	// StoredSize is the stored file's size in bytes.
	StoredSize int64 `json:"stored_size"`
}

// DiskPath is where the stored disk with digest "sha256:<hex>" lives.
func (s *LocalStore) DiskPath(digest string) string {
	return filepath.Join(s.dir, "blobs", "sha256", strings.TrimPrefix(digest, "sha256:")+".qcow2")
}

// DiskFormat is the format of the disk image file p by its name: ".qcow2"
// is qcow2, ".raw" and ".img" raw; "" for anything else.
func DiskFormat(p string) string {
	switch strings.ToLower(filepath.Ext(p)) {
	case ".qcow2":
		return DiskQcow2
	case ".raw", ".img":
		return DiskRaw
	}
	return ""
}

// DiskInfo is what validation found in a disk image file.
type DiskInfo struct {
	Format      string
	VirtualSize int64
}

// qemuImgInfo is the part of `qemu-img info --output=json` that matters.
type qemuImgInfo struct {
	Format             string `json:"format"`
	VirtualSize        int64  `json:"virtual-size"`
	BackingFilename    string `json:"backing-filename"`
	FullBackingFile    string `json:"full-backing-filename"`
	BackingFileFormat  string `json:"backing-filename-format"`
	Encrypted          bool   `json:"encrypted"`
	FormatSpecificData *struct {
		Type string `json:"type"`
		Data struct {
			DataFile string          `json:"data-file"`
			Corrupt  bool            `json:"corrupt"`
			Encrypt  json.RawMessage `json:"encrypt"`
		} `json:"data"`
	} `json:"format-specific"`
}

// qemuImgCheck is the part of `qemu-img check --output=json` that matters.
type qemuImgCheck struct {
	Corruptions     int `json:"corruptions"`
	Leaks           int `json:"leaks"`
	CheckErrors     int `json:"check-errors"`
	ImageEndOffset  int `json:"image-end-offset"`
	TotalClusters   int `json:"total-clusters"`
	AllocatedClusts int `json:"allocated-clusters"`
}

// qemuImg runs qemu-img with args and returns its standard output.
func qemuImg(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, qemuImgTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-img", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return nil, fmt.Errorf("image: qemu-img not found (scripts/install-deps.sh installs qemu-utils): %w", err)
		}
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 300 {
			msg = msg[:300] + "…"
		}
		if msg == "" {
			msg = err.Error()
		}
		return stdout.Bytes(), &qemuImgError{msg: msg}
	}
	return stdout.Bytes(), nil
}

// qemuImgError is qemu-img's refusal of a file (its message, trimmed).
type qemuImgError struct{ msg string }

func (e *qemuImgError) Error() string { return e.msg }

// bad is ErrBadDisk with a reason about the disk image src. The reason
// names src by its base name only (qemu-img's messages name the whole
// path, which is the node's business).
func bad(src, format string, args ...any) error {
	msg := strings.ReplaceAll(fmt.Sprintf(format, args...), src, filepath.Base(src))
	return fmt.Errorf("%w: %s: %s", ErrBadDisk, filepath.Base(src), msg)
}

// InspectDisk validates the disk image file src in format (DiskQcow2 or
// DiskRaw; "" = from its name, DiskFormat). Every refusal wraps
// ErrBadDisk.
func InspectDisk(ctx context.Context, src, format string) (*DiskInfo, error) {
	if format == "" {
		format = DiskFormat(src)
	}
	if format != DiskQcow2 && format != DiskRaw {
		return nil, bad(src, "format must be qcow2 or raw (a .qcow2, .raw or .img file, or say which), not %q", format)
	}
	fi, err := os.Stat(src)
	if err != nil {
		return nil, fmt.Errorf("image: import disk: %w", err)
	}
	// An absolute path: qemu-img reads a file name starting "json:" as a
	// block device description, not as a file.
	if src, err = filepath.Abs(src); err != nil {
		return nil, fmt.Errorf("image: import disk: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, bad(src, "not a regular file")
	}
	out, err := qemuImg(ctx, "info", "--output=json", "-f", format, src)
	var qe *qemuImgError
	if errors.As(err, &qe) {
		return nil, bad(src, "qemu-img cannot read it as %s: %s", format, qe.msg)
	}
	if err != nil {
		return nil, err
	}
	var info qemuImgInfo
	if err := json.Unmarshal(out, &info); err != nil {
		return nil, fmt.Errorf("image: qemu-img info: %w", err)
	}
	if info.Format != format {
		return nil, bad(src, "qemu-img reads it as %q, not %s", info.Format, format)
	}
	if info.BackingFilename != "" || info.FullBackingFile != "" {
		return nil, bad(src, "it has a backing file (%q): refused, the VM would read that host file; import a self-contained image (qemu-img convert -O qcow2)", info.BackingFilename)
	}
	if fs := info.FormatSpecificData; fs != nil {
		if fs.Data.DataFile != "" {
			return nil, bad(src, "it has an external data file (%q): refused, the VM would read that host file", fs.Data.DataFile)
		}
		if fs.Data.Corrupt {
			return nil, bad(src, "qcow2 marks it corrupt")
		}
		if len(fs.Data.Encrypt) > 0 && string(fs.Data.Encrypt) != "null" {
			return nil, bad(src, "it is encrypted")
		}
	}
	if info.Encrypted {
		return nil, bad(src, "it is encrypted")
	}
	if info.VirtualSize <= 0 || info.VirtualSize > MaxDiskBytes {
		return nil, bad(src, "virtual size %d bytes: want 1 byte to %d GiB", info.VirtualSize, MaxDiskBytes>>30)
	}
	if format == DiskQcow2 {
		// Exit 2: corruptions, 3: only leaks (harmless), 1: check failed.
		out, err := qemuImg(ctx, "check", "--output=json", "-f", format, src)
		var ck qemuImgCheck
		jerr := json.Unmarshal(out, &ck)
		switch {
		case jerr == nil && (ck.Corruptions > 0 || ck.CheckErrors > 0):
			return nil, bad(src, "qemu-img check finds %d corruptions and %d errors", ck.Corruptions, ck.CheckErrors)
		case jerr != nil && errors.As(err, &qe):
			return nil, bad(src, "qemu-img check: %s", qe.msg)
		case jerr != nil && err != nil:
			return nil, err
		}
	}
	return &DiskInfo{Format: format, VirtualSize: info.VirtualSize}, nil
}

// ImportDisk validates the disk image file src (format as InspectDisk) and
// stores it as the image name of the vm tier.
func (s *LocalStore) ImportDisk(ctx context.Context, src, name, format string) (*Image, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	src, err := filepath.Abs(src)
	if err != nil {
		return nil, fmt.Errorf("image: import disk: %w", err)
	}
	info, err := InspectDisk(ctx, src, format)
	if err != nil {
		return nil, err
	}
	tmp, err := s.mkTemp("disk")
	if err != nil {
		return nil, fmt.Errorf("image: import disk: %w", err)
	}
	defer os.RemoveAll(tmp)
	conv := filepath.Join(tmp, "disk.qcow2")
	// A fresh, self-contained qcow2 (no backing file, no data file): only
	// the guest-visible content of src goes in.
	var qe *qemuImgError
	if _, err := qemuImg(ctx, "convert", "-f", info.Format, "-O", DiskQcow2, "-o", "cluster_size=65536", src, conv); err != nil {
		if errors.As(err, &qe) {
			if strings.Contains(qe.msg, "No space left") {
				return nil, fmt.Errorf("%w: %s", ErrNoSpace, qe.msg)
			}
			return nil, bad(src, "qemu-img convert: %s", qe.msg)
		}
		return nil, err
	}
	sum, size, err := hashFile(conv)
	if err != nil {
		return nil, fmt.Errorf("image: import disk: %w", err)
	}
	disk := &Disk{Digest: "sha256:" + sum, Format: info.Format, VirtualSize: info.VirtualSize, StoredSize: size}
	img := &Image{Name: name, Digest: disk.Digest, Size: info.VirtualSize, CreatedAt: time.Now().UTC(), Disk: disk, Layers: []string{}}
	b, err := json.Marshal(img)
	if err != nil {
		return nil, fmt.Errorf("image: import disk: %w", err)
	}
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	dst := s.DiskPath(disk.Digest)
	if _, err := os.Stat(dst); errors.Is(err, fs.ErrNotExist) {
		if err := os.Chmod(conv, 0o644); err != nil {
			return nil, fmt.Errorf("image: import disk: %w", err)
		}
		if err := syncFile(conv); err != nil {
			return nil, fmt.Errorf("image: import disk: %w", err)
		}
		if err := os.Rename(conv, dst); err != nil {
			return nil, fmt.Errorf("image: import disk: %w", err)
		}
	}
	old, _ := s.readImage(name)
	if err := s.writeFileAtomic(s.imagePath(name), b); err != nil {
		return nil, fmt.Errorf("image: import disk: %w", err)
	}
	if old != nil && old.Disk != nil && old.Disk.Digest != disk.Digest {
		s.collectDiskLocked(old.Disk.Digest)
	}
	return img, nil
}

// collectDiskLocked removes the stored disk digest when no image names it.
// The caller holds the lock. (A running VM keeps its open file.)
func (s *LocalStore) collectDiskLocked(digest string) {
	imgs, err := s.List(context.Background())
	if err != nil {
		return
	}
	for _, im := range imgs {
		if im.Disk != nil && im.Disk.Digest == digest {
			return
		}
	}
	_ = os.Remove(s.DiskPath(digest))
}

// ResolveDisk is the stored disk of the image name: its path and the
// image; a nil Disk when the image is made of layers.
func (s *LocalStore) ResolveDisk(ctx context.Context, name string) (string, *Image, error) {
	img, err := s.readImage(name)
	if err != nil {
		return "", nil, err
	}
	if img.Disk == nil {
		return "", img, nil
	}
	p := s.DiskPath(img.Disk.Digest)
	if _, err := os.Stat(p); err != nil {
		return "", nil, fmt.Errorf("image: %s: disk %s missing: %w", name, img.Disk.Digest, err)
	}
	return p, img, nil
}

func hashFile(p string) (string, int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, err
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}

func syncFile(p string) error {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
