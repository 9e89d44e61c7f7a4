package scratch

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// btrfs ioctls (linux/btrfs.h); x/sys/unix lacks them.
const (
	btrfsIocSubvolCreate   = 0x5000940e // _IOW(0x94, 14, struct btrfs_ioctl_vol_args)
	btrfsIocSnapDestroy    = 0x5000940f // _IOW(0x94, 15, struct btrfs_ioctl_vol_args)
	btrfsIocTreeSearch     = 0xd0009411 // _IOWR(0x94, 17, struct btrfs_ioctl_search_args)
	btrfsIocSubvolCreateV2 = 0x50009418 // _IOW(0x94, 24, struct btrfs_ioctl_vol_args_v2)
	btrfsIocSnapCreateV2   = 0x50009417 // _IOW(0x94, 23, struct btrfs_ioctl_vol_args_v2)
	btrfsIocFsInfo         = 0x8400941f // _IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)
	btrfsIocQuotaCtl       = 0xc0109428 // _IOWR(0x94, 40, struct btrfs_ioctl_quota_ctl_args)
	btrfsIocQgroupCreate   = 0x4010942a // _IOW(0x94, 42, struct btrfs_ioctl_qgroup_create_args)
	btrfsIocQgroupLimit    = 0x8030942b // _IOR(0x94, 43, struct btrfs_ioctl_qgroup_limit_args)

	btrfsQuotaCtlEnable       = 1
	btrfsQuotaCtlEnableSimple = 4 // squota, Linux 6.7+

	btrfsSubvolQgroupInherit  = 1 << 2 // BTRFS_SUBVOL_QGROUP_INHERIT
	btrfsQgroupInheritSetLim  = 1 << 0 // BTRFS_QGROUP_INHERIT_SET_LIMITS
	btrfsQgroupLimitMaxRfer   = 1 << 0 // BTRFS_QGROUP_LIMIT_MAX_RFER
	btrfsQuotaTreeObjectid    = 8
	btrfsQgroupInfoKey        = 242
	btrfsFirstFreeObjectid    = 256 // inode number of every subvolume root
	btrfsSuperMagic           = "_BHRfS_M"
	btrfsSuperMagicOffset     = 0x10040
	btrfsSearchHeaderSize     = 32
	btrfsQgroupInfoItemMinLen = 16 // generation, rfer
)

type btrfsVolArgs struct {
	fd   int64
	name [4088]byte
}

type btrfsQgroupLimit struct {
	flags, maxRfer, maxExcl, rsvRfer, rsvExcl uint64
}

// struct btrfs_qgroup_inherit with no qgroups to inherit from.
type btrfsQgroupInherit struct {
	flags, numQgroups, numRefCopies, numExclCopies uint64
	lim                                            btrfsQgroupLimit
}

type btrfsVolArgsV2 struct {
	fd      int64
	transid uint64
	flags   uint64
	size    uint64
	inherit uintptr // *btrfsQgroupInherit
	unused  [2]uint64
	name    [4040]byte
}

type btrfsQuotaCtlArgs struct{ cmd, status uint64 }

type btrfsQgroupCreateArgs struct{ create, qgroupid uint64 }

type btrfsQgroupLimitArgs struct {
	qgroupid uint64
	lim      btrfsQgroupLimit
}

type btrfsSearchKey struct {
	treeID                   uint64
	minObjectid, maxObjectid uint64
	minOffset, maxOffset     uint64
	minTransid, maxTransid   uint64
	minType, maxType         uint32
	nrItems, unused          uint32
	unused1                  [4]uint64
}

type btrfsSearchArgs struct {
	key btrfsSearchKey
	buf [4096 - 104]byte
}

var _ [4096]byte = [unsafe.Sizeof(btrfsVolArgs{})]byte{}
var _ [4096]byte = [unsafe.Sizeof(btrfsVolArgsV2{})]byte{}
var _ [4096]byte = [unsafe.Sizeof(btrfsSearchArgs{})]byte{}
var _ [104]byte = [unsafe.Sizeof(btrfsSearchKey{})]byte{}
var _ [48]byte = [unsafe.Sizeof(btrfsQgroupLimitArgs{})]byte{}
var _ [72]byte = [unsafe.Sizeof(btrfsQgroupInherit{})]byte{}

