package confine

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// RerootConfig is the new root of a reused sandbox.
type RerootConfig struct {
	Lowers      []string // read-only layer directories, top-most first
	Upper, Work string   // the new, empty writable layer
	ShmMB       int64    // sizes the new /dev/shm; 0: DefaultShmMB
	// UsernsFD, when > 0, is a user namespace with the sandbox's id map:
	// the layers are idmapped through it (see MountRoot), and IDBase is
	// the host id of the sandbox's root, which gets its /dev.
	UsernsFD int
	IDBase   uint32
}

// RootID identifies a root directory (its device and inode), so that the
// agent can check that its root is the one the edge mounted.
type RootID struct {
	Dev, Ino uint64
}

// Reroot gives the running sandbox whose init (the agent) pidfd refers to
// a fresh root file system: it is how the container of a deleted sandbox is
// reused for a new one. It runs in the edge, as host root, never in the
// agent, which keeps no privilege to mount anything. Every process of the
// sandbox but the agent must be gone (the agent's wipe).
//
// In order it:
//
//  1. mounts the new overlay (nodev, volatile), detached, in the edge's
//     own mount namespace, where the layer directories are;
//  2. takes the read-only copies of the host's device nodes, as Enter does;
//  3. on a namespace thread (nsthread.go) in the sandbox's mount
//     namespace: stacks the new root on the old one, moves /proc and /sys
//     (the sandbox's own, bound to its pid and net namespaces, with their
//     masks and read-only parts) onto it, pivots into it (which also moves
//     the agent's root and working directory, the only process left),
//     detaches the old root with everything still on it (the old /dev,
//     /dev/shm, devpts) and mounts a fresh /dev.
//
// It returns the identity of the new root. A failure leaves the sandbox
// unusable: destroy it.
func Reroot(pidfd int, cfg *RerootConfig) (RootID, error) {
	var id RootID
	if len(cfg.Lowers) == 0 || cfg.Upper == "" || cfg.Work == "" {
		return id, errors.New("confine: reroot: lowers, upper and work are required")
	}
	mfd, err := MountRoot(&RootConfig{Lowers: cfg.Lowers, Upper: cfg.Upper, Work: cfg.Work, UsernsFD: cfg.UsernsFD})
	if err != nil {
		return id, err
	}
	defer unix.Close(mfd)
	var st unix.Stat_t
	if err := unix.Fstat(mfd, &st); err != nil {
		return id, fmt.Errorf("confine: reroot: stat new root: %w", err)
	}
	id = RootID{Dev: st.Dev, Ino: st.Ino}
	nodes, err := cloneDevNodes()
	if err != nil {
		return id, err
	}
	defer closeDevNodes(nodes)
	shm := cfg.ShmMB
	if shm <= 0 {
		shm = DefaultShmMB
	}
	base := uint32(0)
	if cfg.UsernsFD > 0 {
		base = cfg.IDBase
	}
	return id, inNamespaces(pidfd, unix.CLONE_NEWNS, func() error { return rerootThread(mfd, nodes, shm, base) })
}

// checkOverlayPaths refuses the characters that separate overlay options
// and lower directories.
func checkOverlayPaths(paths []string) error {
	for _, p := range paths {
		if strings.ContainsAny(p, ",:") {
			return fmt.Errorf("confine: overlay path %q contains ',' or ':'", p)
		}
	}
	return nil
}

