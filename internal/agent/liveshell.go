package agent

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
)

// A live shell is a session's long-lived shell. It runs a loop that sources
// one script file after another, named on fd 3; each script reports the
// command's status, $PWD and exported variables on fd 4, so a command costs no
// process start or exit: only the shell's parse and run of it (tens of µs
// for a builtin, where starting a shell costs ~0.8 ms of CPU here). Like a
// terminal, everything the shell holds persists between the session's
// commands: exported and plain variables, functions, options.
//
// Each command gets its own stdout and stderr: two FIFOs the agent creates
// and the script redirects to, so a daemon a command leaves behind keeps
// only that command's (drained, then ignored) streams, as with a fresh
// shell. Commands with stdin, another user, background or trusted commands,
// and commands over 16 KiB use a fresh shell instead.

// liveLoop is the shell program of a live shell in dir. Each command comes
// as a script file in dir, named by a line on fd 3, which the shell sources
// (a file is read in blocks; the pipe is read a byte at a time); lines that
// name no such file (text a process of the sandbox wrote into the pipe) are
// skipped, and `command .` keeps a missing file from ending the shell. A
// script that did not get to its own report (a syntax error in the command
// aborts the sourced file) is reported by the loop, with the status of the
// `.`, under the token in the script's name. EOF
// on fd 3 ends the shell quietly. The exit trap reports a command that ends
// the shell (exit, set -e) with its status prefixed by "E".
func liveLoop(dir string) string {
	return `trap '__warren_rc=$?; { printf "E%s\0%s\0" "$__warren_rc" "$PWD"; export -p; printf "\0"; } >&4 2>/dev/null' EXIT
while IFS= read -r __warren_f <&3; do
case $__warren_f in ` + shellQuote(dir) + `/*.sh) ;; *) continue ;; esac
command . "$__warren_f"
__warren_rc=$?
case $__warren_done in 1) continue ;; esac
\unset -f printf cd read command 2>/dev/null
__warren_t=${__warren_f##*/}
{ \printf '%s:%s\0%s\0' "${__warren_t%.sh}" "$__warren_rc" "$PWD"; \export -p; \printf '\0'; } >&4 2>/dev/null
done
trap - EXIT
`
}

// liveUnshadow removes functions that would replace the regular builtins
// the scripts and the loop use; the backslashes in the scripts keep aliases
// out. (Special builtins such as eval and export come before functions
// anyway.)
const liveUnshadow = `\unset -f printf cd read command __warren_body 2>/dev/null` + "\n"

// liveReport ends every script: the command's token and status, then the
// state. The token tells this command's report from any other a process of
// the sandbox might write into the shell's report pipe.
func liveReport(token string) string {
	return `__warren_rc=$?` + "\n" + liveUnshadow +
		`{ \printf '%s:%s\0%s\0' ` + token + ` "$__warren_rc" "$PWD"; \export -p; \printf '\0'; } >&4 2>/dev/null` + "\n"
}

const (
	// maxLiveShells bounds the live shells of one agent (one per session).
	maxLiveShells = 8
	// maxLiveCmd is the longest command a live shell runs: its script file
	// lives in the sandbox's /dev, a 64 KiB tmpfs.
	maxLiveCmd = 16 << 10
)

// liveShell is one running live shell.
type liveShell struct {
	pid     int
	exit    <-chan exitInfo
	cred    *credential
	script  int         // write end of the shell's fd 3 (blocking)
	reports chan []byte // its state reports, in order
	env     map[string]string
	dir     string
	dead    bool          // its exit was received (its pid may be reused)
	done    chan struct{} // closed when the shell is let go

	// fork: a zygote (zygote.go), which runs each command in a subshell and
	// keeps nothing of it; attrs are its attributes when it started.
	fork  bool
	attrs procAttrs
}

// liveReportExit marks a report from the exit trap.
const liveReportExit = 'E'

// liveShells counts the agent's live shells.
type liveShells struct {
	n   atomic.Int32
	dir string // where per-command FIFOs and scripts are made ("": no live shells)

	mu  sync.Mutex
	dfd int // dir, opened O_PATH once made (0: not yet)
}

