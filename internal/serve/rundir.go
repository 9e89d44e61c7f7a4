package serve

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// runDirSize bounds the node's run directory: agents' sockets and logs and
// the (empty) mount points of sandbox roots.
const runDirSize = "256m"

// openRunDir puts the edge's run directory (<data-dir>/edge/run, one
// directory per sandbox: the agent's socket and log, the mount point of its
// root) on a tmpfs of its own. Every sandbox creates and removes four inodes
// there; on a disk filesystem that churn is costly (ext4 without a journal
// scans past recently deleted inodes on every allocation: a fifth of
// warren serve's CPU in create→exec→stop here), and the contents mean
// nothing after a reboot anyway, when every sandbox is gone too. The mount
// outlives a crash of warren (a restart adopts the sandboxes through their
// sockets in it) and is removed at shutdown unless sandboxes are kept.
//
// A directory that already is on a tmpfs is used as it is; one that holds
// state on disk (live sandboxes of an earlier warren) is left on disk.
func openRunDir(dataDir string, keep bool, log *slog.Logger) (func(), error) {
	dir := filepath.Join(dataDir, "edge", "run")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("run dir: %w", err)
	}
	ours, err := isTmpfsMountPoint(dir)
	if err != nil {
		return nil, fmt.Errorf("run dir: %w", err)
	}
	if !ours {
		var st unix.Statfs_t
		if err := unix.Statfs(dir, &st); err != nil {
			return nil, fmt.Errorf("run dir: %w", err)
		}
		if st.Type == unix.TMPFS_MAGIC {
			return func() {}, nil
		}
		if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
			log.Info("run directory holds state: left on disk", "dir", dir, "err", err)
			return func() {}, nil
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC,
			"mode=0700,size="+runDirSize); err != nil {
			log.Warn("run directory stays on disk: cannot mount a tmpfs", "dir", dir, "err", err)
			return func() {}, nil
		}
	}
	return func() {
		if keep {
			return
		}
		if err := unix.Unmount(dir, 0); err != nil {
			if errors.Is(err, unix.EBUSY) {
				err = unix.Unmount(dir, unix.MNT_DETACH)
			}
			if err != nil {
				log.Warn("unmount run directory", "dir", dir, "err", err)
			}
		}
	}, nil
}

// isTmpfsMountPoint reports whether dir is the root of a tmpfs mount.
func isTmpfsMountPoint(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return false, err
	}
	if err := unix.Stat(filepath.Dir(dir), &parent); err != nil {
		return false, err
	}
	if st.Dev == parent.Dev {
		return false, nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return false, err
	}
	return fs.Type == unix.TMPFS_MAGIC, nil
}
