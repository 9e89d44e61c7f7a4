package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/warrenhq/warren/api"
)

// Named, versioned layers: a workspace ("ws/django-1234") or a toolkit
// ("toolkit/harness") is a name with versions 1, 2, ...; each version
// points at one content-addressed layer. Versions never change: creating
// an existing version again succeeds only with the same content.

// Errors a caller can act on (the API maps them to 4xx answers).
var (
	// ErrExists means a layer version already exists with other content.
	ErrExists = errors.New("layer version exists with other content")
	// ErrInvalid wraps malformed names, references and versions (the
	// grammars are api's, which both sides of the wire check).
	ErrInvalid = api.ErrInvalid
	// ErrBadContent wraps archives that cannot become a layer: corrupt or
	// truncated, a digest mismatch, unsafe entries, limits exceeded.
	ErrBadContent = errors.New("bad layer content")
	// ErrNoSpace means the store's filesystem filled up during an import.
	ErrNoSpace = errors.New("no space left in the layer store")
)

// MaxLayerVersion bounds version numbers.
const MaxLayerVersion = api.MaxLayerVersion

// Layer is one version of a named layer.
type Layer struct {
	Name      string    `json:"name"`
	Version   int       `json:"version"`
	Digest    string    `json:"digest"` // diff id of the layer, "sha256:<hex>"
	Size      int64     `json:"size"`   // bytes of the uncompressed tar
	Entries   int       `json:"entries"`
	ErofsSize int64     `json:"erofs_size"`
	Source    string    `json:"source,omitempty"` // tar, dir, sandbox <id>
	CreatedAt time.Time `json:"created_at"`
}

// API returns the wire form.
func (l *Layer) API() api.Layer {
	return api.Layer{Name: l.Name, Version: l.Version, Digest: l.Digest, Size: l.Size, Entries: l.Entries,
		StoredSize: l.ErofsSize, Source: l.Source, CreatedAt: l.CreatedAt}
}

// ValidLayerName checks a layer name (api.ValidLayerName).
func ValidLayerName(name string) error { return api.ValidLayerName(name) }

// QualifiedLayerName is the store's name for layer name of project
// (api.QualifiedLayerName).
func QualifiedLayerName(project, name string) string { return api.QualifiedLayerName(project, name) }

// SplitLayerName splits a store name into its project and name
// (api.SplitLayerName).
func SplitLayerName(stored string) (project, name string) { return api.SplitLayerName(stored) }

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// ParseLayerRef splits "name" or "name@version" (api.ParseLayerRef).
func ParseLayerRef(ref string) (string, int, error) { return api.ParseLayerRef(ref) }

func (s *LocalStore) namedDir(name string) string {
	return filepath.Join(s.dir, "named", strings.ReplaceAll(name, "/", "%2F"))
}

func (s *LocalStore) readNamed(p string) (*Layer, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	var l Layer
	if err := json.Unmarshal(b, &l); err != nil {
		return nil, fmt.Errorf("image: %s: corrupt layer record: %w", p, err)
	}
	return &l, nil
}

// versions lists the versions of name, ascending.
func (s *LocalStore) versions(name string) ([]int, error) {
	ents, err := os.ReadDir(s.namedDir(name))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []int
	for _, e := range ents {
		v, ok := strings.CutSuffix(e.Name(), ".json")
		if n, err := strconv.Atoi(v); ok && err == nil && n > 0 {
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out, nil
}

// ResolveLayer finds a named layer by reference ("name" is the latest
// version, "name@3" version 3). Unknown layers give ErrNotFound.
func (s *LocalStore) ResolveLayer(ctx context.Context, ref string) (*Layer, error) {
	name, v, err := ParseLayerRef(ref)
	if err != nil {
		return nil, err
	}
	if v == 0 {
		vs, err := s.versions(name)
		if err != nil {
			return nil, fmt.Errorf("image: layer %s: %w", name, err)
		}
		if len(vs) == 0 {
			return nil, fmt.Errorf("%w: layer %s", ErrNotFound, name)
		}
		v = vs[len(vs)-1]
	}
	l, err := s.readNamed(filepath.Join(s.namedDir(name), strconv.Itoa(v)+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: layer %s@%d", ErrNotFound, name, v)
	}
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(s.BlobPath(l.Digest)); err != nil {
		return nil, fmt.Errorf("image: layer %s@%d: its blob %s is missing: %w", name, v, l.Digest, err)
	}
	return l, nil
}

// ListLayers lists every version of every named layer (or of name only),
// sorted by name and version.
func (s *LocalStore) ListLayers(ctx context.Context, name string) ([]Layer, error) {
	if name != "" {
		if err := ValidLayerName(name); err != nil {
			return nil, err
		}
	}
	all, err := s.allNamed()
	if err != nil {
		return nil, err
	}
	out := all[:0]
	for _, l := range all {
		if name == "" || l.Name == name {
			out = append(out, l)
		}
	}
	return out, nil
}

func (s *LocalStore) allNamed() ([]Layer, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "named"))
	if err != nil {
		return nil, fmt.Errorf("image: list layers: %w", err)
	}
	var out []Layer
	for _, e := range ents {
		name := strings.ReplaceAll(e.Name(), "%2F", "/")
		if ValidLayerName(name) != nil {
			continue
		}
		vs, err := s.versions(name)
		if err != nil {
			return nil, err
		}
		for _, v := range vs {
			l, err := s.readNamed(filepath.Join(s.namedDir(name), strconv.Itoa(v)+".json"))
			if err != nil {
				continue // removed meanwhile
			}
			out = append(out, *l)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Version < out[j].Version
	})
	return out, nil
}

// DeleteLayer removes one version of a named layer (or every version when
// version is 0), then collects the blobs nothing uses any more. A blob a
// sandbox has mounted stays until that sandbox is gone.
func (s *LocalStore) DeleteLayer(ctx context.Context, name string, version int) ([]Layer, error) {
	if err := ValidLayerName(name); err != nil {
		return nil, err
	}
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	vs, err := s.versions(name)
	if err != nil {
		return nil, err
	}
	var gone []Layer
	for _, v := range vs {
		if version != 0 && v != version {
			continue
		}
		p := filepath.Join(s.namedDir(name), strconv.Itoa(v)+".json")
		if l, err := s.readNamed(p); err == nil {
			gone = append(gone, *l)
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return gone, fmt.Errorf("image: delete layer: %w", err)
		}
	}
	if len(gone) == 0 {
		if version != 0 {
			return nil, fmt.Errorf("%w: layer %s@%d", ErrNotFound, name, version)
		}
		return nil, fmt.Errorf("%w: layer %s", ErrNotFound, name)
	}
	_ = os.Remove(s.namedDir(name)) // only when empty
	_, err = s.gcLocked(nil)
	return gone, err
}

// CreateLayerFromTar stores the layer tar (optionally gzip-compressed) at
// path as name@version (version 0: the next one).
func (s *LocalStore) CreateLayerFromTar(ctx context.Context, name string, version int, path string) (*Layer, error) {
	src := layerSource{open: func() (io.ReadCloser, error) { return openMaybeGzip(path) }, canonical: true}
	return s.createNamed(ctx, name, version, src, "tar")
}

// CreateLayerFromDir stores the directory tree dir as name@version.
func (s *LocalStore) CreateLayerFromDir(ctx context.Context, name string, version int, dir string) (*Layer, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return nil, fmt.Errorf("image: layer from %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%w: layer from %s: not a directory", ErrInvalid, dir)
	}
	src := layerSource{open: func() (io.ReadCloser, error) { return tarDir(dir), nil }, canonical: true}
	return s.createNamed(ctx, name, version, src, "dir")
}

