package confine

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// MqueueDir is where a stateless sandbox's POSIX message queues are
// visible (and so can be emptied between tasks).
const MqueueDir = "/dev/mqueue"

// FIFODir is where the agent makes the per-command FIFOs and scripts of
// its long-lived shells: in the sandbox's /dev tmpfs, or in a stateless
// sandbox (whose /dev is read-only) on a small tmpfs of its own.
const FIFODir = "/dev/.warren"

// setupStateless turns the freshly pivoted root into a reusable one: each
// of dirs becomes an empty tmpfs, then the root and /dev are remounted
// read-only, so that those tmpfs mounts, /dev/shm, the message queues and
// FIFODir are the only places a task can leave anything.
func setupStateless(dirs []string) error {
	for _, d := range dirs {
		if !filepath.IsAbs(d) || filepath.Clean(d) != d || d == "/" {
			return fmt.Errorf("confine: stateless dir %q must be a clean absolute path", d)
		}
		mode := "0755"
		switch d {
		case "/tmp", "/var/tmp":
			mode = "1777"
		case "/root":
			mode = "0700"
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("confine: stateless dir %s: %w", d, err)
		}
		if err := mountAt("tmpfs", d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode="+mode); err != nil {
			return err
		}
	}
	if err := os.Mkdir(MqueueDir, 0o755); err != nil && !os.IsExist(err) {
		return fmt.Errorf("confine: %s: %w", MqueueDir, err)
	}
	if err := mountAt("mqueue", MqueueDir, "mqueue", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if err := os.Mkdir(FIFODir, 0o711); err != nil {
		return fmt.Errorf("confine: %s: %w", FIFODir, err)
	}
	if err := mountAt("tmpfs", FIFODir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=711,size=1m,nr_inodes=256"); err != nil {
		return err
	}
	if err := unix.Mount("", "/dev", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("confine: remount /dev read-only: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("confine: remount / read-only: %w", err)
	}
	return nil
}
