package agent

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A stateless (FnCall) sandbox runs each task in a subshell forked from one
// long-lived shell, the zygote, instead of in a freshly started shell: a fork
// of a running shell costs a fraction of starting one (an exec, the dynamic
// loader, libc's start-up, whose cpuid instructions trap on this VM), and a
// subshell shares nothing it changes with its parent. The zygote itself
// never runs a task's code and survives the reset between tasks, so what
// it holds must stay out of the tasks' reach:
//
//   - It is not dumpable (see forkExecSealed), so the tasks, which run as the
//     same root without CAP_SYS_PTRACE, can neither ptrace it nor open its
//     /proc/<pid>/mem, fd or environ; each subshell closes the zygote's pipes
//     before it runs anything.
//   - What a same-uid process may still change in another (its scheduling,
//     nice value, affinity, I/O priority, resource limits, OOM score
//     adjustment, autogroup) is recorded when it starts and compared at
//     every reset; a zygote that was stopped is continued, and one that
//     differs, is dying or is gone is replaced.
//   - It holds no task state: a task's variables, functions, options,
//     directory, umask and traps live and die in its subshell.
//
// The loop reads a command token from fd 3 (only the agent writes there),
// sources that token's script file in a subshell and reports
// "token:status\0/\0\0" on fd 4, the live shells' report format.
func forkLoop(dir string) string {
	return `while IFS= read -r __warren_t <&3; do
case ${__warren_t#c} in ''|*[!0-9a-f]*) continue ;; esac
( exec 3<&- 4>&-; . ` + shellQuote(dir) + `/"$__warren_t".sh )
printf '%s:%s\0/\0\0' "$__warren_t" "$?" >&4
done
`
}

// zygoteSlot holds the agent's zygote between tasks.
type zygoteSlot struct {
	ls   *liveShell // the idle zygote; nil when there is none or it is busy
	busy bool
	off  bool // a zygote could not be made safe: tasks use fresh shells
}

// zygoteUsable says whether this sandbox runs its tasks in a zygote: a
// stateless sandbox whose commands run as root (forkExecSealed needs the
// spawning thread's fsuid to differ from the euid the exec leaves).
func (a *Agent) zygoteUsable() bool {
	return len(a.cfg.Stateless) > 0 && a.live.dir != "" && a.defUser == nil && a.dotOK
}

// takeZygote returns the idle zygote for the plan, starting one if there is
// none, or nil when the command must use a fresh shell.
func (a *Agent) takeZygote(p *execPlan) *liveShell {
	if !a.zygoteUsable() || p.req.Background || p.req.Trusted || len(p.req.Stdin) > 0 ||
		len(p.req.Cmd) > maxLiveCmd || p.cred != nil {
		return nil
	}
	a.mu.Lock()
	z := &a.zyg
	if z.busy || z.off {
		a.mu.Unlock()
		return nil
	}
	ls := z.ls
	z.ls, z.busy = nil, true
	a.mu.Unlock()
	if ls != nil && !ls.alive() {
		ls.close(a)
		ls = nil
	}
	if ls == nil {
		var err error
		if ls, err = a.startZygote(); err != nil {
			a.log.Warn("agent: zygote", "err", err)
		}
	}
	if ls == nil {
		a.putZygote(nil)
	}
	return ls
}

// putZygote makes ls (nil: none) the idle zygote again.
func (a *Agent) putZygote(ls *liveShell) {
	a.mu.Lock()
	old := a.zyg.ls
	a.zyg.ls, a.zyg.busy = ls, false
	a.mu.Unlock()
	if old != nil && old != ls {
		old.close(a)
	}
}

// dropZygote ends the zygote: its pipe closes, and the process is killed
// unless it is gone already.
func (a *Agent) dropZygote(ls *liveShell) {
	ls.close(a)
	if ls.alive() {
		_ = unix.Kill(ls.pid, unix.SIGKILL)
	}
}

// idleZygote is the idle zygote's pid, 0 when there is none.
func (a *Agent) idleZygote() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ls := a.zyg.ls; ls != nil && !a.zyg.busy && ls.alive() {
		return ls.pid
	}
	return 0
}

