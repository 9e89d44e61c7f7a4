package serve

import (
	"context"
	"log/slog"
	"path/filepath"

	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/scratch"
)

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
