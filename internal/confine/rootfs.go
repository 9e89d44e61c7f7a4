package confine

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
)

// devNodes are the only device nodes of a sandbox's /dev.
var devNodes = []string{"null", "zero", "full", "random", "urandom", "tty"}

// devLinks are the symlinks of a sandbox's /dev.
var devLinks = [][2]string{
	{"ptmx", "pts/ptmx"},
	{"fd", "/proc/self/fd"},
	{"stdin", "/proc/self/fd/0"},
	{"stdout", "/proc/self/fd/1"},
	{"stderr", "/proc/self/fd/2"},
}

// setupRoot mounts the overlay, pivots into it and builds /proc, /sys, /dev
// and the masks.
func setupRoot(cfg *agentproto.SetupConfig) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("confine: make mounts rprivate: %w", err)
	}
	if cfg.RootFD <= 0 {
		if err := mountOverlay(cfg); err != nil {
			return err
		}
	}
	// Detached copies of the host's device nodes, taken before the host
	// root goes away.
	nodes, err := cloneDevNodes()
	if err != nil {
		return err
	}
	defer closeDevNodes(nodes)
	binds, err := cloneBinds(cfg.Binds)
	if err != nil {
		return err
	}
	defer closeBinds(binds)
	if cfg.RootFD > 0 {
		if err := pivotMounted(cfg.RootFD); err != nil {
			return err
		}
	} else {
		if err := pivot(cfg.RootDir); err != nil {
			return err
		}
		if err := mountProcSys(""); err != nil {
			return err
		}
	}
	shm := cfg.ShmMB
	if shm <= 0 {
		shm = DefaultShmMB
	}
	if err := mountDev(nodes, shm, 0); err != nil {
		return err
	}
	if err := applyMasks(); err != nil {
		return err
	}
	if err := attachBinds(binds); err != nil {
		return err
	}
	if len(cfg.Stateless) > 0 {
		return setupStateless(cfg.Stateless)
	}
	return nil
}

func mountOverlay(cfg *agentproto.SetupConfig) error {
	if err := checkOverlayPaths(append([]string{cfg.RootDir, cfg.Upper, cfg.Work}, cfg.Lowers...)); err != nil {
		return err
	}
	lowers, err := fdPaths(cfg.Lowers)
	if err != nil {
		return err
	}
	defer closeFDPaths(lowers)
	opts := "lowerdir=" + strings.Join(lowers, ":")
	if cfg.Upper != "" {
		uw, err := fdPaths([]string{cfg.Upper, cfg.Work})
		if err != nil {
			return err
		}
		defer closeFDPaths(uw)
		// volatile: see fsmountOverlay.
		opts += ",upperdir=" + uw[0] + ",workdir=" + uw[1] + ",volatile"
	}
	if err := unix.Mount("overlay", cfg.RootDir, "overlay", unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("confine: mount overlay at %s: %w", cfg.RootDir, err)
	}
	return nil
}

// fdPaths opens each directory of dirs (O_PATH) and returns the
// /proc/self/fd/N paths that name them. Overlayfs shows its layers in the
// mount table as they were given, and the sandbox reads its mount table:
// given so, it names no host path. The caller closes them (closeFDPaths)
// once the overlay is mounted.
func fdPaths(dirs []string) ([]string, error) {
	out := make([]string, 0, len(dirs))
	for _, d := range dirs {
		fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			closeFDPaths(out)
			return nil, fmt.Errorf("confine: open layer %s: %w", d, err)
		}
		out = append(out, "/proc/self/fd/"+strconv.Itoa(fd))
	}
	return out, nil
}

func closeFDPaths(paths []string) {
	for _, p := range paths {
		if fd, err := strconv.Atoi(strings.TrimPrefix(p, "/proc/self/fd/")); err == nil {
			unix.Close(fd)
		}
	}
}

// cloneDevNodes takes detached, read-only copies of the host's device
// nodes (devNodes) for mountDev. Closing an unattached one unmounts it.
func cloneDevNodes() (map[string]int, error) {
	nodes := make(map[string]int, len(devNodes))
	for _, n := range devNodes {
		fd, err := unix.OpenTree(unix.AT_FDCWD, "/dev/"+n, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			if n == "tty" && err == unix.ENOENT {
				continue
			}
			closeDevNodes(nodes)
			return nil, fmt.Errorf("confine: clone /dev/%s: %w", n, err)
		}
		nodes[n] = fd
		// Read-only: the node is the host's inode, so a chmod, chown or
		// utimes through a writable bind would change the host's /dev/null.
		// (A device on a read-only mount can still be opened for writing.)
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NOEXEC}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
			closeDevNodes(nodes)
			return nil, fmt.Errorf("confine: make /dev/%s read-only: %w", n, err)
		}
	}
	return nodes, nil
}

func closeDevNodes(nodes map[string]int) {
	for _, fd := range nodes {
		unix.Close(fd)
	}
}

// pivot makes root the root of this mount namespace and detaches the old
// one.
func pivot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("confine: chdir %s: %w", root, err)
	}
	return pivotHere()
}

