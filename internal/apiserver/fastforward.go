package apiserver

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/edgeproto"
	"github.com/warrenhq/warren/internal/iam"
)

// A fast-forward served by this API server: when a client resumes a
// trajectory whose sandbox is alive and every logged step will be replayed,
// and this is the only API server replica, the edge delegates the
// fast-forward to it (ResumeRequest.Delegate). Re-issued execs that equal
// the logged ones are answered here from a copy of the log, with no bus
// round trip; the first operation that is not (a different one, a file
// change, the end of the log) first tells the edge how far the client got
// (OpTrajAdvance) and then goes to the edge as usual, which answers it as
// it would have (divergence, live run).

// ffIdle drops a delegated fast-forward nobody used for this long (the
// edge lets another client resume after its own lease anyway).
const ffIdle = 2 * time.Minute

// maxFFSessions bounds the fast-forwards held at once.
const maxFFSessions = 4096

type ffSession struct {
	mu       sync.Mutex
	sandbox  string
	project  string // the sandbox's project: who may use the session
	steps    []api.TrajectoryStep
	cursor   int
	lastUsed time.Time
	done     bool
}

type ffSessions struct {
	mu sync.Mutex
	id string // this replica, as the edge knows it
	m  map[string]*ffSession
}

func newFFSessions() *ffSessions {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return &ffSessions{id: "api-" + hex.EncodeToString(b[:]), m: map[string]*ffSession{}}
}

func (f *ffSessions) get(id string) *ffSession {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m[id]
}

func (f *ffSessions) put(sess *ffSession) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.m) >= maxFFSessions {
		for k, v := range f.m {
			if time.Since(v.lastUsed) > ffIdle {
				delete(f.m, k)
			}
		}
	}
	if len(f.m) < maxFFSessions {
		f.m[sess.sandbox] = sess
	}
}

func (f *ffSessions) drop(sess *ffSession) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m[sess.sandbox] == sess {
		delete(f.m, sess.sandbox)
	}
}

// startFastForward takes over the fast-forward the edge delegated: it
// reads the log and keeps it (or hands the cursor back at once).
func (s *Server) startFastForward(ctx context.Context, sandbox, project, trajectory string, n int64) {
	steps, err := s.readSteps(ctx, trajectory)
	if err != nil || int64(len(steps)) != n {
		// Not the log the edge holds: let the edge serve it.
		s.advanceEdge(ctx, sandbox, 0)
		return
	}
	s.ff.put(&ffSession{sandbox: sandbox, project: project, steps: steps, lastUsed: time.Now()})
}

// readSteps returns every step of a log (duplicates of retried appends
// dropped, as the edge does).
func (s *Server) readSteps(ctx context.Context, name string) ([]api.TrajectoryStep, error) {
	raw, err := s.tlog.Read(ctx, name, 0, 0)
	if err != nil {
		return nil, err
	}
	out := make([]api.TrajectoryStep, 0, len(raw))
	for _, b := range raw {
		var st api.TrajectoryStep
		if err := json.Unmarshal(b, &st); err != nil {
			return nil, err
		}
		if k := len(out); k > 0 && st.Step <= out[k-1].Step {
			continue
		}
		out = append(out, st)
	}
	return out, nil
}

func (s *Server) advanceEdge(ctx context.Context, sandbox string, cursor int) error {
	return s.callEdge(context.WithoutCancel(ctx), sandbox, edgeproto.OpTrajAdvance,
		&edgeproto.AdvanceRequest{ID: sandbox, Delegate: s.ff.id, Cursor: cursor}, nil, nil)
}

// endFastForward hands a delegated fast-forward of sandbox back to its
// edge before an operation that goes there.
func (s *Server) endFastForward(ctx context.Context, sandbox string) error {
	sess := s.ff.get(sandbox)
	if sess == nil {
		return nil
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	return s.endLocked(ctx, sess)
}

func (s *Server) endLocked(ctx context.Context, sess *ffSession) error {
	if sess.done {
		return nil
	}
	sess.done = true
	s.ff.drop(sess)
	return s.advanceEdge(ctx, sess.sandbox, sess.cursor)
}

// fastForwardExec answers a re-issued exec from the delegated log: ok is
// false when it must go to the edge (after the fast-forward was handed
// back).
func (s *Server) fastForwardExec(ctx context.Context, sandbox string, x *api.ExecRequest) (*api.ExecResult, bool, error) {
	if x.Background {
		return nil, false, s.endFastForward(ctx, sandbox)
	}
	c := *x
	op := &api.TrajectoryStep{Op: "exec", Exec: &c}
	if c.Stdin != "" {
		op.StdinHash, op.Exec.Stdin = digest([]byte(c.Stdin)), ""
	}
	logged, ok, err := s.fastForward(ctx, sandbox, op)
	if !ok || err != nil {
		return nil, ok, err
	}
	if logged.Result == nil {
		return nil, false, &api.Error{Code: api.CodeInternal, Message: "logged exec without a result"}
	}
	r := *logged.Result
	r.Step, r.Replayed = logged.Step, true
	return &r, true, nil
}

// fastForwardFile answers a re-issued file operation (write, mkdir: with
// the logged file info; remove, rename: with the step only).
func (s *Server) fastForwardFile(ctx context.Context, sandbox string, op *api.TrajectoryStep) (*api.FileInfo, bool, error) {
	logged, ok, err := s.fastForward(ctx, sandbox, op)
	if !ok || err != nil {
		return nil, ok, err
	}
	fi := api.FileInfo{}
	if logged.File != nil {
		fi = *logged.File
	}
	fi.Step, fi.Replayed = logged.Step, true
	return &fi, true, nil
}

func digest(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// fastForward matches op against the next logged step of a delegated
// fast-forward: ok with the logged step (or its logged error), or not ok
// once the fast-forward was handed back to the edge.
func (s *Server) fastForward(ctx context.Context, sandbox string, op *api.TrajectoryStep) (*api.TrajectoryStep, bool, error) {
	sess := s.ff.get(sandbox)
	if sess == nil {
		return nil, false, nil
	}
	if p, _ := ctx.Value(principalKey{}).(*iam.Principal); p == nil || !p.Sees(iam.KindSandbox, sess.project) {
		return nil, false, nil // the edge answers (not found)
	}
	sess.mu.Lock()
	defer sess.mu.Unlock()
	if sess.done {
		return nil, false, nil
	}
	sess.lastUsed = time.Now()
	if sess.cursor < len(sess.steps) {
		logged := &sess.steps[sess.cursor]
		if edgeproto.SameOp(logged, op) && (logged.Op != "exec" || logged.Result != nil || logged.Error != nil) {
			sess.cursor++
			if sess.cursor == len(sess.steps) {
				// The end of the log: the edge takes over (and another
				// resume may start at once, as without delegation).
				if err := s.endLocked(ctx, sess); err != nil {
					s.log.Warn("end of a fast-forward", "sandbox", sandbox, "err", err)
				}
			}
			if logged.Error != nil {
				e := *logged.Error
				return nil, true, &e
			}
			return logged, true, nil
		}
	}
	return nil, false, s.endLocked(ctx, sess)
}
