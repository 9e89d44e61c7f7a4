package serve

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

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
	ri := &edge.ResolvedImage{Digest: img.Digest, Layers: layers, Env: img.Config.Env,
		WorkingDir: img.Config.WorkingDir, User: img.Config.User}
	if img.Disk != nil {
		if ri.Disk, _, err = r.store.ResolveDisk(ctx, name); err != nil {
			return nil, err
		}
	}
	return ri, nil
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

// storeErr turns the image store's errors into API errors where the
// caller is at fault (or the store is full).
func storeErr(err error) error {
	if err == nil {
		return nil
	}
	code := ""
	switch {
	case errors.Is(err, image.ErrNotFound):
		code = api.CodeNotFound
	case errors.Is(err, image.ErrExists):
		code = api.CodeConflict
	case errors.Is(err, image.ErrBadDisk):
		code = api.CodeBadRequest // a corrupt or unsafe VM disk image: 400
	case errors.Is(err, image.ErrInvalid), errors.Is(err, image.ErrBadContent):
		code = api.CodeInvalid
	case errors.Is(err, image.ErrNoSpace):
		code = api.CodeUnavailable
	case errors.Is(err, image.ErrRegistry):
		code = api.CodeUnavailable
	default:
		return err
	}
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "image: ")
	return &api.Error{Code: code, Message: msg}
}

func (r imageResolver) ResolveLayer(ctx context.Context, ref string) (*api.Layer, error) {
	l, err := r.store.ResolveLayer(ctx, ref)
	if err != nil {
		return nil, storeErr(err)
	}
	a := l.API()
	return &a, nil
}

func layersAPI(ls []image.Layer) []api.Layer {
	out := make([]api.Layer, 0, len(ls))
	for i := range ls {
		out = append(out, ls[i].API())
	}
	return out
}

func (r imageResolver) ListLayers(ctx context.Context, name string) ([]api.Layer, error) {
	ls, err := r.store.ListLayers(ctx, name)
	if err != nil {
		return nil, storeErr(err)
	}
	return layersAPI(ls), nil
}

func (r imageResolver) DeleteLayer(ctx context.Context, name string, version int) ([]api.Layer, error) {
	ls, err := r.store.DeleteLayer(ctx, name, version)
	if err != nil {
		return nil, storeErr(err)
	}
	return layersAPI(ls), nil
}

func (r imageResolver) CreateLayerFromTar(ctx context.Context, name string, version int, path string) (*api.Layer, error) {
	l, err := r.store.CreateLayerFromTar(ctx, name, version, path)
	if err != nil {
		return nil, storeErr(err)
	}
	a := l.API()
	return &a, nil
}

func (r imageResolver) CreateLayerFromChanges(ctx context.Context, name string, version int, upper string, lowers []string, idBase uint32, source string) (*api.Layer, error) {
	l, err := r.store.CreateLayerFromChanges(ctx, name, version, upper, lowers, idBase, source)
	if err != nil {
		return nil, storeErr(err)
	}
	a := l.API()
	return &a, nil
}

func (r imageResolver) CreateLayerFromPrivateChanges(ctx context.Context, name string, version int, dir string, lowers []string, idBase uint32, source string) (*api.Layer, error) {
	l, err := r.store.CreateLayerFromPrivateChanges(ctx, name, version, dir, lowers, idBase, source)
	if err != nil {
		return nil, storeErr(err)
	}
	a := l.API()
	return &a, nil
}

func (r imageResolver) GC(ctx context.Context) (*api.GCResult, error) {
	res, err := r.store.GC(ctx)
	if err != nil {
		return nil, err
	}
	if res.Removed == nil {
		res.Removed = []string{}
	}
	return &api.GCResult{Removed: res.Removed, Bytes: res.Bytes, Kept: res.Kept}, nil
}

func (r imageResolver) PullImage(ctx context.Context, ref, name string) (*api.Image, error) {
	img, err := r.store.Pull(ctx, ref, name)
	if err != nil {
		return nil, storeErr(err)
	}
	a := img.API()
	return &a, nil
}

func (r imageResolver) StageFile() (*os.File, error) { return r.store.StageFile() }

func (r imageResolver) CommitImage(ctx context.Context, req *api.CommitImageRequest) (*api.Image, error) {
	var cfg image.Config
	if c := req.Config; c != nil {
		cfg = image.Config{Env: c.Env, WorkingDir: c.WorkingDir, User: c.User, Cmd: c.Cmd, Entrypoint: c.Entrypoint,
			Labels: c.Labels, ExposedPorts: c.ExposedPorts}
	}
	img, err := r.store.Commit(ctx, req.Name, req.Base, req.Layers, cfg)
	if err != nil {
		return nil, storeErr(err)
	}
	a := img.API()
	return &a, nil
}

func (r imageResolver) ImportDisk(ctx context.Context, path, name, format string) (*api.Image, error) {
	img, err := r.store.ImportDisk(ctx, path, name, format)
	if err != nil {
		err = storeErr(err)
		var ae *api.Error
		if errors.As(err, &ae) { // the staging file means nothing to the client
			ae.Message = strings.ReplaceAll(ae.Message, path, "the uploaded disk image")
			ae.Message = strings.ReplaceAll(ae.Message, filepath.Base(path), "the uploaded disk image")
		}
		return nil, err
	}
	a := img.API()
	return &a, nil
}

func (r imageResolver) ImportImage(ctx context.Context, path, name string) (*api.Image, error) {
	img, err := r.store.Import(ctx, path, name)
	if err != nil {
		err = storeErr(err)
		var ae *api.Error
		if errors.As(err, &ae) { // the staging file means nothing to the client
			ae.Message = strings.ReplaceAll(ae.Message, path, "the uploaded archive")
		}
		return nil, err
	}
	a := img.API()
	return &a, nil
}
