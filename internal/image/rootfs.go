package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// tarDir streams dir as a layer tar: entries in lexical order (so the same
// tree always gives the same diff id), owners, modes, times, devices, hard
// links and xattrs kept. Sockets are skipped.
func tarDir(dir string) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := writeTree(tw, dir)
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr
}

type inodeKey struct{ dev, ino uint64 }

func writeTree(tw *tar.Writer, root string) error {
	links := map[inodeKey]string{}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("rootfs: %w", &pathErr{p, err})
		}
		name := filepath.ToSlash(rel)
		if rel == "." {
			name = "."
		}
		hdr, err := fileHeader(p, name, &st, links)
		if err != nil || hdr == nil {
			return err
		}
		if rel == "." {
			hdr.Name = "./"
		}
		if t := st.Mode & unix.S_IFMT; t == unix.S_IFCHR || t == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeChar
			if t == unix.S_IFBLK {
				hdr.Typeflag = tar.TypeBlock
			}
			hdr.Devmajor, hdr.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeReg && hdr.Size > 0 {
			return copyFile(tw, p, hdr.Size)
		}
		return nil
	})
}

// fileHeader describes the file at p (already lstat'ed into st) as a tar
// entry named name: directories, symlinks, fifos, regular files (a second
// name of an inode in links becomes a hard link) and xattrs. Sockets give
// nil (they are not archived); device nodes come back as regular-file
// headers for the caller to decide on.
func fileHeader(p, name string, st *unix.Stat_t, links map[inodeKey]string) (*tar.Header, error) {
	hdr := &tar.Header{
		Name: name, Mode: int64(st.Mode & 0o7777), Uid: int(st.Uid), Gid: int(st.Gid),
		ModTime: timeOf(st.Mtim), Format: tar.FormatPAX, Typeflag: tar.TypeReg,
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		hdr.Typeflag = tar.TypeDir
		if name != "." {
			hdr.Name += "/"
		}
	case unix.S_IFLNK:
		hdr.Typeflag = tar.TypeSymlink
		var err error
		if hdr.Linkname, err = os.Readlink(p); err != nil {
			return nil, err
		}
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	case unix.S_IFSOCK:
		return nil, nil
	case unix.S_IFREG:
		if st.Nlink > 1 {
			k := inodeKey{st.Dev, st.Ino}
			if first, ok := links[k]; ok {
				hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
				break
			}
			links[k] = hdr.Name
		}
		hdr.Size = st.Size
	}
	if err := addXattrs(hdr, p); err != nil {
		return nil, err
	}
	return hdr, nil
}

func copyFile(w io.Writer, p string, size int64) error {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.CopyN(w, f, size)
	if err != nil {
		return fmt.Errorf("rootfs: %s changed while reading (%d of %d bytes): %w", p, n, size, err)
	}
	return nil
}

func addXattrs(hdr *tar.Header, p string) error {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		return nil // no xattrs, or the filesystem has none
	}
	buf := make([]byte, sz)
	sz, err = unix.Llistxattr(p, buf)
	if err != nil {
		return nil
	}
	for _, name := range strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00") {
		if name == "" || strings.HasPrefix(name, "trusted.overlay.") {
			continue
		}
		vsz, err := unix.Lgetxattr(p, name, nil)
		if err != nil {
			continue
		}
		val := make([]byte, vsz)
		if vsz, err = unix.Lgetxattr(p, name, val); err != nil {
			if errors.Is(err, unix.ENODATA) {
				continue
			}
			return fmt.Errorf("rootfs: xattr %s of %s: %w", name, p, err)
		}
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords["SCHILY.xattr."+name] = string(val[:vsz])
	}
	return nil
}

func timeOf(ts unix.Timespec) time.Time { return time.Unix(ts.Sec, ts.Nsec) }
