package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Limits bound what one layer may contain. Zero fields take the defaults.
type Limits struct {
	MaxEntries int   // tar entries; default 2,000,000
	MaxBytes   int64 // sum of regular file sizes; default 64 GiB
}

// DefaultLimits are the limits Import applies to every layer.
var DefaultLimits = Limits{MaxEntries: 2_000_000, MaxBytes: 64 << 30}

func (l Limits) withDefaults() Limits {
	if l.MaxEntries <= 0 {
		l.MaxEntries = DefaultLimits.MaxEntries
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultLimits.MaxBytes
	}
	return l
}

// UnpackStats counts what Unpack wrote.
type UnpackStats struct {
	Entries int
	Bytes   int64 // regular file content
}

const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
	maxPathLen     = 4096
	maxNameLen     = 255
)

// resolveFlags confine every lookup below the layer root and refuse to
// traverse any symlink: parents are never reached through a link.
const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS |
	unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

// Unpack extracts the uncompressed layer tar r into the existing directory
// root, converting OCI whiteouts to the overlayfs form (a 0/0 character
// device for `.wh.NAME`, xattr trusted.overlay.opaque=y for
// `.wh..wh..opq`). Every file is created relative to a directory descriptor
// opened with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS), so no entry can
// write outside root or through a symlink. Entries with absolute names or
// `..` components are rejected. On error root holds a partial tree: callers
// unpack into a private temporary directory.
func Unpack(ctx context.Context, r io.Reader, root string, lim Limits) (UnpackStats, error) {
	lim = lim.withDefaults()
	rootfd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return UnpackStats{}, fmt.Errorf("unpack: open root: %w", &pathErr{root, err})
	}
	u := &unpacker{root: rootfd, dirs: map[string]int{}}
	defer u.close()

	var st UnpackStats
	tr := tar.NewReader(r)
	for {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return st, fmt.Errorf("unpack: reading tar after %d entries: %w", st.Entries, err)
		}
		st.Entries++
		if st.Entries > lim.MaxEntries {
			return st, fmt.Errorf("unpack: more than %d entries", lim.MaxEntries)
		}
		if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeRegA { //nolint:staticcheck // TypeRegA appears in old archives
			if hdr.Size < 0 || hdr.Size > lim.MaxBytes-st.Bytes {
				return st, fmt.Errorf("unpack: %q: content exceeds the layer limit of %d bytes", hdr.Name, lim.MaxBytes)
			}
			st.Bytes += hdr.Size
		}
		if err := u.entry(hdr, tr); err != nil {
			return st, fmt.Errorf("unpack: %q: %w", hdr.Name, err)
		}
	}
	if err := u.finishDirs(); err != nil {
		return st, fmt.Errorf("unpack: %w", err)
	}
	return st, nil
}

type pathErr struct {
	path string
	err  error
}

func (e *pathErr) Error() string { return e.path + ": " + e.err.Error() }
func (e *pathErr) Unwrap() error { return e.err }

type dirTime struct {
	rel   string
	atime time.Time
	mtime time.Time
}

type unpacker struct {
	root     int
	dirs     map[string]int // cache of open parent directories by relative path
	dirTimes []dirTime
}

func (u *unpacker) close() {
	u.dropCache()
	unix.Close(u.root)
}

func (u *unpacker) dropCache() {
	for k, fd := range u.dirs {
		unix.Close(fd)
		delete(u.dirs, k)
	}
}

// cleanName turns a tar name into a relative path ("" is the root). It
// rejects absolute names, `..` components, NUL and over-long names.
func cleanName(name string) (string, error) {
	if name == "" {
		return "", errors.New("empty name")
	}
	if len(name) > maxPathLen {
		return "", errors.New("name too long")
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", errors.New("name contains NUL")
	}
	if strings.HasPrefix(name, "/") {
		return "", errors.New("absolute name")
	}
	var parts []string
	for _, c := range strings.Split(name, "/") {
		switch c {
		case "", ".":
			continue
		case "..":
			return "", errors.New("name contains a .. component")
		}
		if len(c) > maxNameLen {
			return "", errors.New("name component too long")
		}
		parts = append(parts, c)
	}
	return strings.Join(parts, "/"), nil
}