// pivotHere makes the working directory (a mount) the root of this mount
// namespace and detaches the old one. pivot_root(".", ".") stacks the old
// root on top of the new one, so no directory for it is needed inside the
// sandbox.
func pivotHere() error {
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("confine: pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("confine: detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("confine: chdir /: %w", err)
	}
	return nil
}

// pivotMounted pivots into the root the edge mounted (rootFD, a detached
// mount: user namespaces), which needs no host path: the mount is stacked
// on "/" and entered through its descriptor. /proc and /sys are mounted
// before the pivot: in a user namespace the kernel mounts a new proc or
// sysfs only while one is fully visible in the mount namespace (the
// host's, until the pivot detaches it).
func pivotMounted(rootFD int) error {
	defer unix.Close(rootFD)
	if err := unix.MoveMount(rootFD, "", unix.AT_FDCWD, "/", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("confine: attach the root: %w", err)
	}
	if err := unix.Fchdir(rootFD); err != nil {
		return fmt.Errorf("confine: chdir root: %w", err)
	}
	if err := mountProcSys("."); err != nil {
		return err
	}
	return pivotHere()
}

// mountProcSys mounts /proc and /sys of the root at dir ("" is "/").
func mountProcSys(dir string) error {
	const flags = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := mountAt("proc", dir+"/proc", "proc", flags, ""); err != nil {
		return err
	}
	return mountAt("sysfs", dir+"/sys", "sysfs", flags|unix.MS_RDONLY, "")
}

// mountDev builds /dev. base is the host id of the sandbox's root when the
// caller is outside the sandbox's user namespace (Reroot), else 0.
func mountDev(nodes map[string]int, shmMB int64, base uint32) error {
	if err := mountAt("tmpfs", "/dev", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC,
		"mode=755,size=64k,nr_inodes=64"+idOptions("tmpfs", base)); err != nil {
		return err
	}
	for _, n := range devNodes {
		fd, ok := nodes[n]
		if !ok {
			continue
		}
		p := "/dev/" + n
		if err := os.WriteFile(p, nil, 0o666); err != nil {
			return fmt.Errorf("confine: create %s: %w", p, err)
		}
		if err := unix.MoveMount(fd, "", unix.AT_FDCWD, p, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("confine: attach %s: %w", p, err)
		}
	}
	if err := mountAt("devpts", "/dev/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC,
		"newinstance,ptmxmode=0666,mode=0620"+devptsGID(base)); err != nil {
		return err
	}
	if err := mountAt("shm", "/dev/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV,
		"mode=1777,size="+strconv.FormatInt(shmMB, 10)+"m"+idOptions("tmpfs", base)); err != nil {
		return err
	}
	for _, l := range devLinks {
		if err := os.Symlink(l[1], "/dev/"+l[0]); err != nil {
			return fmt.Errorf("confine: symlink /dev/%s: %w", l[0], err)
		}
	}
	return nil
}

// maskedFiles are hidden behind /dev/null (they leak host memory, kernel
// pointers, or let root poke the kernel).
var maskedFiles = []string{
	"/proc/kcore", "/proc/kpagecount", "/proc/kpageflags", "/proc/kpagecgroup",
	"/proc/sysrq-trigger", "/proc/timer_list", "/proc/keys", "/proc/latency_stats",
	"/proc/sched_debug",
}

// maskedDirs are hidden behind an empty read-only tmpfs.
var maskedDirs = []string{
	"/proc/acpi", "/proc/scsi", "/proc/asound", "/sys/firmware", "/sys/devices/virtual/powercap",
}

// readonlyDirs are made read-only (sysctls, bus and fs tunables, irq affinity).
var readonlyDirs = []string{"/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq"}

func applyMasks() error {
	for _, p := range maskedFiles {
		if !exists(p) {
			continue
		}
		if err := unix.Mount("/dev/null", p, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("confine: mask %s: %w", p, err)
		}
	}
	for _, p := range maskedDirs {
		if !exists(p) {
			continue
		}
		if err := unix.Mount("tmpfs", p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k"); err != nil {
			return fmt.Errorf("confine: mask %s: %w", p, err)
		}
	}
	for _, p := range readonlyDirs {
		if !exists(p) {
			continue
		}
		if err := unix.Mount(p, p, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("confine: bind %s: %w", p, err)
		}
		const ro = unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
		if err := unix.Mount(p, p, "", ro, ""); err != nil {
			return fmt.Errorf("confine: make %s read-only: %w", p, err)
		}
	}
	return nil
}

// mountAt mounts at target (an absolute path in the new root), creating the
// directory in the upper layer when the image lacks it.
func mountAt(source, target, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("confine: mkdir %s: %w", target, err)
	}
	if err := unix.Mount(source, target, fstype, flags, data); err != nil {
		return fmt.Errorf("confine: mount %s on %s: %w", fstype, target, err)
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Lstat(filepath.Clean(p))
	return err == nil
}
