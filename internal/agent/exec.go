package agent

import (
	"bytes"
	"context"
	"os"
	"path"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
)

const (
	defaultOutputCap = 16 << 20
	// bgOutputMax bounds what a background command keeps per stream, so its
	// ProcStatus fits one frame.
	bgOutputMax = 2 << 20
	// drainGrace is how long an exec waits, after its process ended, for
	// descendants that still hold its stdout/stderr (daemons started with &).
	drainGrace = 50 * time.Millisecond
	drainMax   = 5 * time.Second
	// stateWait bounds the wait for the shell's state report after exit.
	stateWait = 20 * time.Millisecond
)

// running is one started command.
type running struct {
	pid   int
	exit  <-chan exitInfo
	start time.Time
	outs  []*outStream
	stdin *os.File // nil in a live shell
	state *os.File // a fresh shell's state report; nil for argv commands

	// A command in a live shell (see liveshell.go).
	live       *liveShell
	sess       *session
	reports    <-chan []byte // the live shell's state reports
	token      string        // marks this command's report
	keep       []int         // our writers of its output FIFOs
	fifoDir    int           // the live shells' FIFO directory (fifos are in it)
	fifos      []string
	startTicks uint64
	session    bool // leads a session of its own (a terminal): killed whole
	sawExit    bool // finish received the shell's exit
	pooled     bool // a fresh shell: the warm pool is topped up after it

	mu       sync.Mutex
	exited   bool
	timedOut bool
	timer    *time.Timer
}

// execPlan is a validated exec request.
type execPlan struct {
	req      *agentproto.ExecRequest
	sess     *session
	cred     *credential
	env      map[string]string
	prior    map[string]string
	injected map[string]string
	cwd      string
	limit    int64
	collect  bool // the output goes into the result (req.Collect)
}

// plan validates req and works out what it runs with: the user, the
// session, the environment (the session's, with what the request and the
// agent inject) and the working directory.
func (a *Agent) plan(req *agentproto.ExecRequest) (*execPlan, error) {
	if err := checkCommand(req); err != nil {
		return nil, err
	}
	var tkPath string
	if req.Trusted {
		if a.split == nil && !a.cfg.Unconfined {
			return nil, errf(agentproto.ErrInvalid, "exec: trusted: this node cannot isolate trusted commands (no cgroup v2 hierarchy)")
		}
		tr, path, err := a.trustedRequest(req)
		if err != nil {
			return nil, err
		}
		req, tkPath = tr, path
	}
	p := &execPlan{req: req, limit: req.OutputCap, injected: make(map[string]string), collect: req.Collect && !req.Background}
	if p.limit <= 0 {
		p.limit = defaultOutputCap
	}
	p.cred = a.defUser
	if req.User != "" {
		c, err := resolveUser(a.root, req.User)
		if err != nil {
			return nil, err
		}
		p.cred = c
	}
	p.sess = a.sessions.get(req.Session)
	if req.Trusted {
		p.sess = &session{} // nothing a session exported reaches a trusted command
	}
	env, cwd := p.sess.snapshot(a.baseEnv)
	home, name := "/root", "root"
	if p.cred != nil {
		home, name = p.cred.home, p.cred.name
	}
	if err := p.setEnv(env, home, name, tkPath); err != nil {
		return nil, err
	}
	c, err := a.workDir(req.Cwd, cwd, home)
	if err != nil {
		return nil, err
	}
	p.cwd = c
	return p, nil
}

// checkCommand refuses a request that does not set exactly one of cmd and
// argv, or whose command holds a NUL byte.
func checkCommand(req *agentproto.ExecRequest) error {
	if (req.Cmd == "") == (len(req.Argv) == 0) {
		return errf(agentproto.ErrInvalid, "exec: exactly one of cmd and argv must be set")
	}
	if strings.IndexByte(req.Cmd, 0) >= 0 {
		return errf(agentproto.ErrInvalid, "exec: cmd contains a NUL byte")
	}
	for _, s := range req.Argv {
		if strings.IndexByte(s, 0) >= 0 {
			return errf(agentproto.ErrInvalid, "exec: argv contains a NUL byte")
		}
	}
	return nil
}

