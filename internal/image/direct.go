package image

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// CreateLayerFromPrivateChanges is CreateLayerFromChanges for a writable
// directory that nothing else uses or changes (a clone or copy of a
// sandbox's upper directory made for this): it may change that directory.
// Instead of tar → unpack → EROFS, it normalises the directory in place to
// what unpacking its tar would give (the same rules: whiteouts and opaque
// directories stay, overlay's other attributes, sockets and unknown xattrs
// go, setuid/setgid and file capabilities only where the layers below
// have them), then builds the EROFS image straight from it while hashing
// its tar (the diff id) in parallel: one pass of the data instead of three.
// A directory it cannot take (a device node) goes the long way, which
// reports it.
func (s *LocalStore) CreateLayerFromPrivateChanges(ctx context.Context, name string, version int, dir string, lowers []string, idBase uint32, source string) (*Layer, error) {
	if err := ValidLayerName(name); err != nil {
		return nil, err
	}
	if err := normalizeChanges(dir, lowers, idBase); err != nil {
		if errors.Is(err, errNotDirect) {
			return s.CreateLayerFromChanges(ctx, name, version, dir, lowers, idBase, source)
		}
		return nil, fmt.Errorf("image: layer %s: %w", name, err)
	}
	// Shifted in place already: the archive records the ids as they are.
	src := layerSource{direct: dir, open: func() (io.ReadCloser, error) { return tarChanges(dir, lowers, 0), nil }}
	return s.createNamed(ctx, name, version, src, source)
}

var errNotDirect = errors.New("not packable directly")

// normalizeChanges makes an upper directory look like the unpacked tree of
// its own tarChanges archive, with owners shifted back by idBase
// (shiftID).
func normalizeChanges(root string, lowers []string, idBase uint32) error {
	// The root of an unpacked tree: a fresh directory.
	if err := stripXattrs(root, false); err != nil {
		return err
	}
	if err := os.Lchown(root, 0, 0); err != nil {
		return err
	}
	if err := os.Chmod(root, 0o755); err != nil {
		return err
	}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		return normalizeEntry(root, p, lowers, idBase)
	})
}

// normalizeEntry makes p (below root) what unpacking its entry of
// tarChanges would give: a socket goes (it is not archived), a device node
// other than a whiteout refuses the direct way (errNotDirect), owners are
// shifted back by idBase, overlay's other xattrs go, and setuid/setgid and
// file capabilities stay only where privileged lets them.
func normalizeEntry(root, p string, lowers []string, idBase uint32) error {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFSOCK:
		return removeKeepingParentTimes(p) // not archived
	case unix.S_IFBLK:
		return errNotDirect
	case unix.S_IFCHR:
		if st.Rdev != 0 {
			return errNotDirect
		}
		return stripXattrs(p, false) // a whiteout
	}
	if idBase != 0 {
		uid, gid := shiftID(int(st.Uid), idBase), shiftID(int(st.Gid), idBase)
		if uid != int(st.Uid) || gid != int(st.Gid) {
			// chown clears setuid/setgid: put the mode back.
			if err := os.Lchown(p, uid, gid); err != nil {
				return err
			}
			if st.Mode&unix.S_IFMT != unix.S_IFLNK && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
				if err := unix.Fchmodat(unix.AT_FDCWD, p, st.Mode&0o7777, 0); err != nil {
					return err
				}
			}
		}
	}
	if err := stripXattrs(p, st.Mode&unix.S_IFMT == unix.S_IFDIR); err != nil {
		return err
	}
	return normalizePrivileges(root, p, &st, lowers)
}