// startLive spawns a live shell with env in dir, or with fork a zygote.
func (a *Agent) startLive(env map[string]string, dir string, cred *credential, fork bool) (*liveShell, error) {
	if a.live.n.Add(1) > maxLiveShells {
		a.live.n.Add(-1)
		return nil, nil
	}
	var fds []int
	fail := func(err error) (*liveShell, error) {
		closeAll(fds...)
		a.live.n.Add(-1)
		return nil, err
	}
	scR, scW, err := pipe()
	if err != nil {
		return fail(err)
	}
	fds = append(fds, scR, scW)
	stR, stW, err := pipe()
	if err != nil {
		return fail(err)
	}
	fds = append(fds, stR, stW)
	null, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(err)
	}
	fds = append(fds, null)
	argv := []string{a.shell, "-c", liveLoop(a.live.dir)}
	if fork {
		argv[2] = forkLoop(a.live.dir)
	}
	if filepath.Base(a.shell) == "busybox" {
		argv[0] = "sh"
	}
	files := []uintptr{uintptr(null), uintptr(null), uintptr(null), uintptr(scR), uintptr(stW)}
	var (
		pid  int
		exit <-chan exitInfo
	)
	if fork {
		pid, exit, err = a.forkExecSealed(a.shell, argv, env, dir, files)
	} else {
		pid, exit, err = a.forkExec(a.shell, argv, env, dir, cred, files)
	}
	if err != nil {
		return fail(err)
	}
	closeAll(scR, stW, null)
	ls := &liveShell{pid: pid, exit: exit, cred: cred, script: scW, reports: make(chan []byte, 1), env: env, dir: dir,
		done: make(chan struct{}), fork: fork}
	go readReports(pollFile(stR, "state"), ls.reports, ls.done)
	return ls, nil
}

// readReports splits a live shell's fd 4 into reports until EOF, or until
// the shell is let go (done).
func readReports(f *os.File, out chan<- []byte, done <-chan struct{}) {
	defer close(out)
	defer f.Close()
	var buf []byte
	b := make([]byte, 32<<10)
	for {
		n, err := f.Read(b)
		buf = append(buf, b[:n]...)
		for {
			end, nuls := 0, 0
			for i, c := range buf {
				if c == 0 {
					if nuls++; nuls == stateFields {
						end = i + 1
						break
					}
				}
			}
			if end == 0 {
				break
			}
			select {
			case out <- bytes.Clone(buf[:end]):
			case <-done:
				return
			}
			buf = buf[end:]
		}
		if err != nil || len(buf) > 64<<20 {
			return
		}
	}
}

// close ends an idle live shell: EOF on its script pipe ends its loop.
func (ls *liveShell) close(a *Agent) {
	if ls.script >= 0 {
		unix.Close(ls.script)
		ls.script = -1
		close(ls.done)
		a.live.n.Add(-1)
	}
}

// alive reports whether the shell has not exited. Only the holder of the
// shell (the session's idle slot, or the command running in it) calls it.
func (ls *liveShell) alive() bool {
	if ls.dead {
		return false
	}
	select {
	case <-ls.exit:
		ls.dead = true
		return false
	default:
		return true
	}
}

// takeLive returns the session's idle live shell for the plan, starting one
// when the session has none, or nil when the command must use a fresh
// shell.
func (a *Agent) takeLive(p *execPlan) *liveShell {
	if a.live.dir == "" || p.req.Background || p.req.Trusted || len(p.req.Stdin) > 0 ||
		len(p.req.Cmd) > maxLiveCmd || a.cfg.Stateless != nil || p.cred.key() != a.defUser.key() {
		return nil
	}
	s := p.sess
	s.mu.Lock()
	if s.liveBusy {
		s.mu.Unlock()
		return nil
	}
	ls := s.live
	s.live, s.liveBusy = nil, true
	s.mu.Unlock()
	if ls != nil && !ls.alive() {
		ls.close(a)
		ls = nil
	}
	if ls == nil {
		var err error
		if ls, err = a.startLive(p.env, p.cwd, p.cred, false); err != nil || ls == nil {
			if err != nil {
				a.log.Warn("agent: live shell", "err", err)
			}
			a.putLive(s, nil)
			return nil
		}
	}
	return ls
}

// putLive gives the session its live shell back (nil: it has none now).
func (a *Agent) putLive(s *session, ls *liveShell) {
	s.mu.Lock()
	old := s.live
	s.live, s.liveBusy = ls, false
	s.mu.Unlock()
	if old != nil && old != ls {
		old.close(a)
	}
}

