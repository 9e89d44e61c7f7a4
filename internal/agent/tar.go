package agent

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"io"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
)

// chunkWriter sends what is written as data chunks.
type chunkWriter struct{ cl *call }

func (w chunkWriter) Write(b []byte) (int, error) {
	for off := 0; off < len(b); off += agentproto.ChunkSize {
		end := min(off+agentproto.ChunkSize, len(b))
		if err := w.cl.chunk(agentproto.StreamData, b[off:end]); err != nil {
			return off, err
		}
	}
	return len(b), nil
}

// tarGet streams a tar of a file or directory tree (symlinks as symlinks;
// entries relative to the directory, or the file's base name).
func (a *Agent) tarGet(cl *call, req *agentproto.PathRequest) error {
	p, err := cleanPath(req.Path)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(chunkWriter{cl}, agentproto.BulkChunkSize)
	tw := tar.NewWriter(bw)
	fd, err := a.root.open(p, unix.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		return fsErr("tar", p, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return fsErr("tar", p, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		err = tarTree(tw, fd, "")
	} else {
		err = tarFile(tw, fd, &st, path.Base(p))
	}
	unix.Close(fd)
	if err == nil {
		err = tw.Close()
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		return fsErr("tar", p, err)
	}
	return nil
}

func tarHeader(st *unix.Stat_t, name string) *tar.Header {
	return &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(st.Mtim.Sec, st.Mtim.Nsec),
		Format:  tar.FormatPAX,
	}
}

func tarFile(tw *tar.Writer, fd int, st *unix.Stat_t, name string) error {
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	h := tarHeader(st, name)
	h.Typeflag = tar.TypeReg
	h.Size = st.Size
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	// A raw reader: an os.File here would close fd again when finalized.
	n, err := io.CopyN(tw, fdReader(fd), st.Size)
	if err == io.EOF { // shrank meanwhile: pad
		_, err = io.CopyN(tw, zeroReader{}, st.Size-n)
	}
	return err
}

// fdReader reads a descriptor it does not own.
type fdReader int

func (r fdReader) Read(b []byte) (int, error) {
	for {
		n, err := unix.Read(int(r), b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == 0 && len(b) > 0 {
			return 0, io.EOF
		}
		return n, nil
	}
}

type zeroReader struct{}

func (zeroReader) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}

// tarTree adds the entries of directory dirfd under prefix.
func tarTree(tw *tar.Writer, dirfd int, prefix string) error {
	names, err := listAt(dirfd)
	if err != nil {
		return err
	}
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			continue
		}
		name := prefix + n
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			h := tarHeader(&st, name+"/")
			h.Typeflag = tar.TypeDir
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			fd, err := openNoFollow(dirfd, n, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if err != nil {
				continue
			}
			err = tarTree(tw, fd, name+"/")
			unix.Close(fd)
			if err != nil {
				return err
			}
		case unix.S_IFLNK:
			target, err := readlinkAt(dirfd, n)
			if err != nil {
				continue
			}
			h := tarHeader(&st, name)
			h.Typeflag = tar.TypeSymlink
			h.Linkname = target
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
		case unix.S_IFREG:
			fd, err := openNoFollow(dirfd, n, unix.O_RDONLY|unix.O_NONBLOCK, 0)
			if err != nil {
				continue
			}
			var fst unix.Stat_t
			if err = unix.Fstat(fd, &fst); err == nil {
				err = tarFile(tw, fd, &fst, name)
			}
			unix.Close(fd)
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// tarPuts are the extractions in progress, by handle.
type tarPuts struct {
	mu sync.Mutex
	m  map[string]*tarPut
}

type tarPut struct {
	mu    sync.Mutex // one request of a handle at a time
	pw    *io.PipeWriter
	done  chan struct{}
	files int
	err   error
}

func newTarPuts() *tarPuts { return &tarPuts{m: make(map[string]*tarPut)} }

func (a *Agent) tarPut(ctx context.Context, req *agentproto.TarPutRequest) (any, error) {
	handle := req.Handle
	var tp *tarPut
	if handle == "" {
		p, err := cleanPath(req.Path)
		if err != nil {
			return nil, err
		}
		if err := a.mkdirAll(p, 0o755); err != nil {
			return nil, fsErr("tar.put", p, err)
		}
		dirfd, err := a.root.open(p, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			return nil, fsErr("tar.put", p, err)
		}
		pr, pw := io.Pipe()
		tp = &tarPut{pw: pw, done: make(chan struct{})}
		handle = "tar-" + newID()[4:]
		go func() {
			tp.files, tp.err = a.extractAtomic(dirfd, pr)
			unix.Close(dirfd)
			if tp.err == nil {
				// Archivers pad past the end-of-archive marker (GNU tar to
				// 10 KiB records): read and drop the rest of the upload.
				_, _ = io.Copy(io.Discard, pr)
			}
			if tp.err != nil {
				tp.err = fsErr("tar.put", p, tp.err)
			}
			pr.CloseWithError(errors.New("extraction ended"))
			close(tp.done)
		}()
		go func() { // an upload abandoned by its connection ends
			select {
			case <-ctx.Done():
				pw.CloseWithError(errors.New("connection closed"))
				<-tp.done
				a.tars.remove(handle)
			case <-tp.done:
			}
		}()
		a.tars.mu.Lock()
		a.tars.m[handle] = tp
		a.tars.mu.Unlock()
	} else {
		a.tars.mu.Lock()
		tp = a.tars.m[handle]
		a.tars.mu.Unlock()
		if tp == nil {
			return nil, errf(agentproto.ErrNotFound, "tar.put: no handle %q", handle)
		}
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if req.Abort {
		tp.pw.CloseWithError(errors.New("upload broken"))
		<-tp.done
		a.tars.remove(handle)
		return nil, errf(agentproto.ErrInvalid, "tar.put: the upload broke; nothing was extracted")
	}
	if len(req.Data) > 0 {
		if _, err := tp.pw.Write(req.Data); err != nil {
			<-tp.done
			a.tars.remove(handle)
			return nil, tp.failure()
		}
	}
	if !req.Final {
		return &agentproto.TarPutResult{Handle: handle}, nil
	}
	tp.pw.Close()
	<-tp.done
	a.tars.remove(handle)
	if tp.err != nil {
		return nil, tp.err
	}
	return &agentproto.TarPutResult{Handle: handle, Files: tp.files}, nil
}

func (tp *tarPut) failure() error {
	if tp.err != nil {
		return tp.err
	}
	return errf(agentproto.ErrInvalid, "tar.put: extraction ended early")
}

func (t *tarPuts) remove(h string) {
	t.mu.Lock()
	delete(t.m, h)
	t.mu.Unlock()
}

// tarName validates and cleans an archive entry name.
func tarName(n string) (string, error) {
	if strings.IndexByte(n, 0) >= 0 {
		return "", errf(agentproto.ErrInvalid, "tar entry name contains NUL")
	}
	if strings.HasPrefix(n, "/") {
		return "", errf(agentproto.ErrInvalid, "tar entry %q is absolute", n)
	}
	for _, c := range strings.Split(n, "/") {
		if c == ".." {
			return "", errf(agentproto.ErrInvalid, "tar entry %q contains ..", n)
		}
	}
	return path.Clean(n), nil
}

// dirBeneath opens (creating when missing) directory rel below dirfd; no
// component may resolve outside dirfd.
func (a *Agent) dirBeneath(dirfd int, rel string) (int, error) {
	fd, err := openat2(dirfd, rel, unix.O_PATH|unix.O_DIRECTORY, 0, beneath)
	if err != unix.ENOENT || rel == "." {
		return fd, err
	}
	pfd, err := a.dirBeneath(dirfd, path.Dir(rel))
	if err != nil {
		return -1, err
	}
	err = a.mkdirAt(pfd, path.Base(rel), 0o755, true)
	unix.Close(pfd)
	if err != nil {
		return -1, err
	}
	return openat2(dirfd, rel, unix.O_PATH|unix.O_DIRECTORY, 0, beneath)
}

// stagePrefix names the staging directory of an extraction, inside the
// target directory (the same file system, so its entries can be renamed
// into place).
const stagePrefix = ".warren-tar-"

// extractAtomic unpacks a tar stream into dirfd all or nothing: into a
// staging directory inside dirfd first, then, once the whole archive was
// accepted and checked against what dirfd holds, merged into dirfd by
// renames (a file replaced atomically, a new directory moved whole, an
// existing one merged into). A rejected archive leaves dirfd as it was.
func (a *Agent) extractAtomic(dirfd int, r io.Reader) (int, error) {
	stage := stagePrefix + newID()[4:]
	if err := unix.Mkdirat(dirfd, stage, 0o700); err != nil {
		return 0, err
	}
	defer removeTree(dirfd, stage)
	sfd, err := openNoFollow(dirfd, stage, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(sfd)
	files, err := a.extract(sfd, dirfd, r)
	if err != nil {
		return files, err
	}
	if err := mergeTree(sfd, dirfd, stage, true); err != nil {
		return files, err
	}
	return files, mergeTree(sfd, dirfd, stage, false)
}

// mergeTree moves the entries of directory from into directory to (with
// check: only reports the conflicts that would stop it): a directory onto
// a directory is merged (and gets the staged one's mode), anything else
// is renamed over what is there; a directory over a non-directory, or the
// reverse, is refused, as extracting in place would. skip is a name of to
// left alone (the staging directory).
func mergeTree(from, to int, skip string, check bool) error {
	// listAt reads through a dup, which shares the offset: rewind, as
	// the check pass read this directory before.
	if _, err := unix.Seek(from, 0, io.SeekStart); err != nil {
		return err
	}
	names, err := listAt(from)
	if err != nil {
		return err
	}
	for _, n := range names {
		if n == skip {
			continue
		}
		var sst, tst unix.Stat_t
		if err := unix.Fstatat(from, n, &sst, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		terr := unix.Fstatat(to, n, &tst, unix.AT_SYMLINK_NOFOLLOW)
		if terr != nil && terr != unix.ENOENT {
			return terr
		}
		sdir := sst.Mode&unix.S_IFMT == unix.S_IFDIR
		tdir := terr == nil && tst.Mode&unix.S_IFMT == unix.S_IFDIR
		switch {
		case terr == nil && sdir != tdir:
			return errf(agentproto.ErrInvalid, "tar: %q: a directory and a file at the same path", n)
		case tdir:
			if err := mergeDir(from, to, n, check); err != nil {
				return err
			}
		case !check:
			if err := unix.Renameat(from, n, to, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// mergeDir merges directory n of from into directory n of to.
func mergeDir(from, to int, n string, check bool) error {
	sfd, err := openNoFollow(from, n, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(sfd)
	tfd, err := openNoFollow(to, n, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	if err := mergeTree(sfd, tfd, "", check); err != nil || check {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return err
	}
	return unix.Fchmod(tfd, st.Mode&0o1777)
}

// extract unpacks a tar stream into dirfd. Names must be relative without
// ".."; nothing is ever resolved outside dirfd; setuid/setgid bits are
// dropped; devices and fifos are skipped. A hard link whose target the
// archive does not hold links to that name in base (the directory dirfd
// stages for).
func (a *Agent) extract(dirfd, base int, r io.Reader) (int, error) {
	tr := tar.NewReader(r)
	files := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, nil
		}
		if err != nil {
			return files, errf(agentproto.ErrInvalid, "tar: %v", err)
		}
		name, err := tarName(h.Name)
		if err != nil {
			return files, err
		}
		if name == "." {
			continue
		}
		pfd, err := a.dirBeneath(dirfd, path.Dir(name))
		if err != nil {
			return files, err
		}
		err = a.extractOne(dirfd, base, pfd, path.Base(name), h, tr)
		unix.Close(pfd)
		if err != nil {
			return files, err
		}
		files++
	}
}

func (a *Agent) extractOne(dirfd, basefd, pfd int, base string, h *tar.Header, r io.Reader) error {
	mode := uint32(h.Mode) & 0o1777
	switch h.Typeflag {
	case tar.TypeDir:
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			fd, err := openNoFollow(pfd, base, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			return unix.Fchmod(fd, mode)
		}
		return a.mkdirAt(pfd, base, mode, false)
	case tar.TypeReg, tar.TypeRegA:
		if err := unlinkNonDir(pfd, base); err != nil {
			return err
		}
		fd, err := openNoFollow(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), base)
		defer f.Close()
		if _, err := io.Copy(f, r); err != nil {
			return err
		}
		a.chownFD(fd)
		if err := unix.Fchmod(fd, mode); err != nil {
			return err
		}
		ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
		_ = unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
		return nil
	case tar.TypeSymlink:
		if strings.IndexByte(h.Linkname, 0) >= 0 || h.Linkname == "" {
			return errf(agentproto.ErrInvalid, "tar: bad symlink target")
		}
		if err := unlinkNonDir(pfd, base); err != nil {
			return err
		}
		if err := unix.Symlinkat(h.Linkname, pfd, base); err != nil {
			return err
		}
		if uid, gid, ok := a.owner(); ok {
			_ = unix.Fchownat(pfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW)
		}
		return nil
	case tar.TypeLink:
		target, err := tarName(h.Linkname)
		if err != nil {
			return err
		}
		if err := unlinkNonDir(pfd, base); err != nil {
			return err
		}
		err = linkBeneath(dirfd, target, pfd, base)
		if err == unix.ENOENT && basefd >= 0 {
			err = linkBeneath(basefd, target, pfd, base)
		}
		return err
	}
	return nil // devices, fifos and others are skipped
}

// linkBeneath hard-links target (resolved beneath dirfd, never followed
// if a symlink) as base in pfd.
func linkBeneath(dirfd int, target string, pfd int, base string) error {
	tfd, err := openat2(dirfd, path.Dir(target), unix.O_PATH|unix.O_DIRECTORY, 0, beneath)
	if err != nil {
		return err
	}
	defer unix.Close(tfd)
	return unix.Linkat(tfd, path.Base(target), pfd, base, 0)
}

// unlinkNonDir removes base unless it is missing; a directory is an error.
func unlinkNonDir(pfd int, base string) error {
	err := unix.Unlinkat(pfd, base, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	return err
}
