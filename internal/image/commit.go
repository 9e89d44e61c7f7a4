package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"
)

// Commit stores name as the image base (its layers and config; "" or
// "scratch" for none) with the named layers refs ("name@version", bottom
// first) stacked above it and over's settings over base's config: over's
// environment entries replace the base's of the same key, every other field
// of over that is set replaces the base's. An existing image of that name
// is replaced. It copies no layer data: the image record names the layers'
// blobs, which garbage collection then keeps.
func (s *LocalStore) Commit(ctx context.Context, name, base string, refs []string, over Config) (*Image, error) {
	if err := ValidName(name); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	img := &Image{Name: name, CreatedAt: time.Now().UTC()}
	if base != "" && base != "scratch" {
		b, err := s.readImage(base)
		if err != nil {
			if errors.Is(err, ErrNotFound) {
				return nil, fmt.Errorf("%w: base image %s", ErrNotFound, base)
			}
			return nil, err
		}
		img.Layers = append(img.Layers, b.Layers...)
		img.Size = b.Size
		img.Config = b.Config
	}
	for _, ref := range refs {
		l, err := s.ResolveLayer(ctx, ref)
		if err != nil {
			return nil, err
		}
		img.Layers = append(img.Layers, l.Digest)
		img.Size += l.Size
	}
	if len(img.Layers) > maxLayers {
		return nil, fmt.Errorf("%w: image %s would have %d layers, at most %d", ErrInvalid, name, len(img.Layers), maxLayers)
	}
	img.Config = mergeConfig(img.Config, over)
	img.Digest = digestOf(img.Config, img.Layers)
	b, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("image: %s: %w", name, err)
	}
	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	for _, l := range img.Layers {
		if _, err := os.Lstat(s.BlobPath(l)); err != nil {
			return nil, fmt.Errorf("%w: image %s: layer %s is gone (removed meanwhile)", ErrNotFound, name, l)
		}
	}
	if err := s.writeFileAtomic(s.imagePath(name), b); err != nil {
		return nil, fmt.Errorf("image: %s: write manifest: %w", name, err)
	}
	slog.Debug("image committed", "name", name, "base", base, "digest", img.Digest, "layers", len(img.Layers))
	return img, nil
}

// mergeConfig returns base with over's settings applied.
func mergeConfig(base, over Config) Config {
	out := base
	out.Env = mergeEnv(base.Env, over.Env)
	if over.WorkingDir != "" {
		out.WorkingDir = over.WorkingDir
	}
	if over.User != "" {
		out.User = over.User
	}
	if over.Entrypoint != nil {
		out.Entrypoint = over.Entrypoint
		out.Cmd = nil // as in Docker: a new entrypoint resets the base's cmd
	}
	if over.Cmd != nil {
		out.Cmd = over.Cmd
	}
	if len(over.Labels) > 0 {
		labels := make(map[string]string, len(base.Labels)+len(over.Labels))
		for k, v := range base.Labels {
			labels[k] = v
		}
		for k, v := range over.Labels {
			labels[k] = v
		}
		out.Labels = labels
	}
	for _, p := range over.ExposedPorts {
		if !contains(out.ExposedPorts, p) {
			out.ExposedPorts = append(append([]string(nil), out.ExposedPorts...), p)
		}
	}
	return out
}

// mergeEnv returns base's KEY=VALUE entries with over's replacing those of
// the same key, in order of first appearance.
func mergeEnv(base, over []string) []string {
	if len(over) == 0 {
		return base
	}
	out := append([]string(nil), base...)
	for _, kv := range over {
		k, _, _ := strings.Cut(kv, "=")
		replaced := false
		for i, old := range out {
			if ok, _, _ := strings.Cut(old, "="); ok == k {
				out[i] = kv
				replaced = true
				break
			}
		}
		if !replaced {
			out = append(out, kv)
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
