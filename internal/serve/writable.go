package serve

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/scratch"
)

// diskCapacity is the disk the edge admits (MiB: what the writable
// layers' filesystem can really hold × overcommit) and the function that
// measures that filesystem, or 0 and nil when it cannot be measured.
func diskCapacity(w edge.WritableLayers, overcommit float64, log *slog.Logger) (int64, func() (int64, int64, error)) {
	sp, ok := w.(interface{ Space() (int64, int64, error) })
	if !ok {
		return 0, nil
	}
	total, avail, err := sp.Space()
	if err != nil {
		log.Warn("cannot measure the writable layers' filesystem: disk is not admitted", "err", err)
		return 0, nil
	}
	log.Info("writable layers", "total_mb", total>>20, "available_mb", avail>>20, "admitted_mb", int64(float64(total>>20)*overcommit))
	return int64(float64(total>>20) * overcommit), func() (int64, int64, error) {
		t, a, err := sp.Space()
		return t >> 20, a >> 20, err
	}
}

// openWritable sets up the node's writable-layer storage (a filesystem with
// per-sandbox disk limits where the kernel allows it). The returned close
// function unmounts it unless sandboxes are kept running.
func openWritable(ctx context.Context, dataDir string, keep bool, log *slog.Logger) (edge.WritableLayers, func(), error) {
	s, err := scratch.Open(ctx, filepath.Join(dataDir, "writable"), 0)
	if err != nil {
		return nil, nil, err
	}
	if !s.Limited() {
		log.Warn("sandbox disk limits are not enforced: no quota-capable filesystem available", "dir", s.Dir())
	}
	return s, func() {
		if !keep {
			if err := s.Close(); err != nil {
				log.Warn("close writable storage", "err", err)
			}
		}
	}, nil
}
