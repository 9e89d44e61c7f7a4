package agent

import (
	"os"
	"path"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
)

// beneath is the resolution for names relative to an already resolved
// directory that must not leave it.
const beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS

// openNoFollow opens name (one component) in dirfd without following any
// symlink.
func openNoFollow(dirfd int, name string, flags int, mode uint32) (int, error) {
	return openat2(dirfd, name, flags|unix.O_NOFOLLOW, mode, beneath|unix.RESOLVE_NO_SYMLINKS)
}

// owner is who owns files the agent creates: the default user, else the
// agent itself.
func (a *Agent) owner() (int, int, bool) {
	if a.defUser == nil {
		return 0, 0, false
	}
	return int(a.defUser.uid), int(a.defUser.gid), true
}

func (a *Agent) chownFD(fd int) {
	if uid, gid, ok := a.owner(); ok {
		_ = unix.Fchown(fd, uid, gid)
	}
}

func fileInfo(name, p string, st *unix.Stat_t, target string) *agentproto.FileInfo {
	fi := &agentproto.FileInfo{
		Name:    name,
		Path:    p,
		Size:    st.Size,
		Mode:    st.Mode & 0o7777,
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC(),
		Target:  target,
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		fi.Type = "file"
	case unix.S_IFDIR:
		fi.Type = "dir"
	case unix.S_IFLNK:
		fi.Type = "symlink"
	default:
		fi.Type = "other"
	}
	return fi
}

// statAt lstats name in dirfd.
func statAt(dirfd int, name, p string) (*agentproto.FileInfo, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, err
	}
	target := ""
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		target, _ = readlinkAt(dirfd, name)
	}
	return fileInfo(path.Base(p), p, &st, target), nil
}

func readlinkAt(dirfd int, name string) (string, error) {
	b := make([]byte, 256)
	for {
		n, err := unix.Readlinkat(dirfd, name, b)
		if err != nil {
			return "", err
		}
		if n < len(b) {
			return string(b[:n]), nil
		}
		b = make([]byte, 2*len(b))
	}
}

// stat lstats a cleaned path.
func (a *Agent) stat(p string) (*agentproto.FileInfo, error) {
	if p == "/" {
		var st unix.Stat_t
		if err := unix.Fstat(a.root.fd, &st); err != nil {
			return nil, err
		}
		return fileInfo("/", "/", &st, ""), nil
	}
	pfd, base, err := a.root.parent(p)
	if err != nil {
		return nil, err
	}
	defer unix.Close(pfd)
	return statAt(pfd, base, p)
}

func (a *Agent) fileStat(req *agentproto.PathRequest) (any, error) {
	p, err := cleanPath(req.Path)
	if err != nil {
		return nil, err
	}
	fi, err := a.stat(p)
	if err != nil {
		return nil, fsErr("stat", p, err)
	}
	return fi, nil
}