// setEnv makes the plan's environment from the session's env (kept as
// p.prior; a trusted command gets none of what is unsafe for it): HOME,
// USER and LOGNAME from the user's home and name when env lacks them, the
// request's variables, and for a trusted command tkPath ahead of PATH.
// What it adds is also kept in p.injected.
func (p *execPlan) setEnv(env map[string]string, home, name, tkPath string) error {
	req := p.req
	p.prior = env
	p.env = make(map[string]string, len(env)+4)
	for k, v := range env {
		if !req.Trusted || !unsafeForTrusted(k) {
			p.env[k] = v
		}
	}
	inject := func(k, v string) {
		p.env[k] = v
		p.injected[k] = v
	}
	if _, ok := p.env["HOME"]; !ok {
		inject("HOME", home)
	}
	if _, ok := p.env["USER"]; !ok && name != "" {
		inject("USER", name)
		inject("LOGNAME", name)
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return errf(agentproto.ErrInvalid, "exec: bad environment variable %q", k)
		}
		inject(k, v)
	}
	if req.Trusted {
		inject("PATH", tkPath+":"+p.env["PATH"])
	}
	return nil
}

// workDir is the directory a command starts in: the one it asked for
// (which must be a directory), else the session's, the image's WORKDIR,
// the user's home or /, the first of them that is a directory.
func (a *Agent) workDir(asked, session, home string) (string, error) {
	switch {
	case asked != "":
		c, err := cleanPath(asked)
		if err != nil {
			return "", err
		}
		if !isDir(c) {
			return "", errf(agentproto.ErrNotFound, "exec: cwd %s is not a directory", c)
		}
		return c, nil
	case session != "" && isDir(session):
		return session, nil
	case a.cfg.Cwd != "" && isDir(a.cfg.Cwd):
		return a.cfg.Cwd, nil // the image's WORKDIR
	case isDir(home):
		return home, nil
	default:
		return "/", nil
	}
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// exec runs a command in the foreground (streaming its output as chunks) or
// in the background.
func (a *Agent) exec(ctx context.Context, cl *call, req *agentproto.ExecRequest) (any, error) {
	if req.PTY != nil && req.Cmd == "" && len(req.Argv) == 0 {
		r := *req
		r.Argv = []string{a.shell} // an interactive shell
		req = &r
	}
	p, err := a.plan(req)
	if err != nil {
		return nil, err
	}
	if req.PTY != nil || req.LiveStdin {
		return a.execLive(cl, p)
	}
	release := func() {}
	if req.Trusted {
		if release, err = a.isolate(); err != nil {
			return nil, err
		}
	}
	if req.Background {
		bg := a.procs.add()
		limit := min(p.limit, bgOutputMax)
		r, err := a.start(p, limit, bg.emit)
		if err != nil {
			release()
			a.procs.drop(bg.id)
			return nil, err
		}
		bg.started(r)
		go func() {
			res := a.finish(p, r)
			release()
			a.procs.finished(bg, res)
		}()
		return &agentproto.ExecResult{CommandID: bg.id}, nil
	}
	emit := func(stream string, b []byte) { _ = cl.chunk(stream, b) }
	var col *collector
	if req.Collect {
		col = &collector{cl: cl}
		emit = col.emit
	}
	r, err := a.start(p, p.limit, emit)
	if err != nil {
		release()
		return nil, err
	}
	// A caller that goes away (OpCancel) takes its command with it.
	stop := context.AfterFunc(cl.withdrawn, r.abort)
	defer stop()
	res := a.finish(p, r)
	release()
	if col != nil {
		col.into(res)
	}
	return res, nil
}

// collector keeps an exec's output for its result (Collect), until there is
// more than CollectMax: then what it has and the rest go in chunks.
type collector struct {
	cl        *call
	mu        sync.Mutex
	out, err  []byte
	streaming bool
}

func (c *collector) emit(stream string, b []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.streaming && len(c.out)+len(c.err)+len(b) <= agentproto.CollectMax {
		if stream == agentproto.StreamStderr {
			c.err = append(c.err, b...)
		} else {
			c.out = append(c.out, b...)
		}
		return
	}
	if !c.streaming {
		c.streaming = true
		if len(c.out) > 0 {
			_ = c.cl.chunk(agentproto.StreamStdout, c.out)
		}
		if len(c.err) > 0 {
			_ = c.cl.chunk(agentproto.StreamStderr, c.err)
		}
		c.out, c.err = nil, nil
	}
	_ = c.cl.chunk(stream, b)
}

// into puts the kept output in the result (finish has detached the
// streams: nothing is emitted any more).
func (c *collector) into(res *agentproto.ExecResult) {
	c.mu.Lock()
	defer c.mu.Unlock()
	res.Stdout, res.Stderr = c.out, c.err
}

// start launches the planned command; output goes to emit.
func (a *Agent) start(p *execPlan, limit int64, emit func(string, []byte)) (*running, error) {
	if p.req.Cmd != "" {
		return a.startShell(p, limit, emit)
	}
	return a.startArgv(p, limit, emit)
}

func (a *Agent) startShell(p *execPlan, limit int64, emit func(string, []byte)) (*running, error) {
	if ls := a.takeZygote(p); ls != nil {
		r, err := a.startLiveCommand(p, ls, limit, emit)
		if err == nil {
			return r, nil
		}
		a.putZygote(ls) // the zygote is fine; this command takes a fresh shell
		if err != errLiveUnfit {
			a.log.Warn("agent: zygote command", "err", err)
		}
	}
	if ls := a.takeLive(p); ls != nil {
		r, err := a.startLiveCommand(p, ls, limit, emit)
		if err == nil {
			return r, nil
		}
		a.putLive(p.sess, ls) // the shell is fine; this command takes a fresh one
		if err != errLiveUnfit {
			a.log.Warn("agent: live shell command", "err", err)
		}
	}
	// Taken before the fork: a command that ends at once is reaped (its
	// end stamped) before the fork returns, and its duration was negative.
	t0 := time.Now()
	var sp *shellProc
	var script string
	if a.pool != nil {
		if sp = a.pool.get(p.cred); sp != nil {
			s, ok := buildScript(sp.spawned, sp.dir, p.env, p.cwd, p.req.Cmd)
			if ok {
				script = s
			} else {
				a.pool.discard(sp)
				sp = nil
			}
		}
	}
	if sp == nil {
		s, _ := buildScript(p.env, p.cwd, p.env, p.cwd, p.req.Cmd)
		var err error
		if a.dotOK {
			sp, err = a.spawnShell(a.shell, p.env, p.cwd, p.cred, "")
		} else {
			sp, err = a.spawnShell(a.shell, p.env, p.cwd, p.cred, s)
		}
		if err != nil {
			return nil, fsErr("exec", a.shell, err)
		}
		script = s
	}
	r := &running{pid: sp.pid, exit: sp.exit, start: t0, stdin: sp.stdin, state: sp.state, pooled: a.pool != nil}
	r.armTimeout(p.req.Timeout)
	if sp.script >= 0 {
		_ = writeAll(sp.script, []byte(script))
		unix.Close(sp.script)
		sp.script = -1
	}
	r.feedStdin(p.req.Stdin)
	r.outs = []*outStream{
		newOutStream(agentproto.StreamStdout, sp.stdout, limit, emit, p.collect),
		newOutStream(agentproto.StreamStderr, sp.stderr, limit, emit, p.collect),
	}
	return r, nil
}

func (a *Agent) startArgv(p *execPlan, limit int64, emit func(string, []byte)) (*running, error) {
	r, err := a.startArgvOpen(p, limit, emit)
	if err != nil {
		return nil, err
	}
	r.feedStdin(p.req.Stdin)
	return r, nil
}

// startArgvOpen starts an argv command with its stdin open (r.stdin).
func (a *Agent) startArgvOpen(p *execPlan, limit int64, emit func(string, []byte)) (*running, error) {
	bin, err := lookPath(p.req.Argv[0], p.env["PATH"])
	if err != nil {
		return nil, err
	}
	var fds []int
	defer func() { closeAll(fds...) }()
	inR, inW, err := pipe()
	if err != nil {
		return nil, fsErr("exec", bin, err)
	}
	fds = append(fds, inR)
	stdin := pollFile(inW, "stdin")
	outR, outW, err := pipe()
	if err != nil {
		stdin.Close()
		return nil, fsErr("exec", bin, err)
	}
	fds = append(fds, outW)
	stdout := pollFile(outR, "stdout")
	errR, errW, err := pipe()
	if err != nil {
		stdin.Close()
		stdout.Close()
		return nil, fsErr("exec", bin, err)
	}
	fds = append(fds, errW)
	stderr := pollFile(errR, "stderr")
	fork := a.forkExec
	if p.req.Trusted {
		fork = a.forkTrusted // fresh pipes, beside the agent, the sandbox frozen
	}
	t0 := time.Now() // before the fork (see startShell)
	pid, exit, err := fork(bin, p.req.Argv, p.env, p.cwd, p.cred,
		[]uintptr{uintptr(inR), uintptr(outW), uintptr(errW)})
	if err != nil {
		stdin.Close()
		stdout.Close()
		stderr.Close()
		return nil, fsErr("exec", bin, err)
	}
	r := &running{pid: pid, exit: exit, start: t0, stdin: stdin}
	r.armTimeout(p.req.Timeout)
	r.outs = []*outStream{
		newOutStream(agentproto.StreamStdout, stdout, limit, emit, p.collect),
		newOutStream(agentproto.StreamStderr, stderr, limit, emit, p.collect),
	}
	return r, nil
}

// lookPath finds name in PATH (as the agent sees the sandbox).
func lookPath(name, pathEnv string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, dir := range strings.Split(pathEnv, ":") {
		if dir == "" {
			dir = "."
		}
		f := path.Join(dir, name)
		if st, err := os.Stat(f); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return f, nil
		}
	}
	return "", errf(agentproto.ErrNotFound, "exec: %q not found in PATH", name)
}

