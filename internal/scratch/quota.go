package scratch

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// struct fsxattr (linux/fs.h) and its ioctls; x/sys/unix lacks them.
type fsxattr struct {
	xflags     uint32
	extsize    uint32
	nextents   uint32
	projid     uint32
	cowextsize uint32
	pad        [8]byte
}

const (
	fsIocFsGetXattr    = 0x801c581f // _IOR('X', 31, struct fsxattr)
	fsIocFsSetXattr    = 0x401c5820 // _IOW('X', 32, struct fsxattr)
	fsXflagProjInherit = 0x00000200
)

// struct fs_disk_quota (linux/dqblk_xfs.h).
type fsDiskQuota struct {
	version      int8
	flags        int8
	fieldmask    uint16
	id           uint32
	blkHardlimit uint64
	blkSoftlimit uint64
	inoHardlimit uint64
	inoSoftlimit uint64
	bcount       uint64
	icount       uint64
	itimer       int32
	btimer       int32
	iwarns       uint16
	bwarns       uint16
	itimerHi     int8
	btimerHi     int8
	rtbtimerHi   int8
	padding2     int8
	rtbHardlimit uint64
	rtbSoftlimit uint64
	rtbcount     uint64
	rtbtimer     int32
	rtbwarns     uint16
	padding3     int16
	padding4     [8]byte
}

const (
	fsDquotVersion = 1
	fsProjQuota    = 2      // FS_PROJ_QUOTA
	fsDqBSoft      = 1 << 2 // FS_DQ_BSOFT
	fsDqBHard      = 1 << 3 // FS_DQ_BHARD
	prjQuota       = 2      // PRJQUOTA
	qXGetQuota     = 0x5803 // XQM_CMD(3)
	qXSetQLim      = 0x5804 // XQM_CMD(4)
	maxProjID      = 1<<32 - 2
)

var _ [112]byte = [unsafe.Sizeof(fsDiskQuota{})]byte{}
var _ [28]byte = [unsafe.Sizeof(fsxattr{})]byte{}

func qcmd(cmd, typ int) uintptr { return uintptr(cmd<<8 | typ&0xff) }

// quotactl runs a project-quota command on the scratch filesystem through
// quotactl_fd (Linux 5.14+), which needs no block device path.
func (s *Scratch) quotactl(cmd int, projid uint32, dq *fsDiskQuota) error {
	_, _, e := unix.Syscall6(unix.SYS_QUOTACTL_FD, uintptr(s.rootfd), qcmd(cmd, prjQuota), uintptr(projid),
		uintptr(unsafe.Pointer(dq)), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func (s *Scratch) setLimit(projid uint32, bytes int64) error {
	blocks := uint64(bytes+511) / 512 // basic blocks
	dq := fsDiskQuota{version: fsDquotVersion, flags: fsProjQuota, fieldmask: fsDqBHard | fsDqBSoft,
		id: projid, blkHardlimit: blocks, blkSoftlimit: blocks}
	if err := s.quotactl(qXSetQLim, projid, &dq); err != nil {
		return fmt.Errorf("Q_XSETQLIM project %d: %w", projid, err)
	}
	return nil
}

func getFsxattr(fd int) (fsxattr, error) {
	var x fsxattr
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFsGetXattr, uintptr(unsafe.Pointer(&x)))
	if e != 0 {
		return x, e
	}
	return x, nil
}

func setProject(fd int, projid uint32) error {
	x, err := getFsxattr(fd)
	if err != nil {
		return fmt.Errorf("FS_IOC_FSGETXATTR: %w", err)
	}
	x.projid = projid
	x.xflags |= fsXflagProjInherit
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFsSetXattr, uintptr(unsafe.Pointer(&x))); e != 0 {
		return fmt.Errorf("FS_IOC_FSSETXATTR: %w", e)
	}
	return nil
}

