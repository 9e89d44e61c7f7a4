package fake

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/runtime"
)

// Agent is a fake sandbox's agent: it answers the agent protocol from
// memory. Files live in a map; exec understands a few commands (see
// runCommand) and runs nothing. It serves any number of channels at once
// (one per Start or Attach), as the real agent does.
type Agent struct {
	handle   runtime.Handle
	priority string // the spec's, set at start (ClassCap)

	mu     sync.Mutex
	env    map[string]string
	files  map[string][]byte // clean absolute path -> content
	conns  map[net.Conn]struct{}
	frozen chan struct{} // non-nil while frozen; closed by thaw
	dead   bool
	execs  int

	// Writes in flight (file.write): their delay, the most at once.
	writeDelay       time.Duration
	writing, maxWrit int
	writes, failFrom int // file.write requests answered; fail from this one on (0: never)
}

// FailWritesFrom makes the n-th file.write and every later one fail
// (no_space), as a full disk does.
func (a *Agent) FailWritesFrom(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.failFrom = n
}

// SetWriteDelay makes each file.write take d (before it writes), so that
// a test sees how many an upload keeps in flight.
func (a *Agent) SetWriteDelay(d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.writeDelay = d
}

// MaxWritesInFlight is the most file.write requests served at once.
func (a *Agent) MaxWritesInFlight() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.maxWrit
}

func newAgent(h runtime.Handle, spec *runtime.Spec) *Agent {
	return &Agent{handle: h, priority: spec.Priority, env: copyEnv(spec.Env), files: map[string][]byte{}, conns: map[net.Conn]struct{}{}}
}

func copyEnv(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Execs is how many exec requests the agent answered.
func (a *Agent) Execs() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.execs
}

// Frozen reports whether the agent is frozen.
func (a *Agent) Frozen() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.frozen != nil
}

// File returns the content of a file of the sandbox.
func (a *Agent) File(p string) ([]byte, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.files[path.Clean("/"+p)]
	return b, ok
}

func (a *Agent) setFrozen(on bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case on && a.frozen == nil:
		a.frozen = make(chan struct{})
	case !on && a.frozen != nil:
		close(a.frozen)
		a.frozen = nil
	}
}

// thawed waits while the agent is frozen.
func (a *Agent) thawed(ctx context.Context) error {
	for {
		a.mu.Lock()
		ch := a.frozen
		a.mu.Unlock()
		if ch == nil {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (a *Agent) wipe() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.files = map[string][]byte{}
}

func (a *Agent) resume(spec *runtime.Spec) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.env = copyEnv(spec.Env)
}

// kill closes every channel: the agent is gone.
func (a *Agent) kill() {
	a.mu.Lock()
	a.dead = true
	conns := a.conns
	a.conns = map[net.Conn]struct{}{}
	if a.frozen != nil {
		close(a.frozen)
		a.frozen = nil
	}
	a.mu.Unlock()
	for c := range conns {
		_ = c.Close()
	}
}

// dial opens a channel to the agent.
func (a *Agent) dial() (*agentproto.Client, error) {
	client, server := pipe()
	a.mu.Lock()
	if a.dead {
		a.mu.Unlock()
		return nil, runtime.ErrGone
	}
	a.conns[server] = struct{}{}
	a.mu.Unlock()
	go a.serve(server)
	return agentproto.NewClient(client), nil
}

// serve answers the requests of one channel until it closes.
func (a *Agent) serve(conn net.Conn) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wmu sync.Mutex
	var wg sync.WaitGroup
	defer wg.Wait()
	calls := map[uint64]context.CancelFunc{}
	var cmu sync.Mutex
	for {
		req := new(agentproto.Request)
		if err := agentproto.ReadRequest(conn, req); err != nil {
			break
		}
		switch req.Op {
		case agentproto.OpCancel:
			var c agentproto.CancelRequest
			if json.Unmarshal(req.Body, &c) == nil {
				cmu.Lock()
				if f := calls[c.ID]; f != nil {
					f()
				}
				cmu.Unlock()
			}
			continue
		case agentproto.OpCredit:
			continue // answers are small: the window is never used up
		}
		cctx, ccancel := context.WithCancel(ctx)
		cmu.Lock()
		calls[req.ID] = ccancel
		cmu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() {
				cmu.Lock()
				delete(calls, req.ID)
				cmu.Unlock()
				ccancel()
			}()
			out := &writer{conn: conn, mu: &wmu, id: req.ID, binary: req.Binary}
			out.finish(a.handle1(cctx, req, out))
		}()
	}
	cancel()
	_ = conn.Close()
	a.mu.Lock()
	delete(a.conns, conn)
	a.mu.Unlock()
}

