package confine

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// User namespaces (edge side). A sandbox of the container tier runs in a
// user namespace of its own whose ids 0..65535 are an unprivileged range of
// host ids. Its layers stay shared and unmodified: the edge takes an
// idmapped copy of each (open_tree(OPEN_TREE_CLONE) + mount_setattr
// MOUNT_ATTR_IDMAP with a user namespace of the sandbox's range), so that
// files the host sees as root's show as the range's first id, i.e. as root
// inside the sandbox; it mounts the overlay (in the host's user namespace,
// so overlayfs keeps its trusted.* xattrs and the mounter's credentials are
// the edge's) over those copies, detached, and gives the mount to the agent,
// which attaches it in its own mount namespace (Enter with RootFD). The
// overlay itself cannot be idmapped (EINVAL); the writable upper directory
// belongs to the range's root instead, so everything the sandbox writes is
// owned by host ids of its range. Linux 5.19 or later: overlayfs over
// idmapped layers; EROFS idmaps since 5.19 too.

// IDMapped returns a detached copy of the mount at path (a directory)
// whose ids are mapped through the user namespace usernsFD, with attr
// (MOUNT_ATTR_RDONLY, ...) set as well. usernsFD <= 0 only copies it.
func IDMapped(path string, usernsFD int, attr uint64) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, path, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("confine: clone %s: %w", path, err)
	}
	a := &unix.MountAttr{Attr_set: attr}
	if usernsFD > 0 {
		a.Attr_set |= unix.MOUNT_ATTR_IDMAP
		a.Userns_fd = uint64(usernsFD)
	}
	if a.Attr_set != 0 {
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, a); err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("confine: idmap %s: %w", path, err)
		}
	}
	return fd, nil
}

// RootConfig is a sandbox root the edge mounts (MountRoot).
type RootConfig struct {
	Lowers      []string // read-only layer directories, top-most first
	Upper, Work string   // the writable layer; both "" for a read-only root
	// UsernsFD, when > 0, is a user namespace whose id map the layers get.
	UsernsFD int
}

// MountRoot mounts the overlay of cfg, detached, nodev, over idmapped
// copies of its layers, and returns the mount's descriptor.
func MountRoot(cfg *RootConfig) (int, error) {
	if len(cfg.Lowers) == 0 || (cfg.Upper == "") != (cfg.Work == "") {
		return -1, errors.New("confine: root: lowers, and upper with work, are required")
	}
	if err := checkOverlayPaths(append([]string{cfg.Upper, cfg.Work}, cfg.Lowers...)); err != nil {
		return -1, err
	}
	var fds []int
	// Closing a detached mount unmounts it, which waits for an RCU grace
	// period (tens of ms on a busy host); the overlay holds copies of its
	// own, so nothing waits for these.
	defer func() { go closeAll(fds) }()
	lowers := cfg.Lowers
	if cfg.UsernsFD > 0 {
		lowers = make([]string, len(cfg.Lowers))
		for i, l := range cfg.Lowers {
			fd, err := IDMapped(l, cfg.UsernsFD, 0)
			if err != nil {
				return -1, err
			}
			fds = append(fds, fd)
			// The copy has no path; overlayfs resolves this magic link
			// to it while it parses the option.
			lowers[i] = "/proc/self/fd/" + strconv.Itoa(fd)
		}
	}
	return fsmountOverlay(&RerootConfig{Lowers: lowers, Upper: cfg.Upper, Work: cfg.Work})
}

// OwnRoot gives the writable layer's root directory to the range's root
// (host id base), so that the sandbox's root owns its "/".
func OwnRoot(upper string, base uint32) error {
	if err := os.Lchown(upper, int(base), int(base)); err != nil {
		return fmt.Errorf("confine: chown %s: %w", upper, err)
	}
	return nil
}

// idOptions are the mount options that give a tmpfs's root directory to
// the sandbox's root when the edge, outside the sandbox's user namespace,
// mounts it (Reroot); "" when the mounter is inside (base 0).
func idOptions(fstype string, base uint32) string {
	if base == 0 || fstype != "tmpfs" {
		return ""
	}
	b := strconv.FormatUint(uint64(base), 10)
	return ",uid=" + b + ",gid=" + b
}

// devptsGID is devpts's option for the group of new ptys: tty (5) as the
// sandbox sees it.
func devptsGID(base uint32) string {
	return ",gid=" + strconv.FormatUint(uint64(base)+5, 10)
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
