package upload

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/agentproto"
)

// gotWrite is one write as the fake agent received it.
type gotWrite struct {
	req      agentproto.WriteRequest // as the agent decoded it (Data: what it wrote)
	raw      bool                    // sent as a payload (CallPayload)
	json     string                  // the request's JSON (the payload not in it)
	recorded bool                    // through Sandbox.Record
	ctxErr   error                   // its context's error when it ended
	start    int                     // the fake's clock when it arrived
	end      int                     // and when it ended
}

// fakeAgent is a sandbox's agent: its files, the writes it received in
// the order they arrived, how many were in flight at once. Each write
// takes delay and copies its data only at its end, so a buffer reused
// while its write is in flight shows in the file.
type fakeAgent struct {
	proto     int
	delay     time.Duration
	slowWrite int           // the slowWrite-th write to arrive (from 1) takes
	slowDelay time.Duration // this long instead
	failWrite int           // the failWrite-th write to arrive (from 1) fails
	failErr   error         // with this error

	mu          sync.Mutex
	clock       int
	files       map[string][]byte
	writes      []*gotWrite
	inFlight    int
	maxInFlight int
	closed      bool // the upload's temporary file was removed
	late        int  // writes in flight or arriving once closed
}

func newAgent(proto int) *fakeAgent {
	return &fakeAgent{proto: proto, files: map[string][]byte{}, failErr: &agentproto.Error{Code: agentproto.ErrNoSpace, Message: "disk full"}}
}

func (a *fakeAgent) Proto() int { return a.proto }

func (a *fakeAgent) Call(ctx context.Context, op string, body any, out any, _ func(*agentproto.Response) error) error {
	if op != agentproto.OpFileWrite {
		return fmt.Errorf("fake agent: unexpected op %s", op)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	var req agentproto.WriteRequest
	if err := json.Unmarshal(b, &req); err != nil {
		return err
	}
	return a.write(ctx, req, &gotWrite{json: string(b)})
}

func (a *fakeAgent) CallPayload(ctx context.Context, op string, body any, payload []byte, out any, _ func(*agentproto.Response) error) error {
	if op != agentproto.OpFileWrite {
		return fmt.Errorf("fake agent: unexpected op %s", op)
	}
	if a.proto < agentproto.ProtoPayload {
		return errors.New("fake agent: a payload to an agent that takes none")
	}
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req := *body.(*agentproto.WriteRequest)
	req.Data = payload
	return a.write(ctx, req, &gotWrite{raw: true, json: string(b)})
}

// write writes req as the agent would, after delay.
func (a *fakeAgent) write(ctx context.Context, req agentproto.WriteRequest, g *gotWrite) error {
	a.mu.Lock()
	a.clock++
	g.start = a.clock
	a.writes = append(a.writes, g)
	n := len(a.writes)
	a.inFlight++
	a.maxInFlight = max(a.maxInFlight, a.inFlight)
	if a.closed {
		a.late++
	}
	delay := a.delay
	if n == a.slowWrite {
		delay = a.slowDelay
	}
	a.mu.Unlock()
	time.Sleep(delay)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.clock++
	g.end = a.clock
	a.inFlight--
	if a.closed {
		a.late++
	}
	g.ctxErr = ctx.Err()
	req.Data = bytes.Clone(req.Data)
	g.req = req
	if n == a.failWrite {
		return a.failErr
	}
	f, ok := a.files[req.Path]
	switch {
	case req.At:
		if !ok {
			return &agentproto.Error{Code: agentproto.ErrNotFound, Message: req.Path}
		}
		if end := int(req.Offset) + len(req.Data); end > len(f) {
			f = append(f, make([]byte, end-len(f))...)
		}
		copy(f[req.Offset:], req.Data)
	case req.Append:
		f = append(f, req.Data...)
	default:
		f = req.Data
	}
	a.files[req.Path] = f
	return nil
}

// agentErr is an agent's error as the fake core turns it into the API's.
type agentErr struct{ err error }

func (e *agentErr) Error() string { return "agent: " + e.err.Error() }
func (e *agentErr) Unwrap() error { return e.err }

// fakeSandbox is a sandbox of the core, its state under its agent's lock.
type fakeSandbox struct {
	agent      *fakeAgent
	recorded   bool
	acquireErr error

	// under agent.mu
	waited           bool
	acquired         int
	released         int
	ops              []string // removals, renames, stats in order
	inFlightAtRemove int
	inFlightAtRename int
	removeCtxErr     error
	removeDeadline   time.Duration // how far off the removal's deadline was
}

func newSandbox(a *fakeAgent) *fakeSandbox {
	return &fakeSandbox{agent: a, inFlightAtRemove: -1, inFlightAtRename: -1}
}

func (s *fakeSandbox) lock() func() {
	s.agent.mu.Lock()
	return s.agent.mu.Unlock
}

func (s *fakeSandbox) Wait() {
	defer s.lock()()
	s.waited = true
}

func (s *fakeSandbox) Recorded() bool { return s.recorded }

func (s *fakeSandbox) Acquire() (Agent, func(), error) {
	if s.acquireErr != nil {
		return nil, nil, s.acquireErr
	}
	defer s.lock()()
	s.acquired++
	return s.agent, func() {
		defer s.lock()()
		s.released++
	}, nil
}

func (s *fakeSandbox) AgentError(err error) error { return &agentErr{err} }

func (s *fakeSandbox) Record(ctx context.Context, w *Write) error {
	return s.agent.write(ctx, agentproto.WriteRequest{Path: w.Path, Mode: w.Mode, Data: w.Data, Append: w.Append}, &gotWrite{recorded: true})
}

func (s *fakeSandbox) Remove(ctx context.Context, path string) error {
	defer s.lock()()
	s.agent.closed = true
	s.inFlightAtRemove = s.agent.inFlight
	s.removeCtxErr = ctx.Err()
	if d, ok := ctx.Deadline(); ok {
		s.removeDeadline = time.Until(d)
	}
	s.ops = append(s.ops, "remove "+path)
	delete(s.agent.files, path)
	return nil
}

func (s *fakeSandbox) Rename(ctx context.Context, from, to string) error {
	defer s.lock()()
	s.inFlightAtRename = s.agent.inFlight
	s.ops = append(s.ops, "rename "+from+" "+to)
	f, ok := s.agent.files[from]
	if !ok {
		return &api.Error{Code: api.CodeNotFound, Message: from}
	}
	delete(s.agent.files, from)
	s.agent.files[to] = f
	return nil
}

func (s *fakeSandbox) Stat(ctx context.Context, path string) (*api.FileInfo, error) {
	defer s.lock()()
	s.ops = append(s.ops, "stat "+path)
	f, ok := s.agent.files[path]
	if !ok {
		return nil, &api.Error{Code: api.CodeNotFound, Message: path}
	}
	return &api.FileInfo{Path: path, Size: int64(len(f)), Type: "file"}, nil
}

// fakeHost is the core with the one sandbox sb.
type fakeHost struct{ sb *fakeSandbox }

func (h fakeHost) Lookup(id string) (Sandbox, error) {
	if id != "sb-1" {
		return nil, &api.Error{Code: api.CodeNotFound, Message: fmt.Sprintf("sandbox %s not found", id)}
	}
	return h.sb, nil
}

// brokenReader reads r, then fails with err (after calling before).
type brokenReader struct {
	r      io.Reader
	err    error
	before func()
}

func (b *brokenReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		if b.before != nil {
			b.before()
			b.before = nil
		}
		return n, b.err
	}
	return n, err
}

