package image

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
)

// mkfsErofs is the EROFS builder (Debian's erofs-utils).
var mkfsErofs = sync.OnceValues(func() (string, error) {
	p, err := exec.LookPath("mkfs.erofs")
	if err != nil {
		return "", errors.New("image: mkfs.erofs not found (install erofs-utils: scripts/install-deps.sh)")
	}
	return p, nil
})

// buildErofs packs the directory src into a new EROFS image at dst and
// fsyncs it. The image is uncompressed so that a mounted layer reads file
// blocks straight from the store (on demand, through the page cache);
// owners, modes, times, xattrs (overlay whiteouts and opaque markers
// included), hard links and device nodes are kept as they are in src.
func buildErofs(ctx context.Context, src, dst string) error {
	bin, err := mkfsErofs()
	if err != nil {
		return err
	}
	// erofs-utils 1.5 spells quiet "--quiet" (no -q).
	cmd := exec.CommandContext(ctx, bin, "--quiet", "--preserve-mtime", dst, src)
	var stderr bytes.Buffer
	cmd.Stdout = &stderr
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if len(msg) > 512 {
			msg = msg[len(msg)-512:]
		}
		_ = os.Remove(dst)
		if strings.Contains(msg, "No space") || strings.Contains(msg, "ENOSPC") {
			return fmt.Errorf("%w: mkfs.erofs: %s", ErrNoSpace, msg)
		}
		return fmt.Errorf("mkfs.erofs: %w: %s", err, msg)
	}
	f, err := os.Open(dst)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("mkfs.erofs: sync: %w", err)
	}
	return nil
}

// flights deduplicates work on one key inside a process: the first caller
// does it, later callers wait for it and then look at its result.
type flights struct {
	mu sync.Mutex
	m  map[string]chan struct{}
}

// begin returns (nil, done) for the first caller of key, who must call done;
// others get a channel that closes when the first caller is done.
func (f *flights) begin(key string) (wait <-chan struct{}, done func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ch, ok := f.m[key]; ok {
		return ch, nil
	}
	if f.m == nil {
		f.m = map[string]chan struct{}{}
	}
	ch := make(chan struct{})
	f.m[key] = ch
	return nil, func() {
		f.mu.Lock()
		delete(f.m, key)
		f.mu.Unlock()
		close(ch)
	}
}
