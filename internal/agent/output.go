package agent

import (
	"errors"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
)

// coalesce is how long a pump waits for more output after a short read.
const coalesce = 300 * time.Microsecond

// A stream reads into a small buffer until a read fills it, then into a
// chunk-sized one: most commands print little, and a 256 KiB buffer per
// stream per command (zeroed again after each GC empties the pool) would
// cost more than the command.
const smallBuf = 16 << 10

var (
	smallBufPool = sync.Pool{New: func() any { b := make([]byte, smallBuf); return &b }}
	bufPool      = sync.Pool{New: func() any { b := make([]byte, agentproto.ChunkSize); return &b }}
)

// readHook, when a test sets it, runs right after each read from a pipe
// (with holding set: the moment a loaded machine may deschedule the reader).
var readHook func()

// outStream drains one output pipe until EOF. Up to limit bytes go to emit;
// the rest is read and dropped (truncated). After detach nothing more is
// emitted, but the pipe is still drained so writers never block.
type outStream struct {
	name  string
	f     *os.File
	limit int64
	emit  func(stream string, b []byte)
	// batch: no waiting for more after a short read (output that is
	// collected into the result, not sent in chunks as it comes).
	batch bool

	holding atomic.Bool // read data not yet delivered

	mu        sync.Mutex
	n         int64
	truncated bool
	detached  bool
	done      chan struct{}
}

func newOutStream(name string, f *os.File, limit int64, emit func(string, []byte), batch bool) *outStream {
	o := &outStream{name: name, f: f, limit: limit, emit: emit, batch: batch, done: make(chan struct{})}
	go o.run()
	return o
}

func (o *outStream) run() {
	defer close(o.done)
	defer o.f.Close()
	rc, err := o.f.SyscallConn()
	if err != nil {
		return
	}
	pool := &smallBufPool
	bp := pool.Get().(*[]byte)
	defer func() { pool.Put(bp) }()
	buf := *bp
	for {
		n, err := o.read(rc, buf, false)
		if n == len(buf) && pool == &smallBufPool {
			// Plenty of output: keep what was read, go on in a big buffer.
			big := bufPool.Get().(*[]byte)
			n = copy(*big, buf[:n])
			pool.Put(bp)
			pool, bp, buf = &bufPool, big, *big
		}
		if err == nil && n < len(buf) && !o.batch {
			// Coalesce small writes for a short while.
			_ = o.f.SetReadDeadline(time.Now().Add(coalesce))
			for n < len(buf) {
				m, e := o.read(rc, buf[n:], true)
				n += m
				if e != nil {
					if !errors.Is(e, os.ErrDeadlineExceeded) {
						err = e
					}
					break
				}
			}
			_ = o.f.SetReadDeadline(time.Time{})
		}
		if n > 0 {
			o.deliver(buf[:n])
		}
		o.holding.Store(false)
		if err != nil {
			return
		}
	}
}

// read reads once from the pipe, waiting for data. holding is set before
// the read, so a byte taken from the pipe is accounted for from that moment
// until run delivers it (see pending); it is set back to held when there
// was nothing to read. The end of the pipe is io.EOF.
func (o *outStream) read(rc syscall.RawConn, buf []byte, held bool) (int, error) {
	var n int
	var err error
	werr := rc.Read(func(fd uintptr) bool {
		o.holding.Store(true)
		for {
			n, err = unix.Read(int(fd), buf)
			if err != unix.EINTR {
				break
			}
		}
		if readHook != nil {
			readHook()
		}
		if err == unix.EAGAIN {
			o.holding.Store(held)
			return false // wait until the pipe is readable
		}
		return true
	})
	switch {
	case werr != nil:
		return 0, werr // the read deadline, or the file closed
	case err != nil:
		return 0, err
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

func (o *outStream) deliver(b []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.detached {
		return
	}
	if room := o.limit - o.n; int64(len(b)) > room {
		o.truncated = true
		if room <= 0 {
			return
		}
		b = b[:room]
	}
	o.n += int64(len(b))
	o.emit(o.name, b)
}

// detach stops emitting; it returns whether output was truncated.
func (o *outStream) detach() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.detached = true
	return o.truncated
}

// pending reports whether output is still on its way: bytes in the pipe, or
// read but not yet delivered.
func (o *outStream) pending() bool {
	// The pipe first, then holding: output written before this call is
	// in the pipe, or was taken by a read that set holding before it took
	// it and clears it only once the output is delivered.
	rc, err := o.f.SyscallConn()
	if err != nil {
		return o.holding.Load()
	}
	n := 0
	// TIOCINQ is FIONREAD: the bytes waiting in the pipe.
	_ = rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) })
	return n > 0 || o.holding.Load()
}