// startZygote spawns a zygote and records what a task could change in it.
func (a *Agent) startZygote() (*liveShell, error) {
	ls, err := a.startLive(a.zygEnv, "/", nil, true)
	if err != nil || ls == nil {
		return nil, err
	}
	if !a.cfg.Unconfined {
		// Without CAP_SYS_PTRACE the agent may read the environment of a
		// dumpable process of its own uid only: this open must fail.
		if f, err := os.Open("/proc/" + strconv.Itoa(ls.pid) + "/environ"); err == nil {
			f.Close()
			a.dropZygote(ls)
			a.mu.Lock()
			a.zyg.off = true
			a.mu.Unlock()
			return nil, errors.New("the zygote is dumpable (fs.suid_dumpable is not 0?): tasks use fresh shells")
		}
	}
	attrs, ok := readProcAttrs(ls.pid)
	if !ok {
		a.dropZygote(ls)
		return nil, fmt.Errorf("zygote %d: cannot read its attributes", ls.pid)
	}
	ls.attrs = attrs
	return ls, nil
}

// checkZygoteAfterReset runs once the reset has killed every other process:
// a zygote a task stopped is continued, and one a task changed, or that is
// dying, is ended (the next task starts a new one).
func (a *Agent) checkZygoteAfterReset() {
	a.mu.Lock()
	ls := a.zyg.ls
	if ls == nil || a.zyg.busy {
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	_ = unix.Kill(ls.pid, unix.SIGCONT)
	if ls.alive() && zygoteIntact(ls.pid, ls.attrs) {
		return
	}
	a.mu.Lock()
	if a.zyg.ls == ls {
		a.zyg.ls = nil
	}
	a.mu.Unlock()
	a.dropZygote(ls)
}

// procAttrs is what a process of the same uid may change in another
// without privileges, as far as it outlives the changer.
type procAttrs struct {
	thread    threadAttrs // of the process's main thread
	limits    string      // /proc/<pid>/limits
	oomAdj    string
	autogroup string // "" without CONFIG_SCHED_AUTOGROUP
}

// threadAttrs are the attributes of procAttrs that each thread has.
type threadAttrs struct {
	sched    unix.SchedAttr // policy, nice, real-time priority, utilisation clamps
	affinity unix.CPUSet
	ioprio   uintptr
}

func readThreadAttrs(tid int) (threadAttrs, bool) {
	var at threadAttrs
	s, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		return at, false
	}
	at.sched = *s
	if unix.SchedGetaffinity(tid, &at.affinity) != nil {
		return at, false
	}
	const ioprioWhoProcess = 1 // a thread, despite the name
	prio, _, errno := unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, uintptr(tid), 0)
	if errno != 0 {
		return at, false
	}
	at.ioprio = prio
	return at, true
}

func readProcAttrs(pid int) (procAttrs, bool) {
	var at procAttrs
	var ok bool
	if at.thread, ok = readThreadAttrs(pid); !ok {
		return at, false
	}
	dir := "/proc/" + strconv.Itoa(pid) + "/"
	b, err := os.ReadFile(dir + "limits")
	if err != nil {
		return at, false
	}
	at.limits = string(b)
	if b, err = os.ReadFile(dir + "oom_score_adj"); err != nil {
		return at, false
	}
	at.oomAdj = string(b)
	if b, err = os.ReadFile(dir + "autogroup"); err == nil {
		at.autogroup = string(b)
	}
	return at, true
}

// zygoteIntact says whether pid is alive, not stopped, has no fatal signal
// pending, and still has the attributes base.
func zygoteIntact(pid int, base procAttrs) bool {
	f := statFields(strconv.Itoa(pid))
	// f[0] is the state (field 3 of the line), f[28] the pending signals
	// (field 31): a fatal signal shows there as SIGKILL as soon as it is sent.
	if len(f) < 29 || !strings.Contains("RS", f[0]) {
		return false
	}
	if sig, err := strconv.ParseUint(f[28], 10, 64); err != nil || sig&(1<<(unix.SIGKILL-1)) != 0 {
		return false
	}
	now, ok := readProcAttrs(pid)
	return ok && now == base
}

// forkExecSealed is forkExec (no credential change) for a process that
// must not be dumpable. A shell cannot clear its own dumpable flag, but the
// kernel clears it when an exec changes the filesystem uid (commit_creds):
// the child is forked while the forking thread's fsuid is another uid
// (which only drops that thread's filesystem capabilities meanwhile), and
// the exec sets the fsuid back to the euid, 0. fs.suid_dumpable must be 0,
// its default; startZygote checks the result.
func (a *Agent) forkExecSealed(path string, argv []string, env map[string]string, dir string, files []uintptr) (int, <-chan exitInfo, error) {
	fork := forkFunc(path, argv, env, dir, nil, files)
	return a.spawnFork(func() (int, error) {
		// setfsuid is per thread: fork from the thread that changed it
		// (the spawner's thread is locked already; this nests).
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		const nobody = 65534
		old, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, nobody, 0, 0)
		pid, err := fork()
		unix.RawSyscall(unix.SYS_SETFSUID, old, 0, 0)
		return pid, err
	})
}