// openDir returns a descriptor of the directory rel (relative to root, ""
// or "." is root), creating missing components with mode 0755 when create
// is set. The descriptor belongs to the cache: do not close it.
func (u *unpacker) openDir(rel string, create bool) (int, error) {
	if rel == "" || rel == "." {
		return u.root, nil
	}
	if fd, ok := u.dirs[rel]; ok {
		return fd, nil
	}
	how := &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveFlags}
	fd, err := unix.Openat2(u.root, rel, how)
	if errors.Is(err, unix.ENOENT) && create {
		parent, perr := u.openDir(path.Dir(rel), true)
		if perr != nil {
			return -1, perr
		}
		if err := unix.Mkdirat(parent, path.Base(rel), 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, &pathErr{rel, err}
		}
		fd, err = unix.Openat2(parent, path.Base(rel), how)
	}
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EXDEV) {
			return -1, &pathErr{rel, fmt.Errorf("parent is not a directory inside the layer (symlink?): %w", err)}
		}
		return -1, &pathErr{rel, err}
	}
	u.dirs[rel] = fd
	return fd, nil
}

// removeExisting unlinks base in dir so a new entry can take its place.
// Keeping an existing directory is the caller's choice (keepDir).
func (u *unpacker) removeExisting(dir int, rel string, keepDir bool) (existedDir bool, err error) {
	base := path.Base(rel)
	var st unix.Stat_t
	if err := unix.Fstatat(dir, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if keepDir {
			return true, nil
		}
		// Only an empty directory may be replaced; forget cached
		// descriptors of it and below.
		for k, fd := range u.dirs {
			if k == rel || strings.HasPrefix(k, rel+"/") {
				unix.Close(fd)
				delete(u.dirs, k)
			}
		}
		if err := unix.Unlinkat(dir, base, unix.AT_REMOVEDIR); err != nil {
			return false, fmt.Errorf("replacing directory: %w", err)
		}
		return false, nil
	}
	return false, unix.Unlinkat(dir, base, 0)
}

// entry writes one tar entry below the root: it checks the name and ids,
// opens the entry's parent (creating missing directories, never through a
// symlink) and hands the entry to the function of its type.
func (u *unpacker) entry(hdr *tar.Header, r io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid > 1<<32-2 || hdr.Gid > 1<<32-2 {
		return errors.New("uid/gid out of range")
	}
	if rel == "" {
		if hdr.Typeflag != tar.TypeDir {
			return errors.New("root entry is not a directory")
		}
		if err := u.setMeta(u.root, hdr); err != nil {
			return err
		}
		u.dirTimes = append(u.dirTimes, dirTime{"", hdr.AccessTime, hdr.ModTime})
		return nil
	}
	if len(u.dirs) >= 256 {
		u.dropCache() // descriptors are only held within one entry
	}
	dirRel, base := path.Dir(rel), path.Base(rel)
	dir, err := u.openDir(dirRel, true)
	if err != nil {
		return err
	}

	if strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(dir, base)
	}

	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.dirEntry(dir, rel, base, hdr)
	case tar.TypeReg, tar.TypeRegA: //nolint:staticcheck
		return u.fileEntry(dir, rel, base, hdr, r)
	case tar.TypeSymlink:
		return u.symlinkEntry(dir, rel, base, hdr)
	case tar.TypeLink:
		return u.hardLinkEntry(dir, rel, base, hdr)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return u.nodeEntry(dir, rel, base, hdr)
	default:
		return fmt.Errorf("unsupported tar entry type %q", hdr.Typeflag)
	}
}

// dirEntry makes the directory entry rel (base in the open directory
// dir), or keeps the directory already there, and sets its metadata; its
// times are set last, by finishDirs.
func (u *unpacker) dirEntry(dir int, rel, base string, hdr *tar.Header) error {
	isDir, err := u.removeExisting(dir, rel, true)
	if err != nil {
		return err
	}
	if !isDir {
		if err := unix.Mkdirat(dir, base, 0o700); err != nil {
			return err
		}
	}
	how := &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC, Resolve: resolveFlags}
	fd, err := unix.Openat2(dir, base, how)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := u.setMeta(fd, hdr); err != nil {
		return err
	}
	u.dirTimes = append(u.dirTimes, dirTime{rel, hdr.AccessTime, hdr.ModTime})
	return nil
}