// fsmountOverlay mounts the overlay of cfg, detached (no mount point), and
// returns the mount's descriptor.
func fsmountOverlay(cfg *RerootConfig) (int, error) {
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("confine: fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	// The layers by descriptor: see fdPaths. No upper and work directories:
	// a read-only overlay (stateless sandboxes).
	dirs := cfg.Lowers
	if cfg.Upper != "" {
		dirs = append([]string{cfg.Upper, cfg.Work}, cfg.Lowers...)
	}
	paths, err := fdPaths(dirs)
	if err != nil {
		return -1, err
	}
	defer closeFDPaths(paths)
	opts := [][2]string{{"lowerdir", strings.Join(paths[len(paths)-len(cfg.Lowers):], ":")}}
	if cfg.Upper != "" {
		opts = append(opts, [2]string{"upperdir", paths[0]}, [2]string{"workdir", paths[1]})
	}
	for _, kv := range opts {
		if err := unix.FsconfigSetString(fsfd, kv[0], kv[1]); err != nil {
			return -1, fmt.Errorf("confine: overlay %s=%s: %w", kv[0], kv[1], err)
		}
	}
	// volatile: no sync of the upper layer's filesystem, which on btrfs
	// is a transaction commit, when the overlay goes (or a process calls
	// sync or fsync): a sandbox's files do not outlive the host anyway,
	// and its writable layer is deleted right after. The same upper and
	// work directories are never mounted again.
	if cfg.Upper != "" {
		if err := unix.FsconfigSetFlag(fsfd, "volatile"); err != nil {
			return -1, fmt.Errorf("confine: overlay volatile: %w", err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("confine: create overlay: %w", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("confine: fsmount overlay: %w", err)
	}
	return mfd, nil
}

// rerootThread is step 3 of Reroot, on a thread in the sandbox's mount
// namespace.
func rerootThread(mfd int, nodes map[string]int, shmMB int64, base uint32) error {
	// The sandbox's /proc and /sys, opened before the new root covers them.
	var moved []int
	defer func() {
		for _, fd := range moved {
			unix.Close(fd)
		}
	}()
	for _, m := range []struct {
		path  string
		magic int64
	}{{"/proc", unix.PROC_SUPER_MAGIC}, {"/sys", unix.SYSFS_MAGIC}} {
		fd, err := unix.Open(m.path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("confine: reroot: open %s: %w", m.path, err)
		}
		moved = append(moved, fd)
		var sfs unix.Statfs_t
		if err := unix.Fstatfs(fd, &sfs); err != nil || sfs.Type != m.magic {
			return fmt.Errorf("confine: reroot: %s is not the sandbox's (type %#x, %v)", m.path, sfs.Type, err)
		}
	}
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, "/", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("confine: reroot: attach the new root: %w", err)
	}
	for i, name := range []string{"proc", "sys"} {
		dfd, err := mountPointIn(mfd, name)
		if err != nil {
			return err
		}
		err = unix.MoveMount(moved[i], "", dfd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
		unix.Close(dfd)
		if err != nil {
			return fmt.Errorf("confine: reroot: move /%s: %w", name, err)
		}
	}
	if err := unix.Fchdir(mfd); err != nil {
		return fmt.Errorf("confine: reroot: chdir new root: %w", err)
	}
	if err := pivotHere(); err != nil {
		return err
	}
	return mountDev(nodes, shmMB, base)
}

// mountPointIn opens directory name of the root behind rootfd as a mount
// point, making it when the image lacks it. A symlink or a file there (an
// image may hold anything) is refused rather than followed.
func mountPointIn(rootfd int, name string) (int, error) {
	const flags = unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(rootfd, name, flags, 0)
	if errors.Is(err, unix.ENOENT) {
		if err := unix.Mkdirat(rootfd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("confine: reroot: mkdir /%s: %w", name, err)
		}
		fd, err = unix.Openat(rootfd, name, flags, 0)
	}
	if err != nil {
		return -1, fmt.Errorf("confine: reroot: /%s of the new root: %w", name, err)
	}
	return fd, nil
}

// OpenMessageQueues returns a detached mount of the POSIX message queue
// filesystem of the IPC namespace of the process behind pidfd: queues
// outlive their processes, and a sandbox's own file system does not show
// them. EmptyMessageQueues removes them through it, from any thread.
func OpenMessageQueues(pidfd int) (int, error) {
	mfd := -1
	err := inNamespaces(pidfd, unix.CLONE_NEWIPC, func() error {
		fsfd, err := unix.Fsopen("mqueue", unix.FSOPEN_CLOEXEC)
		if err != nil {
			return fmt.Errorf("confine: fsopen mqueue: %w", err)
		}
		defer unix.Close(fsfd)
		if err := unix.FsconfigCreate(fsfd); err != nil {
			return fmt.Errorf("confine: create mqueue: %w", err)
		}
		mfd, err = unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOEXEC|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
		if err != nil {
			return fmt.Errorf("confine: fsmount mqueue: %w", err)
		}
		return nil
	})
	return mfd, err
}

// EmptyMessageQueues unlinks every message queue of the mqueue mount mfd
// (from OpenMessageQueues).
func EmptyMessageQueues(mfd int) error {
	dfd, err := unix.Openat(mfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("confine: open mqueue: %w", err)
	}
	d := os.NewFile(uintptr(dfd), "mqueue")
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("confine: list message queues: %w", err)
	}
	for _, n := range names {
		if err := unix.Unlinkat(mfd, n, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("confine: remove message queue %s: %w", n, err)
		}
	}
	return nil
}
