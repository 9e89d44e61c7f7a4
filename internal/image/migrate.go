package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"
)

// migrate converts a store of the first format, whose layers were unpacked
// directories (layers/sha256/<hex>/, already in overlay whiteout form), into
// EROFS images under the same diff ids; image manifests stay as they are.
// Each layer is converted, committed, and only then its directory removed,
// so an interrupted migration resumes at the next Open. Sandboxes must not
// be using the old directories (stop them before upgrading the format).
func (s *LocalStore) migrate(ctx context.Context) error {
	old := filepath.Join(s.dir, "layers", "sha256")
	ents, err := os.ReadDir(old)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("image: migrate: %w", err)
	}
	start := time.Now()
	n := 0
	for _, e := range ents {
		h := e.Name()
		if !e.IsDir() || !validHex(h) {
			continue
		}
		dir := filepath.Join(old, h)
		if _, err := os.Lstat(s.BlobPath(h)); err != nil {
			var meta layerMeta
			if b, err := os.ReadFile(dir + ".json"); err == nil {
				_ = json.Unmarshal(b, &meta)
			}
			tmp, err := s.mkTemp("migrate")
			if err != nil {
				return err
			}
			img := filepath.Join(tmp, "layer.erofs")
			if err := buildErofs(ctx, dir, img); err != nil {
				os.RemoveAll(tmp)
				return fmt.Errorf("image: migrate layer %s: %w", h, err)
			}
			if fi, err := os.Stat(img); err == nil {
				meta.ErofsSize = fi.Size()
			}
			_, err = s.commitLayer(h, img, meta)
			os.RemoveAll(tmp)
			if err != nil {
				return fmt.Errorf("image: migrate layer %s: %w", h, err)
			}
		}
		// Out of sight first, then away.
		tmp, err := s.mkTemp("gc")
		if err != nil {
			return err
		}
		if err := os.Rename(dir, filepath.Join(tmp, "layer")); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("image: migrate: %w", err)
		}
		_ = os.Remove(dir + ".json")
		if err := os.RemoveAll(tmp); err != nil {
			return fmt.Errorf("image: migrate: %w", err)
		}
		n++
	}
	// Leftover metadata files, then the old directories when empty.
	ents, _ = os.ReadDir(old)
	for _, e := range ents {
		if filepath.Ext(e.Name()) == ".json" {
			_ = os.Remove(filepath.Join(old, e.Name()))
		}
	}
	_ = os.Remove(old)
	_ = os.Remove(filepath.Join(s.dir, "layers"))
	if n > 0 {
		slog.Info("image store migrated to EROFS layers", "dir", s.dir, "layers", n, "took", time.Since(start))
	}
	return nil
}
