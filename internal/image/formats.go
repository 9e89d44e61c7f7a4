package image

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

type archiveKind int

const (
	kindRootfs archiveKind = iota
	kindDocker
	kindOCI
)

// readCloser pairs a decompressing reader with the file under it.
type readCloser struct {
	io.Reader
	closers []io.Closer
}

func (r *readCloser) Close() error {
	var err error
	for _, c := range r.closers {
		if cerr := c.Close(); err == nil {
			err = cerr
		}
	}
	return err
}

// openMaybeGzip opens a file and transparently gunzips it.
func openMaybeGzip(p string) (io.ReadCloser, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(f, 64<<10)
	magic, _ := br.Peek(2)
	if len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return &readCloser{Reader: zr, closers: []io.Closer{zr, f}}, nil
	}
	return &readCloser{Reader: br, closers: []io.Closer{f}}, nil
}

// imageArchiveEntry reports whether a top-level archive entry can belong to
// an OCI layout or a docker-save archive.
func imageArchiveEntry(n string) bool {
	first, rest, nested := strings.Cut(n, "/")
	switch {
	case first == "blobs":
		return true
	case !nested && (first == "manifest.json" || first == "index.json" || first == "oci-layout" || first == "repositories"):
		return true
	case nested:
		// legacy docker save: <id>/layer.tar, <id>/json, <id>/VERSION
		return validHex(first) && (rest == "" || rest == "layer.tar" || rest == "json" || rest == "VERSION")
	}
	// <id>.json configs, <hex>.tar[.gz|.zst] layers, sha256:<hex> configs
	stem := strings.TrimPrefix(first, "sha256:")
	for _, ext := range []string{".json", ".tar", ".tar.gz", ".tar.zst"} {
		if s, ok := strings.CutSuffix(stem, ext); ok {
			stem = s
			break
		}
	}
	return validHex(stem)
}

// sniffArchive tells an image archive from a root filesystem tarball. It
// stops at the first entry no image archive has, so a rootfs is recognised
// after a few headers.
func sniffArchive(p string) (archiveKind, error) {
	rc, err := openMaybeGzip(p)
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var docker, index, ociLayout bool
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if n == 0 {
				return 0, fmt.Errorf("not a tar archive: %w", err)
			}
			return 0, fmt.Errorf("reading archive: %w", err)
		}
		name, err := cleanName(hdr.Name)
		if err != nil || name == "" {
			continue
		}
		if !imageArchiveEntry(name) {
			return kindRootfs, nil
		}
		switch name {
		case "manifest.json":
			docker = true
		case "index.json":
			index = true
		case "oci-layout":
			ociLayout = true
		}
	}
	switch {
	case docker:
		return kindDocker, nil
	case index && ociLayout:
		return kindOCI, nil
	}
	return kindRootfs, nil
}

// dockerSources reads a `docker save` archive. With several images in it,
// the one tagged name (or name:latest) is taken.
func dockerSources(p, want string) (Config, []layerSource, error) {
	opener := func() (io.ReadCloser, error) { return openMaybeGzip(p) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return Config{}, nil, fmt.Errorf("docker archive: %w", err)
	}
	var tag *name.Tag
	if len(m) > 1 {
		for _, d := range m {
			for _, t := range d.RepoTags {
				if t == want || t == want+":latest" {
					tg, err := name.NewTag(t)
					if err != nil {
						return Config{}, nil, err
					}
					tag = &tg
				}
			}
		}
		if tag == nil {
			return Config{}, nil, fmt.Errorf("docker archive holds %d images, none tagged %q", len(m), want)
		}
	}
	img, err := tarball.Image(opener, tag)
	if err != nil {
		return Config{}, nil, fmt.Errorf("docker archive: %w", err)
	}
	return imageSources(img)
}

// layoutSources reads an OCI image layout directory; of a multi-platform
// index it takes linux/amd64.
func layoutSources(dir string) (Config, []layerSource, error) {
	ii, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return Config{}, nil, fmt.Errorf("oci layout: %w", err)
	}
	img, err := pickImage(ii, 0)
	if err != nil {
		return Config{}, nil, fmt.Errorf("oci layout: %w", err)
	}
	return imageSources(img)
}

func pickImage(ii v1.ImageIndex, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, errors.New("indexes nested too deeply")
	}
	im, err := ii.IndexManifest()
	if err != nil {
		return nil, err
	}
	var fallback *v1.Descriptor
	for i := range im.Manifests {
		d := &im.Manifests[i]
		switch {
		case d.MediaType.IsIndex():
			child, err := ii.ImageIndex(d.Digest)
			if err != nil {
				return nil, err
			}
			if img, err := pickImage(child, depth+1); err == nil {
				return img, nil
			}
		case d.MediaType.IsImage():
			if d.Platform == nil {
				if fallback == nil {
					fallback = d
				}
				continue
			}
			if d.Platform.OS == "linux" && d.Platform.Architecture == "amd64" {
				return ii.Image(d.Digest)
			}
		}
	}
	if fallback != nil {
		return ii.Image(fallback.Digest)
	}
	return nil, errors.New("no linux/amd64 image in the index")
}

func imageSources(img v1.Image) (Config, []layerSource, error) {
	cf, err := img.ConfigFile()
	if err != nil {
		return Config{}, nil, fmt.Errorf("config: %w", err)
	}
	if cf.OS != "" && cf.OS != "linux" || cf.Architecture != "" && cf.Architecture != "amd64" {
		return Config{}, nil, fmt.Errorf("image is for %s/%s, not linux/amd64", cf.OS, cf.Architecture)
	}
	layers, err := img.Layers()
	if err != nil {
		return Config{}, nil, fmt.Errorf("layers: %w", err)
	}
	srcs := make([]layerSource, 0, len(layers))
	for _, l := range layers {
		d, err := l.DiffID()
		if err != nil {
			return Config{}, nil, fmt.Errorf("layer diff id: %w", err)
		}
		if d.Algorithm != "sha256" {
			return Config{}, nil, fmt.Errorf("layer diff id %s: only sha256 is supported", d)
		}
		srcs = append(srcs, layerSource{diffID: d.String(), open: l.Uncompressed})
	}
	c := cf.Config
	return Config{Env: c.Env, Entrypoint: c.Entrypoint, Cmd: c.Cmd, WorkingDir: c.WorkingDir, User: c.User}, srcs, nil
}

// extractLayoutArchive writes the files of an OCI layout archive (only
// oci-layout, index.json and blobs/<alg>/<hex>) into dir.
func extractLayoutArchive(ctx context.Context, p, dir string) error {
	rc, err := openMaybeGzip(p)
	if err != nil {
		return err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("oci archive: %w", err)
		}
		n, err := cleanName(hdr.Name)
		if err != nil {
			return fmt.Errorf("oci archive: %q: %w", hdr.Name, err)
		}
		if hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeRegA { //nolint:staticcheck
			continue
		}
		parts := strings.Split(n, "/")
		ok := n == "oci-layout" || n == "index.json" ||
			len(parts) == 3 && parts[0] == "blobs" && parts[1] == "sha256" && validHex(parts[2])
		if !ok {
			continue
		}
		dst := filepath.Join(dir, filepath.FromSlash(n))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return fmt.Errorf("oci archive: %w", err)
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("oci archive: %s: %w", n, err)
		}
	}
}