// fileEntry writes the regular file entry rel (base in dir) with its
// content from r, in place of what was there, created anew (O_EXCL, never
// through a symlink).
func (u *unpacker) fileEntry(dir int, rel, base string, hdr *tar.Header, r io.Reader) error {
	if _, err := u.removeExisting(dir, rel, false); err != nil {
		return err
	}
	fd, err := unix.Openat(dir, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	werr := copyToFd(fd, r, hdr.Size)
	if werr == nil {
		werr = u.setMeta(fd, hdr)
	}
	unix.Close(fd)
	if werr != nil {
		return werr
	}
	return setTimes(dir, base, hdr)
}

// symlinkEntry makes the symlink entry rel (base in dir), in place of
// what was there. Its target is checked for size and NUL only: nothing
// here ever follows it.
func (u *unpacker) symlinkEntry(dir int, rel, base string, hdr *tar.Header) error {
	if hdr.Linkname == "" || len(hdr.Linkname) > maxPathLen || strings.IndexByte(hdr.Linkname, 0) >= 0 {
		return errors.New("invalid symlink target")
	}
	if _, err := u.removeExisting(dir, rel, false); err != nil {
		return err
	}
	if err := unix.Symlinkat(hdr.Linkname, dir, base); err != nil {
		return err
	}
	return u.setMetaAt(dir, base, hdr, false)
}

// hardLinkEntry makes the hard link entry rel (base in dir), in place of
// what was there, to a target inside the layer reached without symlinks.
func (u *unpacker) hardLinkEntry(dir int, rel, base string, hdr *tar.Header) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil || target == "" {
		return fmt.Errorf("invalid hard link target %q", hdr.Linkname)
	}
	if target == rel {
		return errors.New("hard link to itself")
	}
	if _, err := u.removeExisting(dir, rel, false); err != nil {
		return err
	}
	tdir, err := u.openDir(path.Dir(target), false)
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	// flags 0: a symlink target is linked itself, never followed.
	if err := unix.Linkat(tdir, path.Base(target), dir, base, 0); err != nil {
		return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
	}
	return nil
}

// nodeEntry makes the FIFO entry rel (base in dir), in place of what was
// there. Device nodes are dropped under dev/ and refused elsewhere.
func (u *unpacker) nodeEntry(dir int, rel, base string, hdr *tar.Header) error {
	if hdr.Typeflag != tar.TypeFifo {
		// A sandbox's /dev is its own tmpfs, so the device nodes of a
		// root filesystem tarball's dev/ are never seen: drop them.
		// Anywhere else a device node has no business in a layer.
		if rel == "dev" || strings.HasPrefix(rel, "dev/") {
			return nil
		}
		return errors.New("device nodes are not allowed in layers (only under dev/, where they are dropped)")
	}
	mode := uint32(unix.S_IFIFO)
	if hdr.Typeflag == tar.TypeChar {
		mode = unix.S_IFCHR
	} else if hdr.Typeflag == tar.TypeBlock {
		mode = unix.S_IFBLK
	}
	if hdr.Devmajor < 0 || hdr.Devminor < 0 || hdr.Devmajor > 0xfff || hdr.Devminor > 0xfffff {
		return errors.New("device number out of range")
	}
	if _, err := u.removeExisting(dir, rel, false); err != nil {
		return err
	}
	dev := int(unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor)))
	if err := unix.Mknodat(dir, base, mode|0o600, dev); err != nil {
		return err
	}
	return u.setMetaAt(dir, base, hdr, true)
}