func (r *running) armTimeout(d time.Duration) {
	if d <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.timer = time.AfterFunc(d, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if !r.exited {
			r.timedOut = true
			if r.session {
				killSession(r.pid)
				return
			}
			if r.live != nil {
				killSince(r.pid, r.startTicks)
				return
			}
			_ = unix.Kill(-r.pid, unix.SIGKILL)
		}
	})
}

// abort kills the command (its process group; for a live shell's command
// what it started) because its caller went away.
func (r *running) abort() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.exited {
		return
	}
	if r.session {
		killSession(r.pid)
		return
	}
	if r.live != nil {
		killSince(r.pid, r.startTicks)
		return
	}
	_ = unix.Kill(-r.pid, unix.SIGKILL)
}

// kill signals the command's process group while it runs.
func (r *running) kill(sig unix.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.exited && r.live == nil {
		_ = unix.Kill(-r.pid, sig)
	}
}

// feedStdin writes data to the command's stdin and closes it; with no data
// stdin is at EOF at once.
func (r *running) feedStdin(data []byte) {
	if r.stdin == nil {
		return
	}
	if len(data) == 0 {
		r.stdin.Close()
		return
	}
	go func() {
		_, _ = r.stdin.Write(data)
		r.stdin.Close()
	}()
}

// finish waits for the command, its output and (for shell commands) its
// state report, updates the session and returns the result.
//
// A shell command is over when its exit trap has reported the status: the
// answer does not wait for the shell process to end and be reaped (the
// reaper still collects it). When no report comes (the shell was killed, or
// the command replaced the trap) the status is the reaped one.
func (a *Agent) finish(p *execPlan, r *running) *agentproto.ExecResult {
	e := r.awaitEnd()
	r.mu.Lock()
	r.exited = true
	timedOut := r.timedOut
	if r.timer != nil {
		r.timer.Stop()
	}
	r.mu.Unlock()
	// The live shell has opened (or will never open) the output FIFOs: our
	// own writers go, so the streams end when the command's processes
	// close theirs.
	closeAll(r.keep...)
	for _, f := range r.fifos {
		_ = unix.Unlinkat(r.fifoDir, f, 0)
	}

	if r.pooled {
		// Only commands that take fresh shells keep the pool warm: argv
		// commands and live shells never use it.
		defer a.pool.refillSoon()
	}
	res := &agentproto.ExecResult{Duration: float64(e.at.Sub(r.start).Microseconds()) / 1000}
	switch {
	case e.reported:
		res.ExitCode = e.st.status
	case e.ws.Exited():
		res.ExitCode = e.ws.ExitStatus()
	case e.ws.Signaled():
		res.ExitCode = 128 + int(e.ws.Signal())
		res.Signal = unix.SignalName(e.ws.Signal())
	}
	res.TimedOut = timedOut

	if r.drainOutput() {
		res.Truncated = true
	}
	if r.stdin != nil {
		r.stdin.Close() // unblocks a stdin writer the command never read
	}

	if r.state != nil {
		r.state.Close()
	}
	if e.reported && (r.live == nil || !r.live.fork) {
		p.sess.update(e.st.cwd, e.st.env, p.injected, p.prior)
	}
	if r.live != nil {
		a.endLive(r, e.st, e.reported, e.exiting)
	}
	return res
}