// fifoDir makes the directory for per-command FIFOs and scripts and
// returns a descriptor of it: the files are made and removed relative to
// it, without walking the path from the root each time.
func (a *Agent) fifoDir() (int, error) {
	l := &a.live
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dfd > 0 {
		return l.dfd, nil
	}
	if err := os.MkdirAll(l.dir, 0o711); err != nil {
		return -1, err
	}
	fd, err := unix.Open(l.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	l.dfd = fd
	return fd, nil
}

// remakeFIFODir forgets the descriptor old of a directory that is gone and
// makes the directory again. The old descriptor stays open: commands
// started before may still remove their files through it.
func (a *Agent) remakeFIFODir(old int) (int, error) {
	a.live.mu.Lock()
	if a.live.dfd == old {
		a.live.dfd = 0
	}
	a.live.mu.Unlock()
	return a.fifoDir()
}

// startLiveCommand runs the planned command in ls.
func (a *Agent) startLiveCommand(p *execPlan, ls *liveShell, limit int64, emit func(string, []byte)) (*running, error) {
	var b strings.Builder
	if !ls.fork {
		b.WriteString("__warren_done=\n")
		b.WriteString(liveUnshadow)
	}
	if !writeEnvDiff(&b, ls.env, ls.dir, p.env, p.cwd) {
		return nil, errLiveUnfit
	}
	dfd, err := a.fifoDir()
	if err != nil {
		return nil, err
	}
	// One random token names the command's files and marks its report.
	token := "c" + randomHex()
	f := &liveFiles{dfd: dfd}
	if err := a.makeLiveFIFOs(f, token, ls.cred); err != nil {
		return nil, f.remove(err)
	}
	writeLiveBody(&b, p.req.Cmd, ls.fork, token, f.paths)
	script := token + ".sh"
	f.names = append(f.names, script)
	if err := writeScriptFile(f.dfd, script, b.String(), ls.cred); err != nil {
		return nil, f.remove(err)
	}

	r := &running{pid: ls.pid, exit: ls.exit, start: time.Now(), reports: ls.reports, token: token,
		live: ls, sess: p.sess, keep: f.keep, fifoDir: f.dfd, fifos: f.names, startTicks: bootTicks()}
	r.armTimeout(p.req.Timeout)
	r.outs = []*outStream{
		newOutStream(agentproto.StreamStdout, f.reads[0], limit, emit, p.collect),
		newOutStream(agentproto.StreamStderr, f.reads[1], limit, emit, p.collect),
	}
	// The leading newline ends any partial line written into the pipe. A
	// zygote's pipe is the agent's alone, and it is given the token only.
	line := "\n" + a.live.dir + "/" + script + "\n"
	if ls.fork {
		line = token + "\n"
	}
	if err := writeAll(ls.script, []byte(line)); err != nil {
		// The shell is gone: finish sees its exit.
		a.log.Debug("agent: live shell write", "err", err)
	}
	return r, nil
}

// liveFiles are the files a live shell's command is given in the FIFO
// directory dfd: its output FIFOs, with the agent's reader and (kept open)
// writer of each, and its script.
type liveFiles struct {
	dfd   int
	names []string // made in dfd
	paths []string // the same, as the shell sees them
	reads []*os.File
	keep  []int
}

// remove undoes what f holds (a command that could not start): it closes
// the descriptors, removes the files and returns err.
func (f *liveFiles) remove(err error) error {
	for _, r := range f.reads {
		r.Close()
	}
	closeAll(f.keep...)
	for _, n := range f.names {
		_ = unix.Unlinkat(f.dfd, n, 0)
	}
	return err
}

// makeLiveFIFOs makes the command's stdout and stderr FIFOs (token.out,
// token.err) in f.dfd, owned by cred's user, and opens the agent's reader
// and writer of each. A FIFO directory that a process of the sandbox
// removed is made again (f.dfd changes). On an error, what was made is in
// f, for remove.
func (a *Agent) makeLiveFIFOs(f *liveFiles, token string, cred *credential) error {
	for _, suffix := range []string{".out", ".err"} {
		name := token + suffix
		err := unix.Mkfifoat(f.dfd, name, 0o600)
		if err == unix.ENOENT && len(f.names) == 0 {
			// A process of the sandbox removed the directory: make it again.
			if f.dfd, err = a.remakeFIFODir(f.dfd); err == nil {
				err = unix.Mkfifoat(f.dfd, name, 0o600)
			}
		}
		if err != nil {
			return err
		}
		f.names = append(f.names, name)
		f.paths = append(f.paths, a.live.dir+"/"+name)
		if cred != nil {
			if err := unix.Fchownat(f.dfd, name, int(cred.uid), int(cred.gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
				return err
			}
		}
		r, err := unix.Openat(f.dfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		f.reads = append(f.reads, pollFile(r, suffix[1:]))
		// Our own writer keeps the FIFO from reading as ended before the
		// shell has opened it; it is closed once the command reported.
		w, err := unix.Openat(f.dfd, name, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			return err
		}
		f.keep = append(f.keep, w)
	}
	return nil
}

// writeLiveBody writes the script's part that runs cmd with its output to
// the FIFOs at paths: in a zygote's subshell (fork), or in a function of a
// live shell followed by the report marked with token.
func writeLiveBody(b *strings.Builder, cmd string, fork bool, token string, paths []string) {
	b.WriteString("__warren_cmd=" + shellQuote(cmd) + "\n")
	if fork {
		// A subshell of the zygote, which reports when it ends; an exit
		// trap of the command writes to the command's streams too.
		b.WriteString(`exec </dev/null >` + shellQuote(paths[0]) + ` 2>` + shellQuote(paths[1]) + "\n")
		b.WriteString(`eval "$__warren_cmd"` + "\n")
	} else {
		// The command runs in a function, so a `return` in it ends the
		// function, not the sourced file before its report.
		b.WriteString(`__warren_body() { \eval "$__warren_cmd" </dev/null >` + shellQuote(paths[0]) + ` 2>` + shellQuote(paths[1]) + " 3<&- 4>&-; }\n")
		b.WriteString("__warren_body\n")
		b.WriteString(liveReport(token))
		b.WriteString("__warren_done=1\n")
	}
}

// writeScriptFile writes a live shell's script in dfd, readable by its
// user only.
func writeScriptFile(dfd int, name, script string, cred *credential) error {
	fd, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	if cred != nil {
		if err := f.Chown(int(cred.uid), int(cred.gid)); err != nil {
			f.Close()
			return err
		}
	}
	_, err = f.WriteString(script)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// errLiveUnfit says a command cannot run in the live shell.
var errLiveUnfit = errf(agentproto.ErrInvalid, "exec: not for a live shell")

// endLive settles the live shell after its command: back to the session when
// the command reported normally, otherwise ended.
func (a *Agent) endLive(r *running, st shellState, reported, exiting bool) {
	ls := r.live
	if ls.fork {
		if reported && !r.timedOut && ls.alive() {
			a.putZygote(ls)
			return
		}
		a.dropZygote(ls)
		a.putZygote(nil)
		return
	}
	if reported && !exiting && !r.timedOut && ls.alive() {
		ls.env, ls.dir = st.env, st.cwd
		a.putLive(r.sess, ls)
		a.reapWatch(r.sess, ls.pid)
		return
	}
	ls.close(a)
	if !r.sawExit && ls.alive() {
		// Only the shell: daemons of earlier commands share its group.
		_ = unix.Kill(ls.pid, unix.SIGKILL)
	}
	a.putLive(r.sess, nil)
}

// bootTicks is now in the clock ticks of /proc/<pid>/stat's start time.
func bootTicks() uint64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return uint64(ts.Nano()) / (1e9 / clockTicks)
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times (100 on Linux).
const clockTicks = 100

// killSince kills the processes of process group pgid that started at or
// after tick since, and the group leader (the live shell): a timed-out
// command and everything it started die, while daemons that earlier
// commands of the session left in the same group live on. A daemon started
// in the very tick (10 ms) the command began is killed too.
func killSince(pgid int, since uint64) {
	_ = unix.Kill(pgid, unix.SIGKILL)
	// state ppid pgrp ... starttime is field 22 of the line, index 19 here.
	killMatching(func(f []string) bool {
		if len(f) < 20 {
			return false
		}
		pg, _ := strconv.Atoi(f[2])
		start, _ := strconv.ParseUint(f[19], 10, 64)
		return pg == pgid && start >= since
	})
}

// killMatching SIGKILLs every process (but the agent) whose
// /proc/<pid>/stat fields after the command name (statFields) match, in
// rounds until a round finds none (a process forking meanwhile is caught
// by the next), at most three.
func killMatching(match func(fields []string) bool) {
	for round := 0; round < 3; round++ {
		ents, err := os.ReadDir("/proc")
		if err != nil {
			return
		}
		killed := 0
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == os.Getpid() {
				continue
			}
			if match(statFields(e.Name())) {
				_ = unix.Kill(pid, unix.SIGKILL)
				killed++
			}
		}
		if killed == 0 {
			return
		}
	}
}

// parseReport reads a state report; exiting says the exit trap sent it (the
// shell is ending).
func parseReport(b []byte) (st shellState, exiting, ok bool) {
	if len(b) > 0 && b[0] == liveReportExit {
		b, exiting = b[1:], true
	}
	st, ok = parseState(b)
	return st, exiting, ok
}

// parseReport reads a report for this command. stale says it belongs to no
// command of ours (a live shell's report without this command's token,
// which only a process of the sandbox could have written): it is ignored.
func (r *running) parseReport(b []byte) (st shellState, exiting, ok, stale bool) {
	if r.live != nil && (len(b) == 0 || b[0] != liveReportExit) {
		rest, found := bytes.CutPrefix(b, []byte(r.token+":"))
		if !found {
			return shellState{}, false, false, true
		}
		b = rest
	}
	st, exiting, ok = parseReport(b)
	return st, exiting, ok, false
}

// randomHex is 16 unpredictable hex digits: a live shell's script names and
// report tokens must not be guessable by the sandbox's processes, which can
// write into the shell's pipes through /proc/<pid>/fd.
func randomHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// A live shell blocked reading its next script reaps nothing, so the
// background jobs of a session's command (`server &`) stay zombies once
// they end, holding their pids until the session's next command; at the
// sandbox's pids limit they refuse every new process. So after a command
// leaves its shell with children, the agent watches them (reapWatch) and,
// while the shell is idle, has it collect those that ended: `jobs` makes
// ash, dash and bash reap what has exited without waiting. Nothing is
// watched for the commands (nearly all) that leave no children.

// reapPoll is how often a watched idle shell's children are looked at.
const reapPoll = 500 * time.Millisecond

// reapWatch starts watching session s's shell's children (once).
func (a *Agent) reapWatch(s *session, pid int) {
	if !hasChildren(pid) {
		return
	}
	s.mu.Lock()
	if s.reaping {
		s.mu.Unlock()
		return
	}
	s.reaping = true
	s.mu.Unlock()
	go func() {
		defer func() {
			s.mu.Lock()
			s.reaping = false
			s.mu.Unlock()
		}()
		for {
			time.Sleep(reapPoll)
			s.mu.Lock()
			ls, busy := s.live, s.liveBusy
			s.mu.Unlock()
			switch {
			case busy:
				continue // the command running reaps (the shell waits on it)
			case ls == nil || !hasChildren(ls.pid):
				return
			case hasZombie(ls.pid):
				a.reapSession(s.name)
			}
		}
	}()
}

// hasChildren reports whether process pid has children.
func hasChildren(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	return err == nil && len(bytes.TrimSpace(b)) > 0
}

// hasZombie reports whether a child of process pid has exited unreaped.
func hasZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil {
		return false
	}
	for _, c := range strings.Fields(string(b)) {
		st, err := os.ReadFile("/proc/" + c + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ...: the state follows the last ')'.
		if i := bytes.LastIndexByte(st, ')'); i >= 0 && i+2 < len(st) && st[i+2] == 'Z' {
			return true
		}
	}
	return false
}

// reapSessions has every idle live shell collect its ended background
// jobs (reapSession), and reports whether it asked any: spawnFork calls it
// when a fork fails with EAGAIN, then tries once more.
func (a *Agent) reapSessions() bool {
	a.sessions.mu.Lock()
	names := make([]string, 0, len(a.sessions.m))
	for name := range a.sessions.m {
		names = append(names, name)
	}
	a.sessions.mu.Unlock()
	asked := false
	for _, name := range names {
		asked = a.reapSession(name) || asked
	}
	return asked
}

// reapSession runs `jobs` in session name's shell if it is idle, and
// reports whether it did. It starts no process.
func (a *Agent) reapSession(name string) bool {
	s := a.sessions.get(name)
	s.mu.Lock()
	ls := s.live
	if s.liveBusy || ls == nil {
		s.mu.Unlock()
		return false
	}
	s.live, s.liveBusy = nil, true
	s.mu.Unlock()
	if !ls.alive() {
		ls.close(a)
		a.putLive(s, nil)
		return false
	}
	p, err := a.plan(&agentproto.ExecRequest{Cmd: "jobs >/dev/null 2>&1", Session: name})
	if err != nil {
		a.putLive(s, ls)
		return false
	}
	r, err := a.startLiveCommand(p, ls, 4096, func(string, []byte) {})
	if err != nil {
		a.putLive(s, ls)
		return false
	}
	a.finish(p, r)
	return true
}
