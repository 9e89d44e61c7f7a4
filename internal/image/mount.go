package image

import (
	"bufio"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Mounter mounts layer blobs on this node: each layer once, read-only and
// file-backed (the kernel reads the EROFS image straight from the store
// file, no loop device), at <dir>/<hex>, shared by every sandbox that uses
// it. Holders (sandbox ids) take references; a layer is unmounted when its
// last holder releases it. Reconcile, at start, rebuilds the references of
// surviving sandboxes and unmounts everything else under dir, so no mount
// outlives a crash.
type Mounter struct {
	dir   string
	store *LocalStore

	mu      sync.Mutex
	refs    map[string]int      // hex -> holders
	holders map[string][]string // holder -> hexes (with repeats)
	mounts  int64               // mount(2) calls made (for tests and benchmarks)
}

// NewMounter keeps mount points under dir (node-local) for the layers of
// store. It tells store which layers are in use, so garbage collection
// leaves them alone.
func NewMounter(dir string, store *LocalStore) (*Mounter, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image: mount dir: %w", err)
	}
	m := &Mounter{dir: dir, store: store, refs: map[string]int{}, holders: map[string][]string{}}
	store.SetInUse(m.InUse)
	return m, nil
}

// Dir is where layers are mounted.
func (m *Mounter) Dir() string { return m.dir }

func (m *Mounter) point(h string) string { return filepath.Join(m.dir, h) }

// Acquire mounts the layers (diff ids) that are not mounted yet and takes a
// reference on each for holder. It returns their mount points in the same
// order. On error nothing is held.
func (m *Mounter) Acquire(holder string, diffIDs []string) ([]string, error) {
	hexes := make([]string, len(diffIDs))
	for i, d := range diffIDs {
		h := strings.TrimPrefix(d, "sha256:")
		if !validHex(h) {
			return nil, fmt.Errorf("image: bad layer digest %q", d)
		}
		hexes[i] = h
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var taken []string
	for _, h := range hexes {
		if m.refs[h] == 0 {
			if err := m.mountLocked(h); err != nil {
				for _, t := range taken {
					m.dropLocked(t)
				}
				return nil, err
			}
		}
		m.refs[h]++
		taken = append(taken, h)
	}
	m.holders[holder] = append(m.holders[holder], hexes...)
	dirs := make([]string, len(hexes))
	for i, h := range hexes {
		dirs[i] = m.point(h)
	}
	return dirs, nil
}

// Release drops every reference of holder; layers nobody holds any more are
// unmounted, and collected when nothing names them. Releasing an unknown
// holder does nothing.
func (m *Mounter) Release(holder string) {
	m.mu.Lock()
	hexes := m.holders[holder]
	delete(m.holders, holder)
	var unused []string
	for _, h := range hexes {
		if m.dropLocked(h) {
			unused = append(unused, h)
		}
	}
	m.mu.Unlock()
	if len(unused) > 0 && m.store != nil {
		m.store.collect(unused)
	}
}

// dropLocked releases one reference and unmounts at zero; it reports
// whether the layer was unmounted.
func (m *Mounter) dropLocked(h string) bool {
	m.refs[h]--
	if m.refs[h] > 0 {
		return false
	}
	delete(m.refs, h)
	if err := unmountAll(m.point(h)); err != nil {
		slog.Warn("unmount layer", "layer", h, "err", err)
	}
	return true
}

func (m *Mounter) mountLocked(h string) error {
	p := m.point(h)
	if err := os.Mkdir(p, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("image: mount layer: %w", err)
	}
	// A regular file as the source: erofs mounts it file-backed. With
	// directio its reads bypass the store file's page cache: a block is
	// cached once (in the layer's own page cache), and the store file's
	// readahead does not pull in neighbouring files no sandbox asked for.
	// The source is given as /proc/self/fd/N: the mount table shows it as
	// given, and a sandbox sees the mount of a layer attached at a path
	// (a bind), which must not name the node's store.
	fd, err := unix.Open(m.store.BlobPath(h), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == nil {
		src := "/proc/self/fd/" + strconv.Itoa(fd)
		err = unix.Mount(src, p, "erofs", unix.MS_RDONLY|unix.MS_NODEV, "directio")
		if errors.Is(err, unix.EINVAL) {
			err = unix.Mount(src, p, "erofs", unix.MS_RDONLY|unix.MS_NODEV, "")
		}
		unix.Close(fd)
	}
	if err != nil {
		_ = os.Remove(p)
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("image: layer sha256:%s is not in the store: %w", h, ErrNotFound)
		}
		return fmt.Errorf("image: mount layer sha256:%s: %w", h, err)
	}
	m.mounts++
	return nil
}

// InUse reports whether a sandbox of this node holds the layer.
func (m *Mounter) InUse(h string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refs[h] > 0
}

// Stats returns how many layers are mounted and how many mounts were made.
func (m *Mounter) Stats() (mounted int, mounts int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.refs), m.mounts
}

// Reconcile makes the mounts under the directory match holders exactly
// (holder -> diff ids, the sandboxes that survived a restart): missing
// layers are mounted, everything else is unmounted.
func (m *Mounter) Reconcile(holders map[string][]string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refs = map[string]int{}
	m.holders = map[string][]string{}
	need := map[string]bool{}
	for holder, ids := range holders {
		for _, d := range ids {
			h := strings.TrimPrefix(d, "sha256:")
			if validHex(h) {
				need[h] = true
				m.refs[h]++
				m.holders[holder] = append(m.holders[holder], h)
			}
		}
	}
	points, err := mountsUnder(m.dir)
	if err != nil {
		return err
	}
	mounted := map[string]bool{}
	for _, p := range points {
		h := filepath.Base(p)
		if filepath.Dir(p) == m.dir && need[h] && !mounted[h] {
			mounted[h] = true
			continue
		}
		if err := unmountAll(p); err != nil {
			return err
		}
	}
	var firstErr error
	for h := range need {
		if mounted[h] {
			continue
		}
		if err := m.mountLocked(h); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	// Stale mount points.
	ents, _ := os.ReadDir(m.dir)
	for _, e := range ents {
		if !need[e.Name()] {
			_ = os.Remove(filepath.Join(m.dir, e.Name()))
		}
	}
	return firstErr
}

// Close unmounts every layer (at shutdown, when no sandbox is kept).
func (m *Mounter) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.refs = map[string]int{}
	m.holders = map[string][]string{}
	points, err := mountsUnder(m.dir)
	if err != nil {
		return err
	}
	var firstErr error
	for _, p := range points {
		if err := unmountAll(p); err != nil && firstErr == nil {
			firstErr = err
		}
	}
	ents, _ := os.ReadDir(m.dir)
	for _, e := range ents {
		_ = os.Remove(filepath.Join(m.dir, e.Name()))
	}
	return firstErr
}

// unmountAll unmounts p until nothing is mounted there, then removes the
// directory. A layer held by a sandbox's overlay stays readable there: the
// overlay keeps its own private clone of the mount.
func unmountAll(p string) error {
	for i := 0; i < 8; i++ {
		err := unix.Unmount(p, 0)
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(p, unix.MNT_DETACH)
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break // not a mount point (any more)
		}
		if err != nil {
			return fmt.Errorf("image: unmount %s: %w", p, err)
		}
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("image: remove mount point: %w", err)
	}
	return nil
}

// mountsUnder lists the mount points strictly below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		p := unescapeMountinfo(fields[4])
		if strings.HasPrefix(p, dir+"/") {
			out = append(out, p)
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out, sc.Err()
}

// unescapeMountinfo decodes the \ooo escapes of /proc/self/mountinfo.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
