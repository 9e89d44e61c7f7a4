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

// imageResolver adapts the image store to what the edge needs.
type imageResolver struct{ store image.Store }

func (r imageResolver) ResolveLayers(ctx context.Context, name string) (*edge.ResolvedImage, error) {
	img, dirs, err := r.store.Resolve(ctx, name)
	if err != nil {
		if errors.Is(err, image.ErrNotFound) {
			return nil, fmt.Errorf("%w: %s", edge.ErrImageNotFound, name)
		}
		return nil, err
	}
	return &edge.ResolvedImage{Digest: img.Digest, Dirs: dirs, Env: img.Config.Env}, nil
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
