package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// maxLayers bounds the layers of one image (overlayfs stacks at most 500).
const maxLayers = 128

// layerSource is one layer to import: a way to open its uncompressed tar
// and, when the format declares it, the expected diff id.
type layerSource struct {
	diffID string // "sha256:<hex>", or "" when unknown (rootfs imports)
	open   func() (io.ReadCloser, error)
}

// pendingLayer is a layer unpacked into a temporary directory, or an
// existing one (tmp == "") that the image reuses.
type pendingLayer struct {
	hex  string
	tmp  string
	size int64
}

type layerMeta struct {
	Size    int64 `json:"size"`
	Entries int   `json:"entries"`
}

// Import implements Store. It detects the format of src: an OCI layout
// directory, a root filesystem directory, or an archive (.tar or gzip
// compressed) holding an OCI layout, a `docker save` image or a root
// filesystem.
func (s *LocalStore) Import(ctx context.Context, src string, name string) (*Image, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	fi, err := os.Stat(src)
	if err != nil {
		return nil, fmt.Errorf("image: import: %w", err)
	}
	var (
		cfg  Config
		srcs []layerSource
	)
	if fi.IsDir() {
		if isFile(filepath.Join(src, "index.json")) && isFile(filepath.Join(src, "oci-layout")) {
			cfg, srcs, err = layoutSources(src)
		} else {
			cfg, srcs = Config{}, []layerSource{{open: func() (io.ReadCloser, error) { return tarDir(src), nil }}}
		}
	} else {
		var kind archiveKind
		kind, err = sniffArchive(src)
		if err != nil {
			return nil, fmt.Errorf("image: import %s: %w", src, err)
		}
		switch kind {
		case kindDocker:
			cfg, srcs, err = dockerSources(src, name)
		case kindOCI:
			var tmp string
			tmp, err = s.mkTemp("oci")
			if err != nil {
				return nil, fmt.Errorf("image: import: %w", err)
			}
			defer os.RemoveAll(tmp)
			if err = extractLayoutArchive(ctx, src, tmp); err == nil {
				cfg, srcs, err = layoutSources(tmp)
			}
		default:
			srcs = []layerSource{{open: func() (io.ReadCloser, error) { return openMaybeGzip(src) }}}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("image: import %s: %w", src, err)
	}
	return s.importLayers(ctx, name, cfg, srcs)
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// errLayerGone means a layer this import meant to reuse was pruned before
// the commit; the import starts again.
var errLayerGone = errors.New("image: reused layer was pruned meanwhile")

func (s *LocalStore) importLayers(ctx context.Context, name string, cfg Config, srcs []layerSource) (*Image, error) {
	if len(srcs) > maxLayers {
		return nil, fmt.Errorf("image: %s: %d layers, at most %d", name, len(srcs), maxLayers)
	}
	for attempt := 0; ; attempt++ {
		img, err := s.importOnce(ctx, name, cfg, srcs)
		if errors.Is(err, errLayerGone) && attempt < 2 {
			continue
		}
		return img, err
	}
}

func (s *LocalStore) importOnce(ctx context.Context, name string, cfg Config, srcs []layerSource) (*Image, error) {
	start := time.Now()
	pending := make([]pendingLayer, 0, len(srcs))
	defer func() {
		for _, p := range pending {
			if p.tmp != "" {
				os.RemoveAll(p.tmp)
			}
		}
	}()
	for i, src := range srcs {
		if h, ok := strings.CutPrefix(src.diffID, "sha256:"); ok && validHex(h) {
			if m, err := s.layerMeta(h); err == nil {
				pending = append(pending, pendingLayer{hex: h, size: m.Size})
				continue
			}
		}
		p, err := s.unpackLayer(ctx, src)
		if p.tmp != "" {
			pending = append(pending, p)
		}
		if err != nil {
			return nil, fmt.Errorf("image: %s: layer %d: %w", name, i, err)
		}
	}

	unlock, err := s.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	img := &Image{Name: name, Config: cfg, CreatedAt: time.Now().UTC()}
	for i := range pending {
		p := &pending[i]
		final := filepath.Join(s.dir, "layers", "sha256", p.hex)
		_, statErr := os.Lstat(final)
		switch {
		case statErr == nil:
			// Present already (reused, or another import won the race).
		case p.tmp == "":
			return nil, errLayerGone
		default:
			meta, _ := json.Marshal(layerMeta{Size: p.size})
			if err := s.writeFileAtomic(final+".json", meta); err != nil {
				return nil, fmt.Errorf("image: %s: %w", name, err)
			}
			if err := os.Rename(p.tmp, final); err != nil {
				return nil, fmt.Errorf("image: %s: commit layer: %w", name, err)
			}
			p.tmp = ""
		}
		img.Layers = append(img.Layers, "sha256:"+p.hex)
		img.Size += p.size
	}
	img.Digest = digestOf(cfg, img.Layers)
	b, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("image: %s: %w", name, err)
	}
	if err := s.writeFileAtomic(s.imagePath(name), b); err != nil {
		return nil, fmt.Errorf("image: %s: write manifest: %w", name, err)
	}
	slog.Debug("image imported", "name", name, "digest", img.Digest, "layers", len(img.Layers), "took", time.Since(start))
	return img, nil
}

func validHex(h string) bool {
	if len(h) != 64 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil && strings.ToLower(h) == h
}

func (s *LocalStore) layerMeta(h string) (layerMeta, error) {
	var m layerMeta
	d := filepath.Join(s.dir, "layers", "sha256", h)
	if _, err := os.Lstat(d); err != nil {
		return m, err
	}
	b, err := os.ReadFile(d + ".json")
	if err != nil {
		return m, nil // size unknown; the layer itself is complete
	}
	err = json.Unmarshal(b, &m)
	return m, err
}

// countingReader counts and hashes what passes through it.
type countingReader struct {
	r io.Reader
	n int64
	h interface{ Write([]byte) (int, error) }
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	c.h.Write(p[:n])
	return n, err
}

// unpackLayer unpacks src into a new temporary directory and checks its
// diff id. The returned pendingLayer names the directory even on error so
// the caller removes it.
func (s *LocalStore) unpackLayer(ctx context.Context, src layerSource) (pendingLayer, error) {
	tmp, err := s.mkTemp("layer")
	if err != nil {
		return pendingLayer{}, err
	}
	p := pendingLayer{tmp: tmp}
	if err := os.Chmod(tmp, 0o755); err != nil {
		return p, err
	}
	rc, err := src.open()
	if err != nil {
		return p, err
	}
	defer rc.Close()
	h := sha256.New()
	cr := &countingReader{r: rc, h: h}
	st, err := Unpack(ctx, cr, tmp, DefaultLimits)
	if err != nil {
		return p, err
	}
	// The diff id covers the whole stream, end-of-archive padding included.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return p, fmt.Errorf("reading layer: %w", err)
	}
	p.hex = hex.EncodeToString(h.Sum(nil))
	p.size = cr.n
	if src.diffID != "" && src.diffID != "sha256:"+p.hex {
		return p, fmt.Errorf("diff id mismatch: the image says %s, the content is sha256:%s", src.diffID, p.hex)
	}
	slog.Debug("layer unpacked", "diff_id", "sha256:"+p.hex, "entries", st.Entries, "bytes", st.Bytes)
	return p, nil
}