// run uploads data from in to target of sb and checks what is true of
// every upload, whether it succeeds or fails: the sandbox was waited
// for, every acquired agent released, every write aimed at one
// temporary name beside target and not outliving the upload, none
// cancelled. It returns the temporary name ("" when none was written).
func run(t *testing.T, sb *fakeSandbox, target string, in io.Reader) (fi *api.FileInfo, tmp string, err error) {
	t.Helper()
	return runCtx(context.Background(), t, sb, target, in)
}

func runCtx(ctx context.Context, t *testing.T, sb *fakeSandbox, target string, in io.Reader) (fi *api.FileInfo, tmp string, err error) {
	t.Helper()
	fi, err = File(ctx, fakeHost{sb}, "sb-1", target, testMode, in)
	checkAfter(t, sb)
	return fi, tempOf(t, sb, target), err
}

// testMode is the mode every upload of the tests asks for.
const testMode = 0o640

func checkAfter(t *testing.T, sb *fakeSandbox) {
	t.Helper()
	a := sb.agent
	defer sb.lock()()
	if !sb.waited {
		t.Error("the upload did not wait for the sandbox's creation")
	}
	if sb.acquired != sb.released {
		t.Errorf("agent acquired %d times, released %d", sb.acquired, sb.released)
	}
	if a.inFlight != 0 {
		t.Errorf("%d writes still in flight when the upload answered", a.inFlight)
	}
	if a.late != 0 {
		t.Errorf("%d writes arrived or ran on after the temporary file's removal", a.late)
	}
	for i, w := range a.writes {
		if w.ctxErr != nil {
			t.Errorf("write %d: context %v: a write is not cancelled with its upload", i, w.ctxErr)
		}
		if w.req.Mode != testMode {
			t.Errorf("write %d: mode %o, want %o", i, w.req.Mode, testMode)
		}
	}
}

// tempOf is the name the writes of sb went to, checked to be one
// temporary name beside target.
func tempOf(t *testing.T, sb *fakeSandbox, target string) string {
	t.Helper()
	defer sb.lock()()
	tmp := ""
	for i, w := range sb.agent.writes {
		if tmp == "" {
			tmp = w.req.Path
		}
		if w.req.Path != tmp {
			t.Errorf("write %d to %s, the first to %s", i, w.req.Path, tmp)
		}
	}
	beside := regexp.MustCompile("^" + regexp.QuoteMeta(path.Join(path.Dir(target), ".warren-upload-")) + "[0-9a-f]{12}$")
	if tmp != "" && !beside.MatchString(tmp) {
		t.Errorf("written to %s: not a temporary name beside %s", tmp, target)
	}
	return tmp
}