// writer sends the frames of one call.
type writer struct {
	conn   net.Conn
	mu     *sync.Mutex
	id     uint64
	binary bool
}

func (w *writer) chunk(stream string, data []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.binary {
		_ = agentproto.WriteChunk(w.conn, w.id, stream, data)
		return
	}
	_ = agentproto.WriteFrame(w.conn, &agentproto.Response{ID: w.id, Kind: agentproto.KindChunk, Stream: stream, Data: data})
}

func (w *writer) finish(body any, err error) {
	r := &agentproto.Response{ID: w.id, Kind: agentproto.KindDone}
	if err != nil {
		r.Kind = agentproto.KindError
		ae, ok := err.(*agentproto.Error)
		if !ok {
			ae = &agentproto.Error{Code: agentproto.ErrInternal, Message: err.Error()}
		}
		r.Error = ae
	} else if body != nil {
		raw, merr := json.Marshal(body)
		if merr != nil {
			r.Kind, r.Error = agentproto.KindError, &agentproto.Error{Code: agentproto.ErrInternal, Message: merr.Error()}
		}
		r.Body = raw
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	_ = agentproto.WriteFrame(w.conn, r)
}

func invalid(format string, a ...any) error {
	return &agentproto.Error{Code: agentproto.ErrInvalid, Message: fmt.Sprintf(format, a...)}
}

func notFound(p string) error {
	return &agentproto.Error{Code: agentproto.ErrNotFound, Message: p + ": no such file or directory"}
}

// handle1 answers one request: the done body, or an error.
func (a *Agent) handle1(ctx context.Context, req *agentproto.Request, out *writer) (any, error) {
	if err := a.thawed(ctx); err != nil {
		return nil, err
	}
	switch req.Op {
	case agentproto.OpSetup:
		return &agentproto.SetupResult{Pid: a.handle.Pid, Proto: agentproto.Proto}, nil
	case agentproto.OpPing:
		return &agentproto.PingResult{Proto: agentproto.Proto}, nil
	case agentproto.OpExec:
		var r agentproto.ExecRequest
		if err := json.Unmarshal(req.Body, &r); err != nil {
			return nil, invalid("malformed exec: %v", err)
		}
		return a.exec(ctx, &r, out)
	case agentproto.OpFileWrite:
		var r agentproto.WriteRequest
		if err := json.Unmarshal(req.Body, &r); err != nil {
			return nil, invalid("malformed write: %v", err)
		}
		if r.Data == nil {
			r.Data = req.Payload
		}
		return a.write(ctx, &r)
	case agentproto.OpFileRead:
		var r agentproto.PathRequest
		if err := json.Unmarshal(req.Body, &r); err != nil {
			return nil, invalid("malformed read: %v", err)
		}
		b, ok := a.File(r.Path)
		if !ok {
			return nil, notFound(r.Path)
		}
		if len(b) > 0 {
			out.chunk(agentproto.StreamData, b)
		}
		return fileInfo(path.Clean("/"+r.Path), len(b)), nil
	case agentproto.OpFileStat:
		var r agentproto.PathRequest
		if err := json.Unmarshal(req.Body, &r); err != nil {
			return nil, invalid("malformed stat: %v", err)
		}
		b, ok := a.File(r.Path)
		if !ok {
			return nil, notFound(r.Path)
		}
		return fileInfo(path.Clean("/"+r.Path), len(b)), nil
	case agentproto.OpFileList:
		var r agentproto.PathRequest
		if err := json.Unmarshal(req.Body, &r); err != nil {
			return nil, invalid("malformed list: %v", err)
		}
		return a.list(r.Path), nil
	case agentproto.OpFileRemove:
		var r agentproto.RemoveRequest
		if err := json.Unmarshal(req.Body, &r); err != nil {
			return nil, invalid("malformed remove: %v", err)
		}
		return a.remove(&r)
	case agentproto.OpFileRename:
		var r agentproto.RenameRequest
		if err := json.Unmarshal(req.Body, &r); err != nil {
			return nil, invalid("malformed rename: %v", err)
		}
		return a.rename(&r)
	case agentproto.OpReset, agentproto.OpWipe, agentproto.OpReroot, agentproto.OpResume:
		return nil, nil
	}
	return nil, invalid("fake agent: operation %q is not supported", req.Op)
}

// remove removes the file r names (file.remove).
func (a *Agent) remove(r *agentproto.RemoveRequest) (any, error) {
	p := path.Clean("/" + r.Path)
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.files[p]; !ok {
		return nil, notFound(r.Path)
	}
	delete(a.files, p)
	return nil, nil
}

// rename moves the file at r.From to r.To (file.rename).
func (a *Agent) rename(r *agentproto.RenameRequest) (any, error) {
	from, to := path.Clean("/"+r.From), path.Clean("/"+r.To)
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.files[from]
	if !ok {
		return nil, notFound(r.From)
	}
	delete(a.files, from)
	a.files[to] = b
	return nil, nil
}

func fileInfo(p string, size int) *agentproto.FileInfo {
	return &agentproto.FileInfo{Name: path.Base(p), Path: p, Size: int64(size), Mode: 0o644, Type: "file", ModTime: time.Unix(0, 0).UTC()}
}

func (a *Agent) write(ctx context.Context, r *agentproto.WriteRequest) (any, error) {
	if r.Path == "" {
		return nil, invalid("no path")
	}
	p := path.Clean("/" + r.Path)
	a.mu.Lock()
	a.writing++
	a.maxWrit = max(a.maxWrit, a.writing)
	d := a.writeDelay
	a.mu.Unlock()
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.writing--
	if a.writes++; a.failFrom > 0 && a.writes >= a.failFrom {
		return nil, &agentproto.Error{Code: agentproto.ErrNoSpace, Message: p + ": no space left on device"}
	}
	if r.At {
		old, ok := a.files[p]
		if !ok {
			return nil, notFound(p)
		}
		if end := r.Offset + int64(len(r.Data)); end > int64(len(old)) {
			old = append(old, make([]byte, end-int64(len(old)))...)
		}
		copy(old[r.Offset:], r.Data)
		a.files[p] = old
		return fileInfo(p, len(old)), nil
	}
	b := append([]byte(nil), r.Data...)
	if r.Append {
		b = append(append([]byte(nil), a.files[p]...), r.Data...)
	}
	a.files[p] = b
	return fileInfo(p, len(b)), nil
}

func (a *Agent) list(dir string) *agentproto.FileList {
	d := path.Clean("/" + dir)
	a.mu.Lock()
	defer a.mu.Unlock()
	out := &agentproto.FileList{Files: []agentproto.FileInfo{}}
	for p, b := range a.files {
		if path.Dir(p) == d {
			out.Files = append(out.Files, *fileInfo(p, len(b)))
		}
	}
	sort.Slice(out.Files, func(i, j int) bool { return out.Files[i].Path < out.Files[j].Path })
	return out
}

// exec runs one command of the fake's little language: "true", "false",
// "exit N", "echo WORDS" (with $NAME expanded), "cat PATH" and "sleep SECONDS"
// (which a cancel or the request's timeout ends, exit code 137). Output is
// collected or sent in chunks as the request asks.
func (a *Agent) exec(ctx context.Context, r *agentproto.ExecRequest, out *writer) (any, error) {
	a.mu.Lock()
	a.execs++
	a.mu.Unlock()
	argv := r.Argv
	if len(argv) == 0 {
		argv = strings.Fields(r.Cmd)
	}
	if len(argv) == 0 {
		return nil, invalid("no command")
	}
	t0 := time.Now()
	res := &agentproto.ExecResult{}
	var stdout, stderr []byte
	switch argv[0] {
	case "true":
	case "false":
		res.ExitCode = 1
	case "exit":
		if len(argv) > 1 {
			res.ExitCode, _ = strconv.Atoi(argv[1])
		}
	case "echo":
		a.mu.Lock()
		line := os.Expand(strings.Join(argv[1:], " "), func(k string) string { return a.env[k] })
		a.mu.Unlock()
		stdout = []byte(line + "\n")
	case "cat":
		for _, p := range argv[1:] {
			b, ok := a.File(p)
			if !ok {
				stderr = append(stderr, "cat: "+p+": No such file or directory\n"...)
				res.ExitCode = 1
				continue
			}
			stdout = append(stdout, b...)
		}
	case "sleep":
		secs := 0.0
		if len(argv) > 1 {
			secs, _ = strconv.ParseFloat(argv[1], 64)
		}
		if r.Timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, r.Timeout)
			defer cancel()
		}
		select {
		case <-time.After(time.Duration(secs * float64(time.Second))):
		case <-ctx.Done():
			res.ExitCode, res.Signal = 137, "SIGKILL"
			res.TimedOut = r.Timeout > 0 && ctx.Err() == context.DeadlineExceeded
		}
	default:
		stderr = []byte(argv[0] + ": command not found\n")
		res.ExitCode = 127
	}
	if r.Collect {
		res.Stdout, res.Stderr = stdout, stderr
	} else {
		if len(stdout) > 0 {
			out.chunk(agentproto.StreamStdout, stdout)
		}
		if len(stderr) > 0 {
			out.chunk(agentproto.StreamStderr, stderr)
		}
	}
	res.Duration = float64(time.Since(t0).Microseconds()) / 1000
	return res, nil
}