// projectOf reads the project id of the directory id (0: none).
func (s *Scratch) projectOf(id string) (uint32, error) {
	fd, err := unix.Openat(s.rootfd, id, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	x, err := getFsxattr(fd)
	return x.projid, err
}

// loadProjects rebuilds the project map from the directories' inodes.
func (s *Scratch) loadProjects() error {
	ids, err := s.List()
	if err != nil {
		return err
	}
	for _, id := range ids {
		p, err := s.projectOf(id)
		if err != nil {
			return fmt.Errorf("scratch: %s: %w", id, err)
		}
		if p != 0 {
			s.projects[p] = id
			if p >= s.next {
				s.next = p + 1
			}
		}
	}
	return nil
}

func (s *Scratch) freeProject() (uint32, error) {
	for i := 0; i < len(s.projects)+1; i++ {
		p := s.next
		s.next++
		if s.next == 0 || s.next > maxProjID {
			s.next = 1
		}
		if _, used := s.projects[p]; !used && p != 0 {
			return p, nil
		}
	}
	return 0, errors.New("scratch: no free project id")
}

// Alloc creates the directory for sandbox id, limited to limitBytes of
// disk (when Limited), and returns its path.
func (s *Scratch) Alloc(id string, limitBytes int64) (string, error) {
	if err := validID(id); err != nil {
		return "", err
	}
	dir := filepath.Join(s.dir, id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", errors.New("scratch: closed")
	}
	if !s.limited {
		if err := os.Mkdir(dir, 0o711); err != nil {
			return "", fmt.Errorf("scratch: %w", err)
		}
		return dir, nil
	}
	if limitBytes <= 0 {
		return "", fmt.Errorf("scratch: %s: limit must be positive", id)
	}
	if s.fstype == "btrfs" {
		if err := s.btrfsAlloc(id, limitBytes); err != nil {
			return "", fmt.Errorf("scratch: %s: %w", id, err)
		}
		return dir, nil
	}
	p, err := s.freeProject()
	if err != nil {
		return "", err
	}
	// The limit goes in first, so nothing is ever written unlimited.
	if err := s.setLimit(p, limitBytes); err != nil {
		return "", fmt.Errorf("scratch: %s: %w", id, err)
	}
	if err := unix.Mkdirat(s.rootfd, id, 0o711); err != nil {
		s.setLimit(p, 0)
		return "", fmt.Errorf("scratch: %s: %w", id, err)
	}
	fd, err := unix.Openat(s.rootfd, id, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == nil {
		err = setProject(fd, p)
		unix.Close(fd)
	}
	if err != nil {
		unix.Unlinkat(s.rootfd, id, unix.AT_REMOVEDIR)
		s.setLimit(p, 0)
		return "", fmt.Errorf("scratch: %s: %w", id, err)
	}
	s.projects[p] = id
	return dir, nil
}

// Free removes the sandbox directory and clears its limit. Freeing an id
// that does not exist is not an error.
func (s *Scratch) Free(id string) error {
	if err := validID(id); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fstype == "btrfs" && !s.closed {
		if err := s.btrfsFree(id); err != nil {
			return fmt.Errorf("scratch: free %s: %w", id, err)
		}
		return nil
	}
	var p uint32
	if s.limited && !s.closed {
		var err error
		p, err = s.projectOf(id)
		if err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("scratch: %s: %w", id, err)
		}
	}
	if err := os.RemoveAll(filepath.Join(s.dir, id)); err != nil {
		return fmt.Errorf("scratch: free %s: %w", id, err)
	}
	if p != 0 {
		if err := s.setLimit(p, 0); err != nil {
			return fmt.Errorf("scratch: %s: %w", id, err)
		}
		delete(s.projects, p)
	}
	return nil
}

// Usage returns the bytes of disk the sandbox directory uses.
func (s *Scratch) Usage(id string) (int64, error) {
	if err := validID(id); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.limited || s.closed {
		return duBytes(filepath.Join(s.dir, id))
	}
	if s.fstype == "btrfs" {
		n, err := s.btrfsUsage(id)
		if err != nil {
			return 0, fmt.Errorf("scratch: %s: %w", id, err)
		}
		return n, nil
	}
	p, err := s.projectOf(id)
	if err != nil {
		return 0, fmt.Errorf("scratch: %s: %w", id, err)
	}
	var dq fsDiskQuota
	if err := s.quotactl(qXGetQuota, p, &dq); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return 0, nil
		}
		return 0, fmt.Errorf("scratch: %s: Q_XGETQUOTA: %w", id, err)
	}
	return int64(dq.bcount) * 512, nil
}

// duBytes sums the allocated blocks under dir (the unlimited fallback).
func duBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err == nil {
			n += st.Blocks * 512
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("scratch: %w", err)
	}
	return n, nil
}