// btrfsQgroupsDir returns the sysfs directory of the qgroups of the
// filesystem at fd (/sys/fs/btrfs/<fsid>/qgroups).
func btrfsQgroupsDir(fd int) (string, error) {
	var a [1024]byte
	if err := btrfsIoctl(fd, btrfsIocFsInfo, unsafe.Pointer(&a)); err != nil {
		return "", fmt.Errorf("BTRFS_IOC_FS_INFO: %w", err)
	}
	u := a[16:32]
	return fmt.Sprintf("/sys/fs/btrfs/%x-%x-%x-%x-%x/qgroups", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]), nil
}

func btrfsIoctl(fd int, req uintptr, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg)); e != 0 {
		return e
	}
	return nil
}

// btrfsEnableQuota turns on quota accounting for the filesystem at dir:
// simple quotas where the kernel has them (accounted when extents are
// allocated and freed, no backref walks), else regular qgroups. It is a
// no-op when quotas are already on.
func btrfsEnableQuota(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	a := btrfsQuotaCtlArgs{cmd: btrfsQuotaCtlEnableSimple}
	err = btrfsIoctl(fd, btrfsIocQuotaCtl, unsafe.Pointer(&a))
	if err == nil {
		return nil
	}
	a = btrfsQuotaCtlArgs{cmd: btrfsQuotaCtlEnable}
	if err2 := btrfsIoctl(fd, btrfsIocQuotaCtl, unsafe.Pointer(&a)); err2 != nil {
		return fmt.Errorf("BTRFS_IOC_QUOTA_CTL: simple: %w, regular: %w", err, err2)
	}
	return nil
}

// btrfsAlloc creates subvolume id below the root with a qgroup limited to
// limit referenced bytes. The limit is part of the creating ioctl (qgroup
// inherit with SET_LIMITS), so nothing is ever written unlimited; kernels
// that refuse that get SUBVOL_CREATE followed by QGROUP_LIMIT.
func (s *Scratch) btrfsAlloc(id string, limit int64) error {
	lim := btrfsQgroupLimit{flags: btrfsQgroupLimitMaxRfer, maxRfer: uint64(limit)}
	inh := btrfsQgroupInherit{flags: btrfsQgroupInheritSetLim, lim: lim}
	v2 := btrfsVolArgsV2{flags: btrfsSubvolQgroupInherit, size: uint64(unsafe.Sizeof(inh)),
		inherit: uintptr(unsafe.Pointer(&inh))}
	copy(v2.name[:], id)
	if !s.noInherit {
		err := btrfsIoctl(s.rootfd, btrfsIocSubvolCreateV2, unsafe.Pointer(&v2))
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOTTY) {
			return fmt.Errorf("BTRFS_IOC_SUBVOL_CREATE_V2: %w", err)
		}
		s.noInherit = true
	}
	var v1 btrfsVolArgs
	copy(v1.name[:], id)
	if err := btrfsIoctl(s.rootfd, btrfsIocSubvolCreate, unsafe.Pointer(&v1)); err != nil {
		return fmt.Errorf("BTRFS_IOC_SUBVOL_CREATE: %w", err)
	}
	fd, err := unix.Openat(s.rootfd, id, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err == nil {
		// qgroupid 0: the qgroup of the subvolume fd is in.
		a := btrfsQgroupLimitArgs{lim: lim}
		err = btrfsIoctl(fd, btrfsIocQgroupLimit, unsafe.Pointer(&a))
		unix.Close(fd)
		if err != nil {
			err = fmt.Errorf("BTRFS_IOC_QGROUP_LIMIT: %w", err)
		}
	}
	if err != nil {
		s.btrfsFree(id)
		return err
	}
	return nil
}

var errNotSubvol = errors.New("not a btrfs subvolume")

// subvolID returns the subvolume id of dir id (statx STATX_SUBVOL, 6.10+).
func (s *Scratch) subvolID(id string) (uint64, error) {
	var st unix.Statx_t
	if err := unix.Statx(s.rootfd, id, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_INO|unix.STATX_SUBVOL, &st); err != nil {
		return 0, err
	}
	if st.Mask&unix.STATX_SUBVOL == 0 {
		return 0, errors.New("statx: no subvolume id")
	}
	if st.Ino != btrfsFirstFreeObjectid {
		return 0, fmt.Errorf("%s: %w", id, errNotSubvol)
	}
	return st.Subvol, nil
}

