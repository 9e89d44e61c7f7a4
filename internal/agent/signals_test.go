package agent

import (
	"bytes"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestIgnoredSignalsLogBounded: a flood of signals makes one log line per
// interval, not one per signal.
func TestIgnoredSignalsLogBounded(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	sigs := make(chan os.Signal, 1)
	done := make(chan struct{})
	go func() {
		logIgnoredSignals(log, sigs, time.Hour)
		close(done)
	}()
	for i := 0; i < 10000; i++ {
		sigs <- syscall.SIGTERM
	}
	close(sigs)
	<-done
	if n := strings.Count(buf.String(), "\n"); n != 1 {
		t.Fatalf("%d log lines for 10000 signals:\n%s", n, buf.String())
	}
}
