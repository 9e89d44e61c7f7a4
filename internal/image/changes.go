package image

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"path"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// tarChanges streams a sandbox's writable overlay directory as an OCI layer
// tar: a 0/0 character device (an overlay whiteout) becomes ".wh.NAME", a
// directory marked trusted.overlay.opaque gets ".wh..wh..opq". Other device
// nodes, sockets and overlay metadata are not part of a layer: device nodes
// fail the pack with a clear error, sockets are skipped. Setuid and setgid
// bits and security.capability are kept only where the layers below (lowers,
// top-most first) had the same file with them, so a sandbox cannot mint a
// privileged binary into a layer others will use.
//
// idBase, when not 0, is the host id of the sandbox's root (its user
// namespace maps ids 0..65535 there): owners are written as the sandbox saw
// them (shiftID).
func tarChanges(upper string, lowers []string, idBase uint32) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := writeChanges(tw, upper, lowers, idBase)
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr
}

func writeChanges(tw *tar.Writer, root string, lowers []string, idBase uint32) error {
	links := map[inodeKey]string{}
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil // the root's own metadata comes from the layers below
		}
		rel = filepath.ToSlash(rel)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("pack: %w", &pathErr{p, err})
		}
		if t := st.Mode & unix.S_IFMT; t == unix.S_IFCHR || t == unix.S_IFBLK {
			if t == unix.S_IFCHR && st.Rdev == 0 {
				return tw.WriteHeader(&tar.Header{Name: path.Join(path.Dir(rel), whiteoutPrefix+path.Base(rel)),
					Typeflag: tar.TypeReg, Mode: 0o600, ModTime: timeOf(st.Mtim), Format: tar.FormatPAX})
			}
			return fmt.Errorf("pack: /%s is a device node; device nodes cannot be part of a layer (remove it first)", rel)
		}
		hdr, err := fileHeader(p, rel, &st, links)
		if err != nil || hdr == nil {
			return err
		}
		if idBase != 0 {
			hdr.Uid, hdr.Gid = shiftID(hdr.Uid, idBase), shiftID(hdr.Gid, idBase)
		}
		privileged(hdr, rel, lowers)
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if hdr.Typeflag == tar.TypeDir && isOpaque(p) {
			if err := tw.WriteHeader(&tar.Header{Name: rel + "/" + whiteoutOpaque, Typeflag: tar.TypeReg,
				Mode: 0o600, ModTime: timeOf(st.Mtim), Format: tar.FormatPAX}); err != nil {
				return err
			}
		}
		if hdr.Typeflag == tar.TypeReg && hdr.Size > 0 {
			return copyFile(tw, p, hdr.Size)
		}
		return nil
	})
}

// idRange is the number of ids of a sandbox's user namespace.
const idRange = 65536

// shiftID is host id as the sandbox whose root is host id base saw it: in
// its range, id - base; outside it (no file the sandbox made can be) the
// overflow id nobody (65534).
func shiftID(id int, base uint32) int {
	if b := int(base); id >= b && id < b+idRange {
		return id - b
	}
	return 65534
}

func isOpaque(p string) bool {
	buf := make([]byte, 4)
	n, err := unix.Lgetxattr(p, "trusted.overlay.opaque", buf)
	return err == nil && n == 1 && buf[0] == 'y'
}

// privileged strips setuid, setgid and file capabilities from hdr unless
// the top-most lower layer holding rel has the same bits and capability.
func privileged(hdr *tar.Header, rel string, lowers []string) {
	const suid = unix.S_ISUID | unix.S_ISGID
	capKey := "SCHILY.xattr.security.capability"
	wantCap, hasCap := hdr.PAXRecords[capKey]
	if hdr.Mode&suid == 0 && !hasCap {
		return
	}
	if hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeDir {
		hdr.Mode &^= suid
		delete(hdr.PAXRecords, capKey)
		return
	}
	var lowerMode int64 = -1
	lowerCap := ""
	for _, l := range lowers {
		var st unix.Stat_t
		lp := filepath.Join(l, filepath.FromSlash(rel))
		if err := unix.Lstat(lp, &st); err != nil {
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
			break // whited out below: the file is new
		}
		lowerMode = int64(st.Mode & 0o7777)
		buf := make([]byte, 256)
		if n, err := unix.Lgetxattr(lp, "security.capability", buf); err == nil {
			lowerCap = string(buf[:n])
		}
		break
	}
	if lowerMode < 0 || lowerMode&suid != hdr.Mode&suid {
		hdr.Mode &^= suid
	}
	if hasCap && (lowerMode < 0 || lowerCap != wantCap) {
		delete(hdr.PAXRecords, capKey)
	}
}