// btrfsFree deletes subvolume id. Its qgroup cannot go with it: the kernel
// refuses (EBUSY) until the cleaner thread has dropped the subvolume's
// extents, which happens asynchronously (woken every commit interval, 30 s
// by default). Linux 6.10+ then removes the qgroup itself; Open sweeps any
// qgroup left without a subvolume (older kernels, or squota usage that had
// not reached zero at drop time).
func (s *Scratch) btrfsFree(id string) error {
	if _, err := s.subvolID(id); errors.Is(err, unix.ENOENT) {
		return nil
	} else if errors.Is(err, errNotSubvol) {
		return os.RemoveAll(filepath.Join(s.dir, id))
	} else if err != nil {
		return err
	}
	var v btrfsVolArgs
	copy(v.name[:], id)
	if err := btrfsIoctl(s.rootfd, btrfsIocSnapDestroy, unsafe.Pointer(&v)); err != nil {
		return fmt.Errorf("BTRFS_IOC_SNAP_DESTROY: %w", err)
	}
	return nil
}

// btrfsSweepQgroups removes the level-0 qgroups whose subvolume is gone
// and returns how many it removed. The kernel refuses (EBUSY) those whose
// subvolume is still being dropped; they are left for the next sweep.
func (s *Scratch) btrfsSweepQgroups() (int, error) {
	live := map[uint64]bool{5: true} // the top-level subvolume
	ids, err := s.List()
	if err != nil {
		return 0, err
	}
	for _, id := range ids {
		sv, err := s.subvolID(id)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", id, err)
		}
		live[sv] = true
	}
	groups, err := s.btrfsQgroups()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, q := range groups {
		if live[q] {
			continue
		}
		a := btrfsQgroupCreateArgs{create: 0, qgroupid: q}
		err := btrfsIoctl(s.rootfd, btrfsIocQgroupCreate, unsafe.Pointer(&a))
		switch {
		case err == nil:
			n++
		case errors.Is(err, unix.EBUSY), errors.Is(err, unix.ENOENT):
		default:
			return n, fmt.Errorf("BTRFS_IOC_QGROUP_CREATE (remove 0/%d): %w", q, err)
		}
	}
	return n, nil
}

// btrfsQgroups lists the level-0 qgroup ids in the quota tree.
func (s *Scratch) btrfsQgroups() ([]uint64, error) {
	var out []uint64
	min := uint64(0)
	for {
		a := btrfsSearchArgs{key: btrfsSearchKey{
			treeID:    btrfsQuotaTreeObjectid,
			minOffset: min, maxOffset: 1<<48 - 1, // level 0
			maxTransid: ^uint64(0),
			minType:    btrfsQgroupInfoKey, maxType: btrfsQgroupInfoKey,
			nrItems: 4096,
		}}
		if err := btrfsIoctl(s.rootfd, btrfsIocTreeSearch, unsafe.Pointer(&a)); err != nil {
			return nil, fmt.Errorf("BTRFS_IOC_TREE_SEARCH: %w", err)
		}
		if a.key.nrItems == 0 {
			return out, nil
		}
		pos := 0
		for i := uint32(0); i < a.key.nrItems && pos+btrfsSearchHeaderSize <= len(a.buf); i++ {
			h := a.buf[pos : pos+btrfsSearchHeaderSize]
			off := binary.NativeEndian.Uint64(h[16:])
			if binary.NativeEndian.Uint32(h[24:]) == btrfsQgroupInfoKey {
				out = append(out, off)
			}
			min = off + 1
			pos += btrfsSearchHeaderSize + int(binary.NativeEndian.Uint32(h[28:]))
		}
	}
}

// btrfsUsage returns the bytes charged to subvolume id's qgroup: the
// referenced bytes plus the data reservation of writes not yet committed,
// which is what the limit is checked against. Both come from sysfs
// (in-memory counters); without sysfs it reads the committed referenced
// bytes from the quota tree, which lag up to one commit interval.
func (s *Scratch) btrfsUsage(id string) (int64, error) {
	sv, err := s.subvolID(id)
	if err != nil {
		return 0, err
	}
	if s.qgroupsDir != "" {
		d := fmt.Sprintf("%s/0_%d/", s.qgroupsDir, sv)
		rfer, err1 := readUint(d + "referenced")
		rsv, err2 := readUint(d + "rsv_data")
		if err1 == nil && err2 == nil {
			return int64(rfer + rsv), nil
		}
	}
	return s.btrfsTreeUsage(sv)
}

func readUint(p string) (uint64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
}