// CreateLayerFromChanges packs the writable (upper) directory of a sandbox:
// overlay whiteouts become OCI whiteouts, setuid/setgid bits and file
// capabilities are kept only where the layers below had them (lowers, top
// most first, are the sandbox's mounted layers). idBase, when not 0, is the
// host id of the sandbox's root (user namespaces): owners in its range are
// recorded as the sandbox saw them (host id - idBase).
func (s *LocalStore) CreateLayerFromChanges(ctx context.Context, name string, version int, upper string, lowers []string, idBase uint32, source string) (*Layer, error) {
	src := layerSource{open: func() (io.ReadCloser, error) { return tarChanges(upper, lowers, idBase), nil }}
	return s.createNamed(ctx, name, version, src, source)
}

func (s *LocalStore) createNamed(ctx context.Context, name string, version int, src layerSource, source string) (*Layer, error) {
	if err := ValidLayerName(name); err != nil {
		return nil, err
	}
	if version < 0 || version > MaxLayerVersion {
		return nil, fmt.Errorf("%w: layer version must be between 1 and %d", ErrInvalid, MaxLayerVersion)
	}
	for attempt := 0; ; attempt++ {
		l, err := s.createNamedOnce(ctx, name, version, src, source)
		if errors.Is(err, errLayerGone) && attempt < 2 {
			continue
		}
		return l, err
	}
}

func (s *LocalStore) createNamedOnce(ctx context.Context, name string, version int, src layerSource, source string) (*Layer, error) {
	h, size, mine, err := s.storeLayer(ctx, src)
	if err != nil {
		if mine {
			s.collect([]string{h})
		}
		return nil, fmt.Errorf("image: layer %s: %w", name, err)
	}
	meta, _ := s.layerMeta(h)
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	fail := func(err error) (*Layer, error) {
		if mine {
			_, _ = s.gcLocked(map[string]bool{h: true})
		}
		return nil, err
	}
	if _, err := os.Lstat(s.BlobPath(h)); err != nil {
		return nil, errLayerGone
	}
	vs, err := s.versions(name)
	if err != nil {
		return fail(err)
	}
	if version == 0 {
		version = 1
		if len(vs) > 0 {
			latest := vs[len(vs)-1]
			if old, err := s.readNamed(filepath.Join(s.namedDir(name), strconv.Itoa(latest)+".json")); err == nil && old.Digest == "sha256:"+h {
				return old, nil // unchanged since the latest version: that one again
			}
			version = latest + 1
		}
	}
	p := filepath.Join(s.namedDir(name), strconv.Itoa(version)+".json")
	if old, err := s.readNamed(p); err == nil {
		if old.Digest == "sha256:"+h {
			return old, nil // the same content again: nothing to do
		}
		return fail(fmt.Errorf("%w: %s@%d is %s, this content is sha256:%s", ErrExists, name, version, old.Digest, h))
	}
	l := &Layer{Name: name, Version: version, Digest: "sha256:" + h, Size: size, Entries: meta.Entries,
		ErofsSize: meta.ErofsSize, Source: source, CreatedAt: time.Now().UTC()}
	b, _ := json.MarshalIndent(l, "", "  ")
	if err := os.MkdirAll(s.namedDir(name), 0o755); err != nil {
		return fail(err)
	}
	if err := s.writeFileAtomic(p, b); err != nil {
		return fail(fmt.Errorf("image: layer %s: %w", name, err))
	}
	return l, nil
}
