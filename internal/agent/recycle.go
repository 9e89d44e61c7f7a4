package agent

import (
	"context"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
)

// Recycling: the edge reuses the container of a deleted sandbox for a new
// one of the same shape, which saves the namespaces, cgroups and agent
// start-up that make most of a sandbox's creation. The agent's part is
// OpWipe (nothing of the old sandbox may run or be remembered) and
// OpReroot (move to the new root the edge has pivoted the sandbox into),
// then OpResume (serve as the new sandbox's agent). Until then the agent
// serves nothing but those and ping.

// inflightWait bounds how long a wipe waits for requests that were already
// running (their commands are killed, so they end at once).
const inflightWait = 5 * time.Second

// enterRequest admits a request unless a wipe has begun; leaveRequest
// ends it.
func (a *Agent) enterRequest(op string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.wiped {
		return errf(agentproto.ErrUnusable, "%s: the sandbox is being recycled", op)
	}
	a.inflight++
	return nil
}

func (a *Agent) leaveRequest() {
	a.mu.Lock()
	a.inflight--
	if a.inflight == 0 && a.idle != nil {
		close(a.idle)
		a.idle = nil
	}
	a.mu.Unlock()
}

// recordBaseline notes the agent's own scheduling attributes and limits
// once it is set up, before any process of the sandbox runs.
func (a *Agent) recordBaseline() {
	at, ok := readProcAttrs(os.Getpid())
	a.baseline, a.baselineOK = at, ok
}

// attrsIntact says whether every thread of the agent still has the
// attributes it had after setup. A process of the sandbox runs as the
// agent's uid and may lower the agent's limits, raise its nice value or
// oom_score_adj, or pin it to one CPU; every later child of the agent
// would inherit that.
func (a *Agent) attrsIntact() bool {
	if !a.baselineOK {
		return false
	}
	pid := os.Getpid()
	if at, ok := readProcAttrs(pid); !ok || at != a.baseline {
		return false
	}
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil || len(ents) == 0 {
		return false
	}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			return false
		}
		if tid == pid {
			continue
		}
		at, ok := readThreadAttrs(tid)
		if !ok && !threadGone(tid) {
			return false
		}
		if ok && at != a.baseline.thread {
			return false
		}
	}
	return true
}

// threadGone says whether thread tid of the agent has exited.
func threadGone(tid int) bool {
	_, err := os.Stat("/proc/self/task/" + strconv.Itoa(tid))
	return os.IsNotExist(err)
}

// wipe is OpWipe.
func (a *Agent) wipe(ctx context.Context) (any, error) {
	a.mu.Lock()
	switch {
	case len(a.cfg.Stateless) > 0:
		a.mu.Unlock()
		return nil, errf(agentproto.ErrInvalid, "wipe: a stateless sandbox is reset, not recycled")
	case a.cfg.Unconfined || os.Getpid() != 1:
		// Killing "every other process" outside a pid namespace of our
		// own would reach the host's.
		a.mu.Unlock()
		return nil, errf(agentproto.ErrInvalid, "wipe: the agent is not the init of a pid namespace")
	case a.wiped:
		a.mu.Unlock()
		return nil, errf(agentproto.ErrInvalid, "wipe: already wiped")
	}
	a.wiped = true
	var idle chan struct{}
	if a.inflight > 0 {
		idle = make(chan struct{})
		a.idle = idle
	}
	pool := a.pool
	a.mu.Unlock()
	unusable := func(format string, args ...any) (any, error) {
		err := errf(agentproto.ErrUnusable, format, args...)
		a.log.Warn("agent: not reusable", "why", err)
		return nil, err
	}
	if pool != nil {
		pool.quiesce()
	}
	deadline := time.Now().Add(resetWait)
	if _, err := killAllAsInit(ctx, deadline); err != nil {
		return unusable("wipe: %v", err)
	}
	// Requests that were running end now that their processes are dead.
	if idle != nil {
		select {
		case <-idle:
		case <-time.After(inflightWait):
			return unusable("wipe: requests still running")
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	// Again: a request may have started a process after the first round.
	if _, err := killAllAsInit(ctx, deadline); err != nil {
		return unusable("wipe: %v", err)
	}
	a.sessions.closeAll(a)
	a.procs.clear()
	a.tars.clear()
	removeSysVIPC()
	for _, kind := range []string{"shm", "msg", "sem"} {
		if n, err := sysvCount(kind); err != nil || n > 0 {
			return unusable("wipe: SysV %s objects left (%d, %v)", kind, n, err)
		}
	}
	if !a.attrsIntact() {
		return unusable("wipe: the agent's scheduling attributes or limits were changed")
	}
	if n := a.live.n.Load(); n != 0 {
		return unusable("wipe: %d live shells left", n)
	}
	return nil, nil
}

// reroot is OpReroot: the agent moves its root to the one the edge
// pivoted the sandbox into and stays closed until OpResume.
func (a *Agent) reroot(req *agentproto.RerootRequest) (any, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.wiped {
		return nil, errf(agentproto.ErrInvalid, "reroot: the sandbox was not wiped")
	}
	var st unix.Stat_t
	if err := unix.Stat("/", &st); err != nil || st.Dev != req.RootDev || st.Ino != req.RootIno {
		return nil, errf(agentproto.ErrUnusable, "reroot: / is not the new root (%d:%d, %v)", st.Dev, st.Ino, err)
	}
	root, err := openRoot("/")
	if err != nil {
		return nil, errf(agentproto.ErrUnusable, "reroot: %v", err)
	}
	// Closing the last descriptor of the old root lets it go.
	unix.Close(a.root.fd)
	a.root = root
	a.rerooted = true
	// The old root's binds went with it; a recycled sandbox has none.
	a.cfg.Binds = nil
	// The FIFO directory was on the old /dev.
	a.live.mu.Lock()
	if a.live.dfd > 0 {
		unix.Close(a.live.dfd)
		a.live.dfd = 0
	}
	a.live.mu.Unlock()
	return nil, nil
}

// resume is OpResume: a rerooted agent serves again, as the new
// sandbox's, with its environment and default user.
func (a *Agent) resume(req *agentproto.ResumeRequest) (any, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.wiped || !a.rerooted {
		return nil, errf(agentproto.ErrInvalid, "resume: the sandbox was not wiped and rerooted")
	}
	// Still the root of the reroot.
	var st, rst unix.Stat_t
	if err := unix.Stat("/", &st); err != nil || unix.Fstat(a.root.fd, &rst) != nil || st.Dev != rst.Dev || st.Ino != rst.Ino {
		return nil, errf(agentproto.ErrUnusable, "resume: / is not the root of the reroot")
	}
	var cred *credential
	if req.User != "" {
		c, err := resolveUser(a.root, req.User)
		if err != nil {
			return nil, err
		}
		cred = c
	}
	a.cfg.Env, a.cfg.User, a.cfg.Cwd = req.Env, req.User, req.Cwd
	a.baseEnv = map[string]string{"PATH": defaultPath}
	for k, v := range req.Env {
		a.baseEnv[k] = v
	}
	a.defUser = cred
	if a.pool != nil {
		if plan, err := a.plan(&agentproto.ExecRequest{Cmd: "true"}); err == nil {
			a.pool = newWarmPool(a, warmShells, a.shell, plan.env, plan.cwd, a.defUser, false)
		} else {
			a.pool = nil
		}
	}
	a.wiped, a.rerooted = false, false
	return nil, nil
}