// normalizePrivileges drops p's setuid/setgid bits and file capabilities
// (st is its stat) where privileged, which unpacking applies to the
// archive's header of p, would drop them: where the layers below (lowers)
// do not have them.
func normalizePrivileges(root, p string, st *unix.Stat_t, lowers []string) error {
	const suid = unix.S_ISUID | unix.S_ISGID
	capVal, capErr := getXattr(p, "security.capability")
	if st.Mode&suid == 0 && capErr != nil {
		return nil
	}
	rel, err := filepath.Rel(root, p)
	if err != nil {
		return err
	}
	hdr := &tar.Header{Mode: int64(st.Mode & 0o7777), Typeflag: tar.TypeReg}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		hdr.Typeflag = tar.TypeDir
	case unix.S_IFLNK:
		hdr.Typeflag = tar.TypeSymlink
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	}
	if capErr == nil {
		hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": capVal}
	}
	privileged(hdr, filepath.ToSlash(rel), lowers)
	if _, kept := hdr.PAXRecords["SCHILY.xattr.security.capability"]; capErr == nil && !kept {
		if err := unix.Lremovexattr(p, "security.capability"); err != nil && !errors.Is(err, unix.ENODATA) {
			return err
		}
	}
	if m := uint32(hdr.Mode); m != st.Mode&0o7777 && st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Fchmodat(unix.AT_FDCWD, p, m, 0); err != nil {
			return err
		}
	}
	return nil
}

// removeKeepingParentTimes removes p without changing its directory's
// times (which its archive keeps).
func removeKeepingParentTimes(p string) error {
	var st unix.Stat_t
	parent := filepath.Dir(p)
	if err := unix.Lstat(parent, &st); err != nil {
		return err
	}
	if err := os.Remove(p); err != nil {
		return err
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, parent, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
}

// stripXattrs removes the extended attributes a layer does not carry
// (everything but user.*, POSIX ACLs, security.capability and, on a
// directory, trusted.overlay.opaque=y).
func stripXattrs(p string, dir bool) error {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		return nil
	}
	buf := make([]byte, sz)
	if sz, err = unix.Llistxattr(p, buf); err != nil {
		return nil
	}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00") {
		keep := name == "" || strings.HasPrefix(name, "user.") || name == "security.capability" ||
			name == "system.posix_acl_access" || name == "system.posix_acl_default"
		if name == "trusted.overlay.opaque" && dir {
			v, err := getXattr(p, name)
			keep = err == nil && v == "y"
		}
		if keep {
			continue
		}
		if err := unix.Lremovexattr(p, name); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("removexattr %s of %s: %w", name, p, err)
		}
	}
	return nil
}

func getXattr(p, name string) (string, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Lgetxattr(p, name, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, len(buf)*4)
			continue
		}
		if err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	}
}

// convertDirect builds the EROFS image of src.direct (normalised) while
// hashing its tar in parallel.
func (s *LocalStore) convertDirect(ctx context.Context, src layerSource) (string, int64, bool, error) {
	tmp, err := s.mkTemp("layer")
	if err != nil {
		return "", 0, false, err
	}
	defer os.RemoveAll(tmp)
	img := filepath.Join(tmp, "layer.erofs")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	built := make(chan error, 1)
	go func() { built <- buildErofs(ctx, src.direct, img) }()

	var meta layerMeta
	h := sha256.New()
	rc, err := src.open()
	if err == nil {
		cr := &countingReader{r: rc, h: h}
		tr := tar.NewReader(cr)
		for err == nil {
			if _, err = tr.Next(); err == nil {
				meta.Entries++
				if meta.Entries > DefaultLimits.MaxEntries || cr.n > DefaultLimits.MaxBytes {
					err = fmt.Errorf("%w: the layer exceeds %d entries or %d bytes", ErrInvalid, DefaultLimits.MaxEntries, DefaultLimits.MaxBytes)
				}
			}
		}
		if errors.Is(err, io.EOF) {
			_, err = io.Copy(io.Discard, cr) // the diff id covers the end-of-archive padding
		}
		meta.Size = cr.n
		rc.Close()
	}
	if err != nil {
		cancel()
		<-built
		return "", 0, false, classify(err)
	}
	if err := <-built; err != nil {
		return "", 0, false, err
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if m, err := s.layerMeta(sum); err == nil {
		return sum, m.Size, false, nil // same content as a stored layer
	}
	if fi, err := os.Stat(img); err == nil {
		meta.ErofsSize = fi.Size()
	}
	mine, err := s.commitLayer(sum, img, meta)
	return sum, meta.Size, mine, err
}