// btrfsTreeUsage reads the committed referenced bytes of qgroup 0/sv from
// the quota tree with one TREE_SEARCH.
func (s *Scratch) btrfsTreeUsage(sv uint64) (int64, error) {
	a := btrfsSearchArgs{key: btrfsSearchKey{
		treeID:    btrfsQuotaTreeObjectid,
		minOffset: sv, maxOffset: sv,
		maxTransid: ^uint64(0),
		minType:    btrfsQgroupInfoKey, maxType: btrfsQgroupInfoKey,
		nrItems: 1,
	}}
	if err := btrfsIoctl(s.rootfd, btrfsIocTreeSearch, unsafe.Pointer(&a)); err != nil {
		return 0, fmt.Errorf("BTRFS_IOC_TREE_SEARCH: %w", err)
	}
	if a.key.nrItems == 0 {
		return 0, nil // no qgroup item committed yet
	}
	h := a.buf[:btrfsSearchHeaderSize]
	typ := binary.NativeEndian.Uint32(h[24:])
	off := binary.NativeEndian.Uint64(h[16:])
	n := binary.NativeEndian.Uint32(h[28:])
	if typ != btrfsQgroupInfoKey || off != sv || n < btrfsQgroupInfoItemMinLen {
		return 0, fmt.Errorf("quota tree: unexpected item %d/%d", typ, off)
	}
	item := a.buf[btrfsSearchHeaderSize:]
	return int64(binary.LittleEndian.Uint64(item[8:])), nil // rfer
}

// isSubvol reports whether dir (an entry of the scratch root) is a
// subvolume root.
func isSubvol(dir string) bool {
	var st unix.Stat_t
	return unix.Lstat(filepath.Clean(dir), &st) == nil && st.Ino == btrfsFirstFreeObjectid
}

// clonePrefix names the read-only snapshots Clone makes (never a valid id).
const clonePrefix = ".clone-"

// ErrNoClone: the scratch filesystem cannot clone a sandbox directory.
var ErrNoClone = errors.New("scratch: cloning needs btrfs")

// Clone makes a copy-on-write copy of sandbox directory id (one btrfs
// snapshot ioctl: no data is copied) for the caller to read or change, and
// returns its path and the function that removes it. Other filesystems
// answer ErrNoClone.
func (s *Scratch) Clone(id string) (string, func() error, error) {
	if err := validID(id); err != nil {
		return "", nil, err
	}
	s.mu.Lock()
	ok := s.fstype == "btrfs" && !s.closed && s.rootfd >= 0
	s.mu.Unlock()
	if !ok {
		return "", nil, ErrNoClone
	}
	src, err := unix.Openat(s.rootfd, id, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("scratch: clone %s: %w", id, err)
	}
	defer unix.Close(src)
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := clonePrefix + id + "-" + hex.EncodeToString(rnd[:])
	if len(name) > 255 {
		return "", nil, ErrNoClone
	}
	v2 := btrfsVolArgsV2{fd: int64(src)}
	copy(v2.name[:], name)
	if err := btrfsIoctl(s.rootfd, btrfsIocSnapCreateV2, unsafe.Pointer(&v2)); err != nil {
		if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
			return "", nil, ErrNoClone
		}
		return "", nil, fmt.Errorf("scratch: clone %s: BTRFS_IOC_SNAP_CREATE_V2: %w", id, err)
	}
	release := func() error {
		var v btrfsVolArgs
		copy(v.name[:], name)
		if err := btrfsIoctl(s.rootfd, btrfsIocSnapDestroy, unsafe.Pointer(&v)); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("scratch: remove clone %s: BTRFS_IOC_SNAP_DESTROY: %w", name, err)
		}
		return nil
	}
	return filepath.Join(s.dir, name), release, nil
}

// sweepClones removes clones left by a process that died before removing
// them.
func (s *Scratch) sweepClones() int {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), clonePrefix) {
			continue
		}
		var v btrfsVolArgs
		copy(v.name[:], e.Name())
		if btrfsIoctl(s.rootfd, btrfsIocSnapDestroy, unsafe.Pointer(&v)) == nil {
			n++
		}
	}
	return n
}

// Flush writes sandbox directory id's pending data out (syncfs), so that a
// Clone right after has little left to flush while the sandbox is frozen.
func (s *Scratch) Flush(id string) error {
	if err := validID(id); err != nil {
		return err
	}
	fd, err := unix.Open(filepath.Join(s.dir, id), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("scratch: flush %s: %w", id, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("scratch: flush %s: %w", id, err)
	}
	return nil
}