func (a *Agent) fileRead(cl *call, req *agentproto.PathRequest) (any, error) {
	p, err := cleanPath(req.Path)
	if err != nil {
		return nil, err
	}
	fd, err := a.root.open(p, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fsErr("read", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fsErr("read", p, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return nil, errf(agentproto.ErrIsDir, "read %s: is a directory", p)
	case unix.S_IFREG:
	default:
		return nil, errf(agentproto.ErrInvalid, "read %s: not a regular file", p)
	}
	bp := bulkPool.Get().(*[]byte)
	defer bulkPool.Put(bp)
	buf := *bp
	for {
		n, err := f.Read(buf)
		if n > 0 {
			if err := cl.chunk(agentproto.StreamData, buf[:n]); err != nil {
				return nil, err
			}
		}
		if err != nil {
			break
		}
	}
	return fileInfo(path.Base(p), p, &st, ""), nil
}

// mkdirAll creates p and its missing parents inside the root.
func (a *Agent) mkdirAll(p string, mode uint32) error {
	if p == "/" {
		return nil
	}
	fd, err := a.root.open(p, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err == nil {
		unix.Close(fd)
		return nil
	}
	if err != unix.ENOENT {
		return err
	}
	if err := a.mkdirAll(path.Dir(p), 0o755); err != nil {
		return err
	}
	pfd, base, err := a.root.parent(p)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	return a.mkdirAt(pfd, base, mode, true)
}

// mkdirAt creates one directory with exactly mode, owned by owner().
func (a *Agent) mkdirAt(pfd int, base string, mode uint32, existOK bool) error {
	if err := unix.Mkdirat(pfd, base, 0o700); err != nil {
		if err == unix.EEXIST && existOK {
			return nil
		}
		return err
	}
	fd, err := openNoFollow(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	a.chownFD(fd)
	return unix.Fchmod(fd, mode&0o1777)
}

func (a *Agent) fileMkdir(req *agentproto.MkdirRequest) (any, error) {
	p, err := cleanPath(req.Path)
	if err != nil {
		return nil, err
	}
	mode := req.Mode
	if mode == 0 {
		mode = 0o755
	}
	if req.Parents {
		if err := a.mkdirAll(p, mode); err != nil {
			return nil, fsErr("mkdir", p, err)
		}
	} else {
		if p == "/" {
			return nil, errf(agentproto.ErrExists, "mkdir /: exists")
		}
		pfd, base, err := a.root.parent(p)
		if err != nil {
			return nil, fsErr("mkdir", p, err)
		}
		err = a.mkdirAt(pfd, base, mode, false)
		unix.Close(pfd)
		if err != nil {
			return nil, fsErr("mkdir", p, err)
		}
	}
	fi, err := a.stat(p)
	if err != nil {
		return nil, fsErr("mkdir", p, err)
	}
	if fi.Type != "dir" {
		return nil, errf(agentproto.ErrExists, "mkdir %s: exists and is not a directory", p)
	}
	return fi, nil
}

func (a *Agent) fileWrite(req *agentproto.WriteRequest) (any, error) {
	p, err := cleanPath(req.Path)
	if err != nil {
		return nil, err
	}
	if p == "/" {
		return nil, errf(agentproto.ErrIsDir, "write /: is a directory")
	}
	mode := req.Mode & 0o1777 // never setuid/setgid
	if req.Mode == 0 {
		mode = 0o644
	}
	if req.At {
		return a.writeAt(p, req.Data, req.Offset)
	}
	if err := a.mkdirAll(path.Dir(p), 0o755); err != nil {
		return nil, fsErr("write", p, err)
	}
	if req.Append {
		return a.appendFile(p, req.Data, mode)
	}
	pfd, base, err := a.root.parent(p)
	if err != nil {
		return nil, fsErr("write", p, err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil, errf(agentproto.ErrIsDir, "write %s: is a directory", p)
	}
	tmp := ".warren-" + newID() + ".tmp"
	fd, err := openNoFollow(pfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err != nil {
		return nil, fsErr("write", p, err)
	}
	ok := false
	defer func() {
		if !ok {
			_ = unix.Unlinkat(pfd, tmp, 0)
		}
	}()
	err = writeAll(fd, req.Data)
	if err == nil {
		a.chownFD(fd)
		err = unix.Fchmod(fd, mode)
	}
	if err == nil {
		err = unix.Fstat(fd, &st)
	}
	unix.Close(fd)
	if err == nil {
		err = unix.Renameat(pfd, tmp, pfd, base)
	}
	if err != nil {
		return nil, fsErr("write", p, err)
	}
	ok = true
	return fileInfo(base, p, &st, ""), nil
}

func (a *Agent) appendFile(p string, data []byte, mode uint32) (any, error) {
	created := true
	fd, err := a.root.open(p, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT|unix.O_EXCL, 0o600)
	if err == unix.EEXIST {
		created = false
		fd, err = a.root.open(p, unix.O_WRONLY|unix.O_APPEND, 0)
	}
	if err != nil {
		return nil, fsErr("write", p, err)
	}
	defer unix.Close(fd)
	if created {
		a.chownFD(fd)
		_ = unix.Fchmod(fd, mode)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fsErr("write", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, errf(agentproto.ErrInvalid, "write %s: not a regular file", p)
	}
	if err := writeAll(fd, data); err != nil {
		return nil, fsErr("write", p, err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fsErr("write", p, err)
	}
	return fileInfo(path.Base(p), p, &st, ""), nil
}

// writeAt writes data at offset of the existing regular file p: one
// chunk of an upload whose chunks are written in parallel.
func (a *Agent) writeAt(p string, data []byte, offset int64) (any, error) {
	if offset < 0 {
		return nil, errf(agentproto.ErrInvalid, "write %s: negative offset", p)
	}
	fd, err := a.root.open(p, unix.O_WRONLY, 0)
	if err != nil {
		return nil, fsErr("write", p, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fsErr("write", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, errf(agentproto.ErrInvalid, "write %s: not a regular file", p)
	}
	for len(data) > 0 {
		n, err := unix.Pwrite(fd, data, offset)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fsErr("write", p, err)
		}
		data, offset = data[n:], offset+int64(n)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fsErr("write", p, err)
	}
	return fileInfo(path.Base(p), p, &st, ""), nil
}

// listAt returns the sorted names in directory fd (which it does not close).
func listAt(fd int) ([]string, error) {
	dfd, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dfd), "dir")
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	return names, nil
}

func (a *Agent) fileList(req *agentproto.PathRequest) (any, error) {
	p, err := cleanPath(req.Path)
	if err != nil {
		return nil, err
	}
	fd, err := a.root.open(p, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, fsErr("list", p, err)
	}
	defer unix.Close(fd)
	names, err := listAt(fd)
	if err != nil {
		return nil, fsErr("list", p, err)
	}
	out := &agentproto.FileList{Files: make([]agentproto.FileInfo, 0, len(names))}
	for _, n := range names {
		fi, err := statAt(fd, n, path.Join(p, n))
		if err != nil {
			continue // vanished meanwhile
		}
		out.Files = append(out.Files, *fi)
	}
	return out, nil
}

func (a *Agent) fileRemove(req *agentproto.RemoveRequest) error {
	p, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	if p == "/" {
		return errf(agentproto.ErrInvalid, "remove /: refused")
	}
	pfd, base, err := a.root.parent(p)
	if err != nil {
		return fsErr("remove", p, err)
	}
	defer unix.Close(pfd)
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fsErr("remove", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		err = unix.Unlinkat(pfd, base, 0)
	} else if req.Recursive {
		err = removeTree(pfd, base)
	} else {
		err = unix.Unlinkat(pfd, base, unix.AT_REMOVEDIR)
	}
	if err != nil {
		return fsErr("remove", p, err)
	}
	return nil
}

// removeTree removes directory name in dirfd and everything below it,
// never following symlinks.
func removeTree(dirfd int, name string) error {
	fd, err := openNoFollow(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	names, err := listAt(fd)
	if err != nil {
		unix.Close(fd)
		return err
	}
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue
		}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR {
			err = removeTree(fd, n)
		} else {
			err = unix.Unlinkat(fd, n, 0)
		}
		if err != nil && err != unix.ENOENT {
			unix.Close(fd)
			return err
		}
	}
	unix.Close(fd)
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

func (a *Agent) fileRename(req *agentproto.RenameRequest) error {
	from, err := cleanPath(req.From)
	if err != nil {
		return err
	}
	to, err := cleanPath(req.To)
	if err != nil {
		return err
	}
	if from == "/" || to == "/" {
		return errf(agentproto.ErrInvalid, "rename: / cannot be renamed or replaced")
	}
	ffd, fbase, err := a.root.parent(from)
	if err != nil {
		return fsErr("rename", from, err)
	}
	defer unix.Close(ffd)
	tfd, tbase, err := a.root.parent(to)
	if err != nil {
		return fsErr("rename", to, err)
	}
	defer unix.Close(tfd)
	if err := unix.Renameat(ffd, fbase, tfd, tbase); err != nil {
		return fsErr("rename", from+" -> "+to, err)
	}
	return nil
}

// bulkPool holds the buffers of file reads (agentproto.BulkChunkSize).
var bulkPool = sync.Pool{New: func() any { b := make([]byte, agentproto.BulkChunkSize); return &b }}