// commandEnd is how a command ended, as finish learnt it.
type commandEnd struct {
	ws       unix.WaitStatus // the reaped status, when the exit came first
	at       time.Time       // when it ended
	st       shellState      // the shell's state report
	reported bool            // st holds the report
	exiting  bool            // the live shell's exit trap reported
}

// awaitEnd waits for the command to end: for its state report or its
// process's exit, whichever comes first (the exit sets r.sawExit). After a
// normal exit without a report, it waits up to stateWait for a report that
// was written but not yet read.
func (r *running) awaitEnd() commandEnd {
	reports := r.reports
	if r.state != nil {
		ch := make(chan []byte, 1)
		go readState(r.state, ch)
		reports = ch
	}
	var e commandEnd
awaitEnd:
	for {
		select {
		case ei := <-r.exit:
			e.ws, e.at, r.sawExit = ei.status, ei.at, true
			break awaitEnd
		case b, open := <-reports:
			if !open {
				reports = nil // only the exit is left to wait for
				continue
			}
			var stale bool
			if e.st, e.exiting, e.reported, stale = r.parseReport(b); stale {
				continue
			}
			if e.reported {
				e.at = time.Now()
				break awaitEnd
			}
			reports = nil
		}
	}
	if !e.reported && reports != nil && e.ws.Exited() {
		// The shell ended normally: its report was written before, and
		// may just not have been read yet.
		deadline := time.After(stateWait)
	late:
		for {
			select {
			case b, open := <-reports:
				var stale bool
				if !open {
					break late
				}
				if e.st, e.exiting, e.reported, stale = r.parseReport(b); !stale {
					break late
				}
			case <-deadline:
				break late
			}
		}
	}
	return e
}

