// Package image is the node's content-addressed image store. An image is a
// named, ordered list of layers; each layer is converted once into an EROFS
// image kept under the sha256 of its uncompressed tar (the OCI diff id), and
// shared by every image, named layer and sandbox that contains it. Layers
// are mounted read-only, file-backed (no loop device), once per node, by a
// Mounter; on a shared filesystem the kernel then reads only the blocks a
// sandbox touches.
//
// On disk, under the store directory:
//
//	blobs/sha256/<hex>.erofs     a layer as an EROFS image (overlayfs whiteout form)
//	blobs/sha256/<hex>.json      its size and entry count
//	images/<escaped name>.json   the image: name, digest, layers, config
//	named/<escaped name>/<v>.json a named, versioned layer: its digest
//	tmp/                         private work space; renamed into place
//
// Every visible file appears by an atomic rename after an fsync, so a crash
// never leaves a half layer or half manifest behind. Stores of the first
// format (unpacked layers/sha256/<hex>/ directories) are converted on Open.
package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/warrenhq/warren/api"
)

// ErrNotFound means no image has the name.
var ErrNotFound = errors.New("image: not found")

// Store is what the edge needs from the image store. The storage format
// (EROFS images) stays behind it.
type Store interface {
	// Resolve returns the image and the paths of its layer blobs (EROFS
	// images, mounted by a Mounter), top-most first (overlayfs lowerdir
	// order). Unknown names give ErrNotFound.
	Resolve(ctx context.Context, name string) (*Image, []string, error)
	List(ctx context.Context) ([]Image, error)
	// Remove deletes the image and every layer nothing else uses (no other
	// image, no named layer, no mount).
	Remove(ctx context.Context, name string) error
	// Import reads src (OCI layout directory or archive, docker-save
	// archive, root filesystem directory or tarball) and stores it as name.
	Import(ctx context.Context, src string, name string) (*Image, error)
}

