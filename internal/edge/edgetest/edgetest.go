// Package edgetest holds the seams that let the edge run without root: an
// in-memory image resolver and writable layers in plain directories, and
// a harness that starts an edge on the embedded NATS server with the fake
// runtime (internal/runtime/fake).
//
// Lock order: Images.mu alone (nothing else is held with it).
package edgetest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge"
)

// errUnsupported answers what the in-memory store does not do (named
// layers, pulls, builds): a client's 400, not a node failure.
func errUnsupported(what string) error {
	return &api.Error{Code: api.CodeBadRequest, Message: "edgetest: " + what + " is not supported by the in-memory image store"}
}

// Images is an in-memory edge.ImageResolver: images are names with layer
// ids; "mounting" a layer makes an empty directory for it once and counts
// its holders.
type Images struct {
	dir string

	mu      sync.Mutex
	images  map[string]*edge.ResolvedImage
	holders map[string][]string // holder -> diff ids it holds
}

var _ edge.ImageResolver = (*Images)(nil)

// NewImages returns a store whose layer directories live under dir.
func NewImages(dir string) *Images {
	return &Images{dir: dir, images: map[string]*edge.ResolvedImage{}, holders: map[string][]string{}}
}

// Add stores an image of the given layer names (top-most first) and
// environment.
func (s *Images) Add(name string, layers []string, env ...string) {
	img := &edge.ResolvedImage{Env: env}
	h := sha256.New()
	for _, l := range layers {
		sum := sha256.Sum256([]byte(l))
		img.Layers = append(img.Layers, "sha256:"+hex.EncodeToString(sum[:]))
		h.Write(sum[:])
	}
	img.Digest = "sha256:" + hex.EncodeToString(h.Sum(nil))
	s.mu.Lock()
	defer s.mu.Unlock()
	s.images[name] = img
}

// Holders lists the holders of mounted layers, sorted.
func (s *Images) Holders() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.holders))
	for h := range s.holders {
		out = append(out, h)
	}
	sort.Strings(out)
	return out
}

// ResolveLayers finds an image.
func (s *Images) ResolveLayers(ctx context.Context, name string) (*edge.ResolvedImage, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.images[name]
	if !ok {
		return nil, fmt.Errorf("%w: %s", edge.ErrImageNotFound, name)
	}
	c := *img
	c.Layers = append([]string(nil), img.Layers...)
	c.Env = append([]string(nil), img.Env...)
	return &c, nil
}

// ListImages lists the stored images.
func (s *Images) ListImages(ctx context.Context) ([]api.Image, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []api.Image{}
	for name, img := range s.images {
		out = append(out, api.Image{Name: name, Digest: img.Digest})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// MountLayers makes a directory per layer and records holder's references.
func (s *Images) MountLayers(holder string, diffIDs []string) ([]string, error) {
	dirs := make([]string, len(diffIDs))
	for i, id := range diffIDs {
		d := filepath.Join(s.dir, "layers", filepath.Base(id))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
		dirs[i] = d
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holders[holder] = append([]string(nil), diffIDs...)
	return dirs, nil
}

// ReleaseLayers drops holder's references.
func (s *Images) ReleaseLayers(holder string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.holders, holder)
}

// ReconcileMounts keeps exactly the given holders.
func (s *Images) ReconcileMounts(holders map[string][]string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holders = map[string][]string{}
	for h, ids := range holders {
		s.holders[h] = append([]string(nil), ids...)
	}
	return nil
}

// ResolveLayer knows no named layers.
func (s *Images) ResolveLayer(ctx context.Context, ref string) (*api.Layer, error) {
	return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("layer %q not found", ref)}
}

// ListLayers lists no named layers.
func (s *Images) ListLayers(ctx context.Context, name string) ([]api.Layer, error) {
	return []api.Layer{}, nil
}

// DeleteLayer knows no named layers.
func (s *Images) DeleteLayer(ctx context.Context, name string, version int) ([]api.Layer, error) {
	return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("layer %q not found", name)}
}

// CreateLayerFromTar makes no layer: it answers with the file's digest and
// size (what an upload delivered), at version (at least 1).
func (s *Images) CreateLayerFromTar(ctx context.Context, name string, version int, path string) (*api.Layer, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return nil, err
	}
	return &api.Layer{Name: name, Version: max(version, 1), Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Size: n}, nil
}

// CreateLayerFromChanges is not supported.
func (s *Images) CreateLayerFromChanges(ctx context.Context, name string, version int, upper string, lowers []string, idBase uint32, source string) (*api.Layer, error) {
	return nil, errUnsupported("creating layers")
}

// CreateLayerFromPrivateChanges is not supported.
func (s *Images) CreateLayerFromPrivateChanges(ctx context.Context, name string, version int, dir string, lowers []string, idBase uint32, source string) (*api.Layer, error) {
	return nil, errUnsupported("creating layers")
}

// GC frees nothing.
func (s *Images) GC(ctx context.Context) (*api.GCResult, error) { return &api.GCResult{}, nil }

// PullImage is not supported (no network).
func (s *Images) PullImage(ctx context.Context, ref, name string) (*api.Image, error) {
	return nil, errUnsupported("pulling images")
}

// StageFile makes a private file under the store's directory.
func (s *Images) StageFile() (*os.File, error) {
	d := filepath.Join(s.dir, "staging")
	if err := os.MkdirAll(d, 0o700); err != nil {
		return nil, err
	}
	return os.CreateTemp(d, "upload-")
}

// CommitImage is not supported.
func (s *Images) CommitImage(ctx context.Context, req *api.CommitImageRequest) (*api.Image, error) {
	return nil, errUnsupported("committing images")
}

// ImportDisk is not supported.
func (s *Images) ImportDisk(ctx context.Context, path, name, format string) (*api.Image, error) {
	return nil, errors.New("edgetest: disk import not supported")
}

// ImportImage is not supported.
func (s *Images) ImportImage(ctx context.Context, path, name string) (*api.Image, error) {
	return nil, errUnsupported("importing images")
}

// Writable is edge.WritableLayers in plain directories (no disk limit is
// enforced; Limit tells what was asked).
type Writable struct {
	dir string

	mu     sync.Mutex
	limits map[string]int64
}

var _ edge.WritableLayers = (*Writable)(nil)

// NewWritable keeps writable layers under dir.
func NewWritable(dir string) *Writable { return &Writable{dir: dir, limits: map[string]int64{}} }

// Alloc makes id's directory.
func (w *Writable) Alloc(id string, limitBytes int64) (string, error) {
	if id == "" || filepath.Base(id) != id {
		return "", errors.New("edgetest: bad writable layer name " + id)
	}
	d := filepath.Join(w.dir, id)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return "", err
	}
	w.mu.Lock()
	w.limits[id] = limitBytes
	w.mu.Unlock()
	return d, nil
}

// Free removes id's directory (idempotent).
func (w *Writable) Free(id string) error {
	w.mu.Lock()
	delete(w.limits, id)
	w.mu.Unlock()
	return os.RemoveAll(filepath.Join(w.dir, id))
}

// List lists the layers that exist.
func (w *Writable) List() ([]string, error) {
	ents, err := os.ReadDir(w.dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	out := make([]string, 0, len(ents))
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, nil
}
