package serve

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/image"
)

// imageResolver adapts the image store and the node's layer mounts to
// what the edge needs.
type imageResolver struct {
	store  *image.LocalStore
	mounts *image.Mounter
}

func (r imageResolver) ResolveLayers(ctx context.Context, name string) (*edge.ResolvedImage, error) {
	img, _, err := r.store.Resolve(ctx, name)
	if err != nil {
		if errors.Is(err, image.ErrNotFound) {
			return nil, fmt.Errorf("%w: %s", edge.ErrImageNotFound, name)
		}
		return nil, err
	}
	layers := make([]string, 0, len(img.Layers))
	for i := len(img.Layers) - 1; i >= 0; i-- {
		layers = append(layers, img.Layers[i])
	}
	return &edge.ResolvedImage{Digest: img.Digest, Layers: layers, Env: img.Config.Env}, nil
}

func (r imageResolver) MountLayers(holder string, ids []string) ([]string, error) {
	return r.mounts.Acquire(holder, ids)
}

func (r imageResolver) ReleaseLayers(holder string) { r.mounts.Release(holder) }

func (r imageResolver) ReconcileMounts(holders map[string][]string) error {
	return r.mounts.Reconcile(holders)
}

func (r imageResolver) ListImages(ctx context.Context) ([]api.Image, error) {
	imgs, err := r.store.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]api.Image, 0, len(imgs))
	for i := range imgs {
		out = append(out, imgs[i].API())
	}
	return out, nil
}

// plainWritable keeps writable layers in a directory without a disk limit
// (used only when the scratch filesystem cannot be set up).
type plainWritable struct{ dir string }

func (p plainWritable) Alloc(id string, _ int64) (string, error) {
	d := filepath.Join(p.dir, id)
	return d, os.MkdirAll(d, 0o700)
}

func (p plainWritable) Free(id string) error { return os.RemoveAll(filepath.Join(p.dir, id)) }

func (p plainWritable) List() ([]string, error) {
	ents, err := os.ReadDir(p.dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out, nil
}
