package agent

// A VM's disk snapshot (OpUpperTar): the agent, PID 1 of the guest, packs
// the overlay's upper directory on the writable disk as an OCI layer tar
// for the edge, which unpacks it with the same hardened unpacker as any
// image layer and packs it as a snapshot's layer. The guest does the
// reading because it is the only safe reader of the disk: mounting a
// guest-written ext4 image on the host would hand the host kernel's ext4
// driver a filesystem that code in the guest may have crafted. The disk's
// filesystem is frozen (FIFREEZE: pending data written, writers wait,
// readers go on) while the tree is read, so the tar is one moment's state,
// as a container's snapshot is taken under the freezer.

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
)

// The filesystem freeze ioctls (linux/fs.h: _IOWR('X', 119/120, int)).
const (
	ioctlFIFREEZE = 0xC0045877
	ioctlFITHAW   = 0xC0045878
)

// vmUpper is the overlay's upper directory on a VM's writable disk, opened
// by vmRoot before the root is switched (no path reaches it afterwards);
// fd -1 outside a VM. mu makes one OpUpperTar at a time.
var vmUpper = struct {
	mu sync.Mutex
	fd int
}{fd: -1}

// upperTar streams the VM's upper directory (OpUpperTar).
func (a *Agent) upperTar(ctx context.Context, cl *call) (any, error) {
	vmUpper.mu.Lock()
	defer vmUpper.mu.Unlock()
	if vmUpper.fd < 0 {
		return nil, errf(agentproto.ErrInvalid, "upper.tar: this sandbox has no VM writable disk")
	}
	// A fresh descriptor of the directory: listing moves a descriptor's
	// offset, and vmUpper.fd is listed again by the next snapshot.
	root, err := unix.Openat(vmUpper.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("upper.tar: %w", err)
	}
	defer unix.Close(root)
	if err := unix.IoctlSetInt(root, ioctlFIFREEZE, 0); err != nil {
		return nil, fmt.Errorf("upper.tar: freeze the writable disk: %w", err)
	}
	t0 := time.Now()
	bw := bufio.NewWriterSize(chunkWriter{cl}, agentproto.BulkChunkSize)
	tw := tar.NewWriter(bw)
	err = upperTree(ctx, tw, root, "", map[[2]uint64]string{})
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = bw.Flush()
	}
	// Thawed before the answer: the edge's next request finds the disk
	// writable.
	terr := unix.IoctlSetInt(root, ioctlFITHAW, 0)
	frozen := time.Since(t0)
	if err != nil {
		return nil, fmt.Errorf("upper.tar: %w", err)
	}
	if terr != nil {
		return nil, fmt.Errorf("upper.tar: thaw the writable disk: %w", terr)
	}
	return &agentproto.UpperTarResult{FrozenMs: float64(frozen.Microseconds()) / 1000}, nil
}

// upperTree adds the entries of the overlay upper directory dirfd under
// prefix, in the OCI layer form: a whiteout (0/0 character device) is an
// empty ".wh.NAME", an opaque directory holds ".wh..wh..opq". Hard links
// of one file (links, by device and inode) are links to its first name;
// sockets are left out; other device nodes are sent as they are (the edge
// refuses them in a layer, as it does a container's).
func upperTree(ctx context.Context, tw *tar.Writer, dirfd int, prefix string, links map[[2]uint64]string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	names, err := listAt(dirfd)
	if err != nil {
		return err
	}
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("%s%s: %w", prefix, n, err)
		}
		name := prefix + n
		h := tarHeader(&st, name)
		h.AccessTime = time.Unix(st.Atim.Sec, st.Atim.Nsec)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := upperDir(ctx, tw, dirfd, n, name, h, links); err != nil {
				return err
			}
		case unix.S_IFLNK:
			target, err := readlinkAt(dirfd, n)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			h.Typeflag, h.Linkname = tar.TypeSymlink, target
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
		case unix.S_IFCHR, unix.S_IFBLK:
			if st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0 {
				if err := tw.WriteHeader(&tar.Header{Name: prefix + ".wh." + n, Typeflag: tar.TypeReg, Mode: 0o600,
					ModTime: h.ModTime, Format: tar.FormatPAX}); err != nil {
					return err
				}
				continue
			}
			h.Typeflag = tar.TypeChar
			if st.Mode&unix.S_IFMT == unix.S_IFBLK {
				h.Typeflag = tar.TypeBlock
			}
			h.Devmajor, h.Devminor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
		case unix.S_IFIFO:
			h.Typeflag = tar.TypeFifo
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
		case unix.S_IFREG:
			key := [2]uint64{st.Dev, st.Ino}
			if first, ok := links[key]; ok && st.Nlink > 1 {
				h.Typeflag, h.Linkname = tar.TypeLink, first
				if err := tw.WriteHeader(h); err != nil {
					return err
				}
				continue
			}
			if st.Nlink > 1 {
				links[key] = name
			}
			if err := upperFile(tw, dirfd, n, h); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
		}
	}
	return nil
}

