package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// GCResult says what a collection removed.
type GCResult struct {
	Removed []string `json:"removed"` // diff ids of removed layers
	Bytes   int64    `json:"bytes"`   // their EROFS image bytes
	Kept    int      `json:"kept"`    // layers still referenced or in use
}

// SetInUse tells the store which layers are mounted on this node; garbage
// collection never removes those. A Mounter calls it.
func (s *LocalStore) SetInUse(f func(hex string) bool) { s.inUse = f }

// GC removes every layer blob that no image and no named layer references
// and that no sandbox of this node has mounted: reference-counted garbage
// collection. Layers only removed from a name stay while a sandbox uses
// them and go at the next collection after their last user stopped.
func (s *LocalStore) GC(ctx context.Context) (GCResult, error) {
	unlock, err := s.lock()
	if err != nil {
		return GCResult{}, err
	}
	defer unlock()
	return s.gcLocked(nil)
}

// collect removes the given layers if nothing references them (used after
// a failed import and when a layer's last mount goes).
func (s *LocalStore) collect(hexes []string) {
	if len(hexes) == 0 {
		return
	}
	unlock, err := s.lock()
	if err != nil {
		return
	}
	defer unlock()
	only := map[string]bool{}
	for _, h := range hexes {
		only[h] = true
	}
	_, _ = s.gcLocked(only)
}

// references counts, per layer hex, the images and named layers that use it.
func (s *LocalStore) references() (map[string]int, error) {
	refs := map[string]int{}
	imgs, err := s.List(context.Background())
	if err != nil {
		return nil, err
	}
	for _, img := range imgs {
		for _, l := range img.Layers {
			refs[strings.TrimPrefix(l, "sha256:")]++
		}
	}
	named, err := s.allNamed()
	if err != nil {
		return nil, err
	}
	for _, l := range named {
		refs[strings.TrimPrefix(l.Digest, "sha256:")]++
	}
	return refs, nil
}

// gcLocked collects unreferenced, unmounted layers (only those in only,
// when it is set). The caller holds the lock.
func (s *LocalStore) gcLocked(only map[string]bool) (GCResult, error) {
	var res GCResult
	refs, err := s.references()
	if err != nil {
		return res, err
	}
	bdir := filepath.Join(s.dir, "blobs", "sha256")
	ents, err := os.ReadDir(bdir)
	if err != nil {
		return res, fmt.Errorf("image: gc: %w", err)
	}
	for _, e := range ents {
		h, ok := strings.CutSuffix(e.Name(), ".erofs")
		if !ok || !validHex(h) {
			continue
		}
		if only != nil && !only[h] {
			continue
		}
		if refs[h] > 0 || (s.inUse != nil && s.inUse(h)) {
			res.Kept++
			continue
		}
		var size int64
		if fi, err := e.Info(); err == nil {
			size = fi.Size()
		}
		// Unlinking is atomic: the layer is there whole or not at all. A
		// mount elsewhere keeps its open file.
		if err := os.Remove(filepath.Join(bdir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return res, fmt.Errorf("image: gc: %w", err)
		}
		_ = os.Remove(s.metaPath(h))
		res.Removed = append(res.Removed, "sha256:"+h)
		res.Bytes += size
	}
	// Metadata whose layer is gone (a crash between the two removals).
	for _, e := range ents {
		if h, ok := strings.CutSuffix(e.Name(), ".json"); ok && validHex(h) {
			if _, err := os.Lstat(s.BlobPath(h)); errors.Is(err, fs.ErrNotExist) {
				_ = os.Remove(filepath.Join(bdir, e.Name()))
			}
		}
	}
	return res, nil
}

// Prune removes layers that nothing references and returns how many.
func (s *LocalStore) Prune(ctx context.Context) (int, error) {
	res, err := s.GC(ctx)
	return len(res.Removed), err
}
