package image

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// treeDigest is the content digest of a named layer uploaded as a tarball:
// the SHA-256 of a canonical listing of the unpacked tree, so that the same
// directory packed by any client (the CLI's Go tar, the Python SDK's
// tarfile, GNU tar; entries in any order, with or without the root entry,
// user and group names, PAX records or sub-second times) has one digest.
// Per entry, in lexical path order below the root: path, type and mode,
// uid, gid, xattrs, and for regular files the mtime in whole seconds, size
// and bytes, for symlinks the target, for devices the number. Directory
// and symlink times are left out: a tar without its parent directories'
// entries gets them at unpack time.
func treeDigest(root string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil || rel == "." {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: p, Err: err}
		}
		fmt.Fprintf(h, "%q %o %d %d", filepath.ToSlash(rel), st.Mode, st.Uid, st.Gid)
		if err := hashXattrs(h, p); err != nil {
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			fmt.Fprintf(h, " %d %d\n", st.Mtim.Sec, st.Size)
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(h, f)
			f.Close()
			if err != nil {
				return err
			}
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, " %q", target)
		case unix.S_IFCHR, unix.S_IFBLK:
			fmt.Fprintf(h, " %d", st.Rdev)
		}
		_, err = h.Write([]byte{'\n'})
		return err
	})
	if err != nil {
		return "", fmt.Errorf("image: digest of the layer's content: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// hashXattrs writes p's extended attributes, sorted by name.
func hashXattrs(w io.Writer, p string) error {
	sz, err := unix.Llistxattr(p, nil)
	if err != nil || sz == 0 {
		return nil // none, or a filesystem without them
	}
	buf := make([]byte, sz)
	if sz, err = unix.Llistxattr(p, buf); err != nil {
		return nil
	}
	names := strings.Split(strings.TrimRight(string(buf[:sz]), "\x00"), "\x00")
	sort.Strings(names)
	for _, n := range names {
		vs, err := unix.Lgetxattr(p, n, nil)
		if err != nil {
			continue
		}
		v := make([]byte, vs)
		if vs, err = unix.Lgetxattr(p, n, v); err != nil {
			continue
		}
		fmt.Fprintf(w, " %q=%q", n, v[:vs])
	}
	return nil
}