// drainOutput waits for the command's output to end and detaches its
// streams; it reports whether any of them was truncated. A daemon the
// command left behind may keep the pipes open: after drainGrace it stops
// waiting, but never while output written before the exit is still in the
// pipe or being delivered (on a loaded machine the readers may be late),
// up to drainMax.
func (r *running) drainOutput() bool {
	graceAt, maxAt := time.Now().Add(drainGrace), time.Now().Add(drainMax)
	for _, o := range r.outs {
	wait:
		for {
			select {
			case <-o.done:
				break wait
			case <-time.After(2 * time.Millisecond):
			}
			now := time.Now()
			if now.After(maxAt) || now.After(graceAt) && !o.pending() {
				break
			}
		}
	}
	truncated := false
	for _, o := range r.outs {
		if o.detach() {
			truncated = true
		}
	}
	return truncated
}

// readState reads the shell's state report (see stateTrap).
func readState(f *os.File, out chan<- []byte) {
	var buf bytes.Buffer
	b := make([]byte, 32<<10)
	nuls := 0
	for buf.Len() < 64<<20 {
		n, err := f.Read(b)
		buf.Write(b[:n])
		nuls += bytes.Count(b[:n], []byte{0})
		if nuls >= stateFields {
			out <- buf.Bytes()
			return
		}
		if err != nil {
			break
		}
	}
	out <- nil
}
