// Incremental snapshots. A sandbox's first snapshot packs its whole
// writable layer; each later one packs only what changed since the
// previous snapshot of the same sandbox, chained on that snapshot's layers
// (as DSec's pack_diff). What changed is found by comparing the copy of
// the writable layer with the manifest of the previous one (path → type,
// mode, owner, size, mtime, link target, device, opaque): an entry that is
// the same is left out (the chain below holds it), a path that is gone
// becomes a whiteout, a directory that became opaque since is packed
// whole. After MaxChainLinks incremental links the next snapshot is full
// again (compaction): chains stay short, and a restore mounts at most
// that many diffs of one sandbox. The manifest lives with the sandbox in
// memory (State): after an edge restart its next snapshot is full.

package snapshot

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// MaxChainLinks is how many incremental snapshots chain on one full one.
const MaxChainLinks = 8

// opaqueXattr marks an overlay directory that hides the layers below.
const opaqueXattr = "trusted.overlay.opaque"

// Meta is what a snapshot's manifest records of one path.
type Meta struct {
	Mode   uint32 // type and permission bits
	UID    uint32
	GID    uint32
	Size   int64
	Mtime  int64 // ns
	Rdev   uint64
	Link   string
	Opaque bool
}

// Manifest is a writable layer's entries by path relative to the layer.
type Manifest map[string]Meta

// Last is a sandbox's last snapshot, for the next one (in its State,
// under State.mu).
type Last struct {
	Snap     string   // the sandbox's last snapshot
	Links    int      // incremental links since the last full snapshot (1 = it is full)
	Manifest Manifest // its writable layer then
}

func metaOf(p string, st *unix.Stat_t) (Meta, error) {
	m := Meta{Mode: st.Mode, UID: st.Uid, GID: st.Gid, Size: st.Size, Mtime: st.Mtim.Nano(), Rdev: st.Rdev}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		l, err := os.Readlink(p)
		if err != nil {
			return m, err
		}
		m.Link = l
	case unix.S_IFDIR:
		m.Size, m.Mtime = 0, 0 // a directory's own change is its entries'
		var b [8]byte
		if n, err := unix.Lgetxattr(p, opaqueXattr, b[:]); err == nil && n > 0 && (b[0] == 'y' || b[0] == 'x') {
			m.Opaque = true
		}
	}
	return m, nil
}

func isDir(m Meta) bool { return m.Mode&unix.S_IFMT == unix.S_IFDIR }

// ScanManifest records every entry under dir.
func ScanManifest(dir string) (Manifest, error) {
	out := Manifest{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		m, err := metaOf(p, &st)
		if err != nil {
			return err
		}
		out[p[len(dir)+1:]] = m
		return nil
	})
	return out, err
}

// PruneUnchanged turns dir, a private copy of a writable layer, into the
// diff against the layer as prev recorded it: it removes what is the same
// there, adds whiteouts for what is gone and un-marks directories that
// were opaque already. It returns the manifest of dir as it was (for the
// next snapshot).
func PruneUnchanged(dir string, prev Manifest) (Manifest, error) {
	pl, err := planPrune(dir, prev)
	if err != nil {
		return nil, err
	}
	for _, rel := range pl.drop {
		if err := os.Remove(filepath.Join(dir, rel)); err != nil {
			return nil, err
		}
	}
	for _, rel := range pl.unOpaque {
		if err := unix.Lremovexattr(filepath.Join(dir, rel), opaqueXattr); err != nil && !errors.Is(err, unix.ENODATA) {
			return nil, err
		}
	}
	if err := pl.whiteouts(dir, prev); err != nil {
		return nil, err
	}
	// Removing and adding entries changed their directories' times: put
	// them back (the layer keeps them).
	for rel, st := range pl.times {
		ts := []unix.Timespec{st.Atim, st.Mtim}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(dir, rel), ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return nil, err
		}
	}
	return pl.cur, nil
}

// prunePlan is what PruneUnchanged does to a copy, read before it
// changes anything.
type prunePlan struct {
	cur      Manifest               // the copy as it is
	times    map[string]unix.Stat_t // directories whose entries change, as they were
	drop     []string               // unchanged since prev: removed
	unOpaque []string               // opaque in prev already: un-marked
	full     []string               // directories made opaque since prev: packed whole
}

// inFull reports whether rel is under a directory packed whole.
func (pl *prunePlan) inFull(rel string) bool {
	for _, f := range pl.full {
		if strings.HasPrefix(rel, f+"/") {
			return true
		}
	}
	return false
}

// planPrune reads dir against prev (see PruneUnchanged).
func planPrune(dir string, prev Manifest) (*prunePlan, error) {
	pl := &prunePlan{cur: Manifest{}, times: map[string]unix.Stat_t{}}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == dir {
			return nil
		}
		rel := p[len(dir)+1:]
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		m, err := metaOf(p, &st)
		if err != nil {
			return err
		}
		pl.cur[rel] = m
		if isDir(m) {
			pl.times[rel] = st
			if m.Opaque && !pl.inFull(rel) {
				if old, ok := prev[rel]; ok && isDir(old) && old.Opaque {
					pl.unOpaque = append(pl.unOpaque, rel) // the chain below hides the lower layers already
				} else {
					pl.full = append(pl.full, rel)
				}
			}
			return nil
		}
		if pl.inFull(rel) {
			return nil
		}
		if old, ok := prev[rel]; ok && old == m {
			pl.drop = append(pl.drop, rel)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if st, err := lstat(dir); err == nil {
		pl.times[""] = st
	}
	return pl, nil
}

// whiteouts marks in dir what prev had and is gone: a whiteout at the
// highest path that is gone.
func (pl *prunePlan) whiteouts(dir string, prev Manifest) error {
	for rel, old := range prev {
		if _, ok := pl.cur[rel]; ok || old.Mode&unix.S_IFMT == unix.S_IFCHR && old.Rdev == 0 {
			continue // still there, or a whiteout already
		}
		parent := filepath.Dir(rel)
		if parent == "." {
			parent = ""
		}
		if parent != "" {
			pm, ok := pl.cur[parent]
			if !ok || !isDir(pm) || pl.inFull(parent+"/x") {
				continue // the parent is gone (its whiteout covers it) or hides the chain below
			}
		}
		if err := unix.Mknod(filepath.Join(dir, rel), unix.S_IFCHR, 0); err != nil {
			return err
		}
	}
	return nil
}

func lstat(p string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Lstat(p, &st)
	return st, err
}