// whiteout turns an OCI whiteout entry into its overlayfs form.
func (u *unpacker) whiteout(dir int, base string) error {
	if base == whiteoutOpaque {
		return unix.Fsetxattr(dir, "trusted.overlay.opaque", []byte("y"), 0)
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil // other AUFS metadata (.wh..wh.plnk etc.) has no overlay meaning
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if target == "" || target == "." || target == ".." {
		return errors.New("invalid whiteout")
	}
	// A whiteout hides lower layers only; an entry of this layer wins.
	var st unix.Stat_t
	if err := unix.Fstatat(dir, target, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		return nil
	}
	if err := unix.Mknodat(dir, target, unix.S_IFCHR, 0); err != nil {
		return err
	}
	return unix.Fchownat(dir, target, 0, 0, unix.AT_SYMLINK_NOFOLLOW)
}

func copyToFd(fd int, r io.Reader, size int64) error {
	buf := make([]byte, 128<<10)
	for size > 0 {
		n := int64(len(buf))
		if n > size {
			n = size
		}
		m, err := io.ReadFull(r, buf[:n])
		if m > 0 {
			if werr := writeAll(fd, buf[:m]); werr != nil {
				return werr
			}
			size -= int64(m)
		}
		if err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return fmt.Errorf("truncated file content: %w", io.ErrUnexpectedEOF)
			}
			return err
		}
	}
	return nil
}

func writeAll(fd int, b []byte) error {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		b = b[n:]
	}
	return nil
}

// setMeta applies owner, mode and xattrs to an open descriptor. The owner
// is set first: chown clears setuid/setgid, chmod then restores exactly
// the bits of the image.
func (u *unpacker) setMeta(fd int, hdr *tar.Header) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmod(fd, uint32(hdr.Mode&0o7777)); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	for k, v := range xattrs(hdr) {
		if err := unix.Fsetxattr(fd, k, []byte(v), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
			return fmt.Errorf("setxattr %s: %w", k, err)
		}
	}
	return nil
}

// setMetaAt applies metadata to base in dir without following it (symlinks
// and device nodes, which must not be opened).
func (u *unpacker) setMetaAt(dir int, base string, hdr *tar.Header, chmod bool) error {
	if err := unix.Fchownat(dir, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if chmod {
		// base was just created by us as a device node or fifo in a private
		// tree, so following is not possible here.
		if err := unix.Fchmodat(dir, base, uint32(hdr.Mode&0o7777), 0); err != nil {
			return fmt.Errorf("chmod: %w", err)
		}
	}
	if xs := xattrs(hdr); len(xs) > 0 {
		p := "/proc/self/fd/" + strconv.Itoa(dir) + "/" + base
		for k, v := range xs {
			if err := unix.Lsetxattr(p, k, []byte(v), 0); err != nil && !errors.Is(err, unix.ENOTSUP) && !errors.Is(err, unix.EPERM) {
				return fmt.Errorf("setxattr %s: %w", k, err)
			}
		}
	}
	return setTimes(dir, base, hdr)
}

// xattrs returns the extended attributes of hdr that a layer may carry:
// user.*, security.capability and POSIX ACLs. Overlay's own trusted.*
// attributes are never taken from an archive.
func xattrs(hdr *tar.Header) map[string]string {
	var out map[string]string
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		if strings.HasPrefix(name, "user.") || name == "security.capability" ||
			name == "system.posix_acl_access" || name == "system.posix_acl_default" {
			if out == nil {
				out = map[string]string{}
			}
			out[name] = v
		}
	}
	return out
}

func timespec(t time.Time) unix.Timespec {
	if t.IsZero() {
		return unix.Timespec{}
	}
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

func setTimes(dir int, base string, hdr *tar.Header) error {
	return utimes(dir, base, hdr.AccessTime, hdr.ModTime)
}

func utimes(dir int, base string, atime, mtime time.Time) error {
	if atime.IsZero() {
		atime = mtime
	}
	ts := []unix.Timespec{timespec(atime), timespec(mtime)}
	if err := unix.UtimesNanoAt(dir, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("utimes: %w", err)
	}
	return nil
}

// finishDirs sets directory times last, deepest first, since creating
// children changed them.
func (u *unpacker) finishDirs() error {
	for i := len(u.dirTimes) - 1; i >= 0; i-- {
		d := u.dirTimes[i]
		if d.rel == "" {
			if err := utimes(u.root, ".", d.atime, d.mtime); err != nil {
				return err
			}
			continue
		}
		dir, err := u.openDir(path.Dir(d.rel), false)
		if err != nil {
			continue // replaced later in the archive
		}
		if err := utimes(dir, path.Base(d.rel), d.atime, d.mtime); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
	}
	return nil
}
