package cli

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// progress prints how a long step goes, every two seconds, to w (the
// terminal's stderr): bytes sent so far of an upload, then the time the
// server takes to finish it.
type progress struct {
	w     io.Writer
	what  string
	total int64
	n     atomic.Int64
	start time.Time
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

func newProgress(w io.Writer, what string, total int64) *progress {
	p := &progress{w: w, what: what, total: total, start: time.Now(), done: make(chan struct{})}
	p.wg.Add(1)
	go p.loop()
	return p
}

func (p *progress) loop() {
	defer p.wg.Done()
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
			n := p.n.Load()
			secs := time.Since(p.start).Seconds()
			switch {
			case p.total > 0 && n >= p.total:
				fmt.Fprintf(p.w, "%s: sent %s, the server is storing it (%.0fs)\n", p.what, humanBytes(n), secs)
			case p.total > 0:
				fmt.Fprintf(p.w, "%s: %s of %s (%.0f%%, %.0fs)\n", p.what, humanBytes(n), humanBytes(p.total), 100*float64(n)/float64(p.total), secs)
			case n > 0:
				fmt.Fprintf(p.w, "%s: %s (%.0fs)\n", p.what, humanBytes(n), secs)
			default:
				fmt.Fprintf(p.w, "%s (%.0fs)\n", p.what, secs)
			}
		}
	}
}

// reader counts what r yields.
func (p *progress) reader(r io.Reader) io.Reader { return &countingReader{r: r, n: &p.n} }

func (p *progress) elapsed() time.Duration { return time.Since(p.start) }

// stop ends the reports (idempotent).
func (p *progress) stop() {
	p.once.Do(func() { close(p.done) })
	p.wg.Wait()
}

type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.n.Add(int64(n))
	return n, err
}