// upperDir adds directory n of dirfd, called name in the tar, with header
// h: its entry, its opaque marker if it has one, and (upperTree) what it
// holds.
func upperDir(ctx context.Context, tw *tar.Writer, dirfd int, n, name string, h *tar.Header, links map[[2]uint64]string) error {
	fd, err := openNoFollow(dirfd, n, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	h.Name, h.Typeflag = name+"/", tar.TypeDir
	opaque, err := fdXattrs(fd, h)
	if err == nil {
		err = tw.WriteHeader(h)
	}
	if err == nil && opaque {
		err = tw.WriteHeader(&tar.Header{Name: name + "/.wh..wh..opq", Typeflag: tar.TypeReg, Mode: 0o600,
			ModTime: h.ModTime, Format: tar.FormatPAX})
	}
	if err == nil {
		err = upperTree(ctx, tw, fd, name+"/", links)
	}
	unix.Close(fd)
	return err
}

// upperFile adds regular file n of dirfd with header h.
func upperFile(tw *tar.Writer, dirfd int, n string, h *tar.Header) error {
	fd, err := openNoFollow(dirfd, n, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if _, err := fdXattrs(fd, h); err != nil {
		return err
	}
	// The disk is frozen: the file cannot change after this stat.
	h.Typeflag, h.Size = tar.TypeReg, st.Size
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	_, err = io.CopyN(tw, fdReader(fd), st.Size)
	return err
}

// fdXattrs records fd's extended attributes that a layer keeps (user.*,
// security.capability, POSIX ACLs; the edge filters them again) in h, and
// reports whether overlay marked the directory opaque. Overlay's other
// trusted.* attributes stay behind.
func fdXattrs(fd int, h *tar.Header) (opaque bool, err error) {
	names, err := flistxattr(fd)
	if err != nil {
		return false, err
	}
	for _, x := range names {
		keep := strings.HasPrefix(x, "user.") || x == "security.capability" ||
			x == "system.posix_acl_access" || x == "system.posix_acl_default"
		if !keep && x != "trusted.overlay.opaque" {
			continue
		}
		v, err := fgetxattr(fd, x)
		if err != nil {
			if errors.Is(err, unix.ENODATA) {
				continue
			}
			return false, err
		}
		if x == "trusted.overlay.opaque" {
			opaque = len(v) > 0 && v[0] == 'y'
			continue
		}
		if h.PAXRecords == nil {
			h.PAXRecords = map[string]string{}
		}
		h.PAXRecords["SCHILY.xattr."+x] = string(v)
	}
	return opaque, nil
}

func flistxattr(fd int) ([]string, error) {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Flistxattr(fd, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		var out []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" {
				out = append(out, s)
			}
		}
		return out, nil
	}
}

func fgetxattr(fd int, name string) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := unix.Fgetxattr(fd, name, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, 2*len(buf))
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}
