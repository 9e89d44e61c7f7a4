package image

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// maxLayers bounds the layers of one image (overlayfs stacks at most 500).
const maxLayers = 128

// layerSource is one layer to import: a way to open its uncompressed tar
// and, when the format declares it, the expected diff id.
type layerSource struct {
	diffID string // "sha256:<hex>", or "" when unknown (rootfs imports)
	open   func() (io.ReadCloser, error)
	// direct: a directory already in the form of the unpacked layer, to
	// build the EROFS image from (open gives its tar, for the diff id).
	direct string
	// canonical: the layer is known by the digest of its unpacked content
	// (treeDigest), not of its tar stream: a named layer uploaded by a
	// client, whose tar writer is its own business.
	canonical bool
}

type layerMeta struct {
	Size      int64 `json:"size"` // bytes of the uncompressed layer tar
	Entries   int   `json:"entries"`
	ErofsSize int64 `json:"erofs_size,omitempty"`
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
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
				return nil, fmt.Errorf("image: import %s: %w", src, err)
			}
			return nil, fmt.Errorf("%w: import %s: %w", ErrBadContent, src, err)
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
		if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, fs.ErrPermission) && !errors.Is(err, ErrNoSpace) && !errors.Is(err, ErrBadContent) {
			// Not an archive this store can read: the caller's fault.
			return nil, fmt.Errorf("%w: import %s: %w", ErrBadContent, src, err)
		}
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
	var made []string // layers this import made visible; collected again if it fails
	fail := func(err error) (*Image, error) {
		s.collect(made)
		return nil, err
	}
	img := &Image{Name: name, Config: cfg, CreatedAt: time.Now().UTC()}
	for i, src := range srcs {
		h, size, mine, err := s.storeLayer(ctx, src)
		if mine {
			made = append(made, h)
		}
		if err != nil {
			return fail(fmt.Errorf("image: %s: layer %d: %w", name, i, err))
		}
		img.Layers = append(img.Layers, "sha256:"+h)
		img.Size += size
	}
	img.Digest = digestOf(cfg, img.Layers)
	b, err := json.MarshalIndent(img, "", "  ")
	if err != nil {
		return fail(fmt.Errorf("image: %s: %w", name, err))
	}
	unlock, err := s.lock()
	if err != nil {
		return fail(err)
	}
	for _, l := range img.Layers {
		if _, err := os.Lstat(s.BlobPath(l)); err != nil {
			unlock()
			return nil, errLayerGone // collected meanwhile: start again
		}
	}
	err = s.writeFileAtomic(s.imagePath(name), b)
	unlock()
	if err != nil {
		return fail(fmt.Errorf("image: %s: write manifest: %w", name, err))
	}
	slog.Debug("image imported", "name", name, "digest", img.Digest, "layers", len(img.Layers), "took", time.Since(start))
	return img, nil
}

// storeLayer makes sure the layer src is in the store as an EROFS image and
// returns its hex diff id, its tar size, and whether this call added it.
// Concurrent calls for one known diff id in this process convert it once.
func (s *LocalStore) storeLayer(ctx context.Context, src layerSource) (h string, size int64, mine bool, err error) {
	if known, ok := strings.CutPrefix(src.diffID, "sha256:"); ok && validHex(known) {
		for {
			if m, err := s.layerMeta(known); err == nil {
				return known, m.Size, false, nil
			}
			wait, done := s.flight.begin(known)
			if wait == nil {
				defer done()
				break
			}
			select {
			case <-wait: // look again: the other conversion may have failed
			case <-ctx.Done():
				return "", 0, false, ctx.Err()
			}
		}
	}
	if src.direct != "" {
		return s.convertDirect(ctx, src)
	}
	return s.convertLayer(ctx, src)
}

// convertLayer unpacks src into a private directory (checking its diff id),
// packs that into an EROFS image and renames it into place.
func (s *LocalStore) convertLayer(ctx context.Context, src layerSource) (string, int64, bool, error) {
	tmp, err := s.mkTemp("layer")
	if err != nil {
		return "", 0, false, err
	}
	defer os.RemoveAll(tmp)
	tree := filepath.Join(tmp, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		return "", 0, false, err
	}
	h, meta, err := s.unpackLayer(ctx, src, tree)
	if err != nil {
		return "", 0, false, err
	}
	if src.canonical {
		if h, err = treeDigest(tree); err != nil {
			return "", 0, false, err
		}
	}
	if m, err := s.layerMeta(h); err == nil {
		return h, m.Size, false, nil // same content as a stored layer
	}
	img := filepath.Join(tmp, "layer.erofs")
	if err := buildErofs(ctx, tree, img); err != nil {
		return "", 0, false, err
	}
	if fi, err := os.Stat(img); err == nil {
		meta.ErofsSize = fi.Size()
	}
	_ = os.RemoveAll(tree) // free the space before the commit
	mine, err := s.commitLayer(h, img, meta)
	return h, meta.Size, mine, err
}

// commitLayer moves a finished EROFS image into place unless the layer is
// already there (another import won the race).
func (s *LocalStore) commitLayer(h, img string, meta layerMeta) (bool, error) {
	unlock, err := s.lock()
	if err != nil {
		return false, err
	}
	defer unlock()
	final := s.BlobPath(h)
	if _, err := os.Lstat(final); err == nil {
		return false, nil
	}
	mb, _ := json.Marshal(meta)
	if err := s.writeFileAtomic(s.metaPath(h), mb); err != nil {
		return false, fmt.Errorf("commit layer: %w", err)
	}
	if err := os.Chmod(img, 0o444); err != nil {
		return false, err
	}
	if err := os.Rename(img, final); err != nil {
		_ = os.Remove(s.metaPath(h))
		return false, fmt.Errorf("commit layer: %w", err)
	}
	syncDir(filepath.Dir(final))
	return true, nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
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
	if _, err := os.Lstat(s.BlobPath(h)); err != nil {
		return m, err
	}
	b, err := os.ReadFile(s.metaPath(h))
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

// unpackLayer unpacks src into the empty directory dir and checks its diff
// id, which it returns as hex.
func (s *LocalStore) unpackLayer(ctx context.Context, src layerSource, dir string) (string, layerMeta, error) {
	var meta layerMeta
	rc, err := src.open()
	if err != nil {
		return "", meta, err
	}
	defer rc.Close()
	h := sha256.New()
	cr := &countingReader{r: rc, h: h}
	st, err := Unpack(ctx, cr, dir, DefaultLimits)
	if err != nil {
		return "", meta, classify(err)
	}
	// The diff id covers the whole stream, end-of-archive padding included.
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return "", meta, classify(fmt.Errorf("reading layer: %w", err))
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if src.diffID != "" && src.diffID != "sha256:"+sum {
		return "", meta, fmt.Errorf("%w: diff id mismatch: the image says %s, the content is sha256:%s", ErrBadContent, src.diffID, sum)
	}
	meta.Size, meta.Entries = cr.n, st.Entries
	slog.Debug("layer unpacked", "diff_id", "sha256:"+sum, "entries", st.Entries, "bytes", st.Bytes)
	return sum, meta, nil
}

// classify tags an unpack error: a full store, a cancellation, or content
// that cannot be a layer.
func classify(err error) error {
	switch {
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return fmt.Errorf("%w: %v", ErrNoSpace, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	var te *transport.Error
	var ne net.Error
	if errors.As(err, &te) || errors.As(err, &ne) {
		return fmt.Errorf("%w: %w", ErrRegistry, err)
	}
	return fmt.Errorf("%w: %w", ErrBadContent, err)
}
