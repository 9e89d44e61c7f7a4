package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
)

// fsRoot resolves sandbox paths against a directory fd with
// openat2(RESOLVE_IN_ROOT|RESOLVE_NO_MAGICLINKS): neither symlinks nor ".."
// can lead out of it, whatever the agent's own root is.
type fsRoot struct {
	fd  int
	dir string
}

func openRoot(dir string) (*fsRoot, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dir, err)
	}
	return &fsRoot{fd: fd, dir: dir}, nil
}

const resolveFlags = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS

// cleanPath validates a sandbox path: absolute, no NUL. It returns the
// lexically cleaned absolute path.
func cleanPath(p string) (string, error) {
	if p == "" || p[0] != '/' {
		return "", errf(agentproto.ErrInvalid, "path %q is not absolute", p)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", errf(agentproto.ErrInvalid, "path contains a NUL byte")
	}
	if len(p) > unix.PathMax {
		return "", errf(agentproto.ErrInvalid, "path too long")
	}
	return path.Clean(p), nil
}

// rel turns a cleaned absolute path into one relative to the root.
func rel(p string) string {
	if p == "/" {
		return "."
	}
	return p[1:]
}

// open resolves p (cleaned, absolute) inside the root, following symlinks
// within it.
func (r *fsRoot) open(p string, flags int, mode uint32) (int, error) {
	return openat2(r.fd, rel(p), flags, mode, resolveFlags)
}

func openat2(dirfd int, p string, flags int, mode uint32, resolve uint64) (int, error) {
	how := &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolve}
	for {
		fd, err := unix.Openat2(dirfd, p, how)
		if err == unix.EAGAIN || err == unix.EINTR {
			continue
		}
		return fd, err
	}
}

// parent opens the directory containing p (O_PATH) and returns it with the
// final component. p must not be "/".
func (r *fsRoot) parent(p string) (int, string, error) {
	dir, base := path.Split(p)
	fd, err := r.open(path.Clean(dir), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", err
	}
	return fd, base, nil
}

// readSmall reads a whole (small) file inside the root.
func (r *fsRoot) readSmall(p string) ([]byte, error) {
	fd, err := r.open(p, unix.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 16<<20))
}

// fsErr maps an errno to the protocol's error codes.
func fsErr(op, p string, err error) error {
	var pe *agentproto.Error
	if errors.As(err, &pe) {
		return err
	}
	code := agentproto.ErrInternal
	var en unix.Errno
	if errors.As(err, &en) {
		switch en {
		case unix.ENOENT:
			code = agentproto.ErrNotFound
		case unix.EEXIST:
			code = agentproto.ErrExists
		case unix.ENOTDIR:
			code = agentproto.ErrNotDir
		case unix.EISDIR:
			code = agentproto.ErrIsDir
		case unix.ENOTEMPTY:
			code = agentproto.ErrNotEmpty
		case unix.EACCES, unix.EPERM, unix.EROFS:
			code = agentproto.ErrPermission
		case unix.ENOSPC, unix.EDQUOT:
			code = agentproto.ErrNoSpace
		case unix.EFBIG:
			code = agentproto.ErrTooLarge
		case unix.EINVAL, unix.ELOOP, unix.ENAMETOOLONG, unix.EXDEV, unix.EBUSY:
			code = agentproto.ErrInvalid
		case unix.EAGAIN:
			if op == "exec" {
				code = agentproto.ErrPidsLimit // fork refused at the pids limit
			}
		}
	}
	return &agentproto.Error{Code: code, Message: fmt.Sprintf("%s %s: %v", op, p, err)}
}
