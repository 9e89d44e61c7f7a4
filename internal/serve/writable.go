package serve

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/warrenhq/warren/internal/edge"
)

// openWritable sets up the writable-layer storage of the node.
func openWritable(ctx context.Context, dataDir string, log *slog.Logger) (edge.WritableLayers, func(), error) {
	dir := filepath.Join(dataDir, "writable")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, err
	}
	return plainWritable{dir: dir}, func() {}, nil
}
