package confine

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
)

// detachedBind is a read-only copy of a layer directory, taken while the
// host root is still visible and attached after the pivot.
type detachedBind struct {
	fd        int
	target    string
	protected bool
}

// cloneBinds takes detached, read-only, nosuid, nodev copies of the bind
// sources (open_tree(OPEN_TREE_CLONE) + mount_setattr), before the pivot.
func cloneBinds(binds []agentproto.Bind) ([]detachedBind, error) {
	var out []detachedBind
	for _, b := range binds {
		if !filepath.IsAbs(b.Target) || filepath.Clean(b.Target) != b.Target || b.Target == "/" {
			closeBinds(out)
			return nil, fmt.Errorf("confine: bind target %q must be a clean absolute path", b.Target)
		}
		if b.FD > 0 { // the edge's copy (user namespaces), read-only already
			out = append(out, detachedBind{fd: b.FD, target: b.Target, protected: b.Protected})
			continue
		}
		fd, err := unix.OpenTree(unix.AT_FDCWD, b.Source, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
		if err != nil {
			closeBinds(out)
			return nil, fmt.Errorf("confine: clone %s: %w", b.Source, err)
		}
		attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
		if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, attr); err != nil {
			unix.Close(fd)
			closeBinds(out)
			return nil, fmt.Errorf("confine: make %s read-only: %w", b.Source, err)
		}
		out = append(out, detachedBind{fd: fd, target: b.Target, protected: b.Protected})
	}
	return out, nil
}

func closeBinds(bs []detachedBind) {
	for _, b := range bs {
		unix.Close(b.fd)
	}
}

// attachBinds attaches the detached copies inside the new root. Paths
// resolve in the sandbox's own root now (its symlinks cannot lead to the
// host). For a protected bind, every ancestor directory below / first
// becomes a mount point of its own (a bind of itself), so the sandbox can
// neither rename nor remove any of them: rename(2) and rmdir(2) of a mount
// point fail with EBUSY, and without CAP_SYS_ADMIN it cannot unmount,
// remount or mount over anything.
func attachBinds(bs []detachedBind) error {
	for _, b := range bs {
		if err := os.MkdirAll(b.target, 0o755); err != nil {
			return fmt.Errorf("confine: mkdir %s: %w", b.target, err)
		}
		real, err := filepath.EvalSymlinks(b.target)
		if err != nil {
			return fmt.Errorf("confine: resolve %s: %w", b.target, err)
		}
		if b.protected {
			parts := strings.Split(strings.TrimPrefix(real, "/"), "/")
			for i := 1; i < len(parts); i++ {
				anc := "/" + strings.Join(parts[:i], "/")
				if err := unix.Mount(anc, anc, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
					return fmt.Errorf("confine: pin %s: %w", anc, err)
				}
			}
		}
		if err := unix.MoveMount(b.fd, "", unix.AT_FDCWD, real, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("confine: attach layer at %s: %w", real, err)
		}
	}
	return nil
}