// Config is the part of an OCI image config a sandbox uses.
type Config struct {
	Env        []string `json:"env,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	// Recorded by image build (Dockerfile LABEL and EXPOSE); not used.
	Labels       map[string]string `json:"labels,omitempty"`
	ExposedPorts []string          `json:"exposed_ports,omitempty"`
}

// Image is one stored image.
type Image struct {
	Name string `json:"name"`
	// Digest is "sha256:<hex>" of the canonical JSON of Config and Layers.
	Digest string `json:"digest"`
	// Layers are diff ids ("sha256:<hex>"), bottom first.
	Layers    []string  `json:"layers"`
	Size      int64     `json:"size"` // bytes of uncompressed layer tars
	CreatedAt time.Time `json:"created_at"`
	Config    Config    `json:"config"`
	// Disk, set on an image of the vm tier imported from a disk image
	// (disk.go), is that disk; such an image has no layers.
	Disk *Disk `json:"disk,omitempty"`
}

// API returns the wire form of the image.
func (i *Image) API() api.Image {
	a := api.Image{Name: i.Name, Digest: i.Digest, Layers: append([]string(nil), i.Layers...), Size: i.Size, CreatedAt: i.CreatedAt}
	c := i.Config
	if len(c.Env) > 0 || c.WorkingDir != "" || c.User != "" || len(c.Cmd) > 0 || len(c.Entrypoint) > 0 || len(c.Labels) > 0 || len(c.ExposedPorts) > 0 {
		a.Config = &api.ImageConfig{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Cmd: c.Cmd,
			Entrypoint: c.Entrypoint, Labels: c.Labels, ExposedPorts: c.ExposedPorts}
	}
	if d := i.Disk; d != nil {
		a.Disk = &api.ImageDisk{Format: d.Format, VirtualSize: d.VirtualSize, StoredSize: d.StoredSize}
	}
	return a
}

// digestOf is the image digest: sha256 over the canonical JSON of config
// and layers (encoding/json emits struct fields in order, so it is stable).
func digestOf(cfg Config, layers []string) string {
	b, _ := json.Marshal(struct {
		Config Config   `json:"config"`
		Layers []string `json:"layers"`
	}{cfg, layers})
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// LocalStore keeps images in a directory on this node (or on a shared
// filesystem mounted at the same path on every node).
type LocalStore struct {
	dir string
	mu  sync.Mutex // with the flock on dir/.lock: commit and garbage collection
	// BusyboxPath is the static busybox EnsureBusybox packs ("/bin/busybox").
	BusyboxPath string

	inUse  func(hex string) bool // set by a Mounter: layers mounted on this node
	flight flights               // conversions of one layer in progress in this process
}

var _ Store = (*LocalStore)(nil)

// Open opens (creating if needed) the store in dir and removes work files
// this host left behind in a crash.
func Open(dir string) (*LocalStore, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	for _, d := range []string{"blobs/sha256", "images", "named", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("image: open store: %w", err)
		}
	}
	// Only the host's root reads the store: it holds private images and
	// snapshots of sandboxes' writable layers (their users' files).
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image: open store: %w", err)
	}
	s := &LocalStore{dir: dir, BusyboxPath: "/bin/busybox"}
	s.cleanTmp()
	if err := s.migrate(context.Background()); err != nil {
		return nil, err
	}
	return s, nil
}

// Dir is the store's root directory.
func (s *LocalStore) Dir() string { return s.dir }

// tmpPrefix names work files host-pid- so a restarted process can tell its
// own dead predecessors' leftovers from another live process's work.
func tmpPrefix() string {
	h, _ := os.Hostname()
	return strings.ReplaceAll(h, "-", "_") + "-" + strconv.Itoa(os.Getpid()) + "-"
}

func (s *LocalStore) cleanTmp() {
	host, _ := os.Hostname()
	host = strings.ReplaceAll(host, "-", "_")
	ents, err := os.ReadDir(filepath.Join(s.dir, "tmp"))
	if err != nil {
		return
	}
	for _, e := range ents {
		parts := strings.SplitN(e.Name(), "-", 3)
		if len(parts) != 3 || parts[0] != host {
			continue
		}
		pid, err := strconv.Atoi(parts[1])
		if err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == nil {
			continue // alive (or reused): leave it
		}
		os.RemoveAll(filepath.Join(s.dir, "tmp", e.Name()))
	}
}

func (s *LocalStore) mkTemp(kind string) (string, error) {
	return os.MkdirTemp(filepath.Join(s.dir, "tmp"), tmpPrefix()+kind+"-")
}

// lock serialises commits and garbage collection in this process and,
// through flock, with other processes sharing the directory.
func (s *LocalStore) lock() (func(), error) {
	s.mu.Lock()
	f, err := os.OpenFile(filepath.Join(s.dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("image: lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		s.mu.Unlock()
		return nil, fmt.Errorf("image: lock: %w", err)
	}
	return func() { f.Close(); s.mu.Unlock() }, nil
}

// ValidName reports whether name can name an image (api.ValidImageName).
func ValidName(name string) error { return api.ValidImageName(name) }

// fileName maps a valid name to a single file name: "/" (the only
// character of a valid name a path cannot hold) becomes "%2F".
func fileName(name string) string {
	return strings.ReplaceAll(name, "/", "%2F") + ".json"
}

func (s *LocalStore) imagePath(name string) string {
	return filepath.Join(s.dir, "images", fileName(name))
}

// BlobPath is where the EROFS image of the layer with diff id
// "sha256:<hex>" (or bare <hex>) lives.
func (s *LocalStore) BlobPath(diffID string) string {
	return filepath.Join(s.dir, "blobs", "sha256", strings.TrimPrefix(diffID, "sha256:")+".erofs")
}

func (s *LocalStore) metaPath(hex string) string {
	return filepath.Join(s.dir, "blobs", "sha256", hex+".json")
}

func (s *LocalStore) readImage(name string) (*Image, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(s.imagePath(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	var img Image
	if err := json.Unmarshal(b, &img); err != nil {
		return nil, fmt.Errorf("image: %s: corrupt manifest: %w", name, err)
	}
	return &img, nil
}

// Resolve implements Store.
func (s *LocalStore) Resolve(ctx context.Context, name string) (*Image, []string, error) {
	img, err := s.readImage(name)
	if err != nil {
		return nil, nil, err
	}
	blobs := make([]string, 0, len(img.Layers))
	for i := len(img.Layers) - 1; i >= 0; i-- {
		b := s.BlobPath(img.Layers[i])
		if _, err := os.Lstat(b); err != nil {
			return nil, nil, fmt.Errorf("image: %s: layer %s missing: %w", name, img.Layers[i], err)
		}
		blobs = append(blobs, b)
	}
	return img, blobs, nil
}

// List implements Store. Images are sorted by name.
func (s *LocalStore) List(ctx context.Context) ([]Image, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "images"))
	if err != nil {
		return nil, fmt.Errorf("image: list: %w", err)
	}
	var out []Image
	for _, e := range ents {
		n, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok {
			continue
		}
		img, err := s.readImage(strings.ReplaceAll(n, "%2F", "/"))
		if err != nil {
			continue // removed meanwhile, or not ours
		}
		out = append(out, *img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Remove implements Store.
func (s *LocalStore) Remove(ctx context.Context, name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	unlock, err := s.lock()
	if err != nil {
		return err
	}
	defer unlock()
	old, _ := s.readImage(name)
	if err := os.Remove(s.imagePath(name)); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %s", ErrNotFound, name)
		}
		return fmt.Errorf("image: remove %s: %w", name, err)
	}
	if old != nil && old.Disk != nil {
		s.collectDiskLocked(old.Disk.Digest)
	}
	_, err = s.gcLocked(nil)
	return err
}

// writeFileAtomic writes b to path through a temporary file and rename.
func (s *LocalStore) writeFileAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Join(s.dir, "tmp"), tmpPrefix()+"file-")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// StageFile creates a private file in the store's work directory (on the
// layers' filesystem) for an upload; a crash leaves nothing that the next
// Open does not remove.
func (s *LocalStore) StageFile() (*os.File, error) {
	return os.CreateTemp(filepath.Join(s.dir, "tmp"), tmpPrefix()+"upload-")
}
