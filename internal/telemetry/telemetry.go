// Package telemetry is the node's kernel-side collection of what sandboxes
// do (issue 20): one set of BPF programs per node, loaded by the edge,
// filtered by each sandbox's cgroup v2 id so that one set serves every
// sandbox. A BPF hash map holds the cgroup ids of the sandboxes the edge
// registered (Add, Remove), each with a cookie naming the sandbox and the
// trajectory step it runs now (SetStep); the programs stamp every event
// with both, in the kernel, at the moment it happens, and push it into a
// ring buffer that Run reads.
//
// Recorded today, each with the pid and parent pid in the sandbox's pid
// namespace, the host pid and the host uid:
//   - exec: every execve that succeeds (tp_btf/sched_process_exec): the
//     path as given to execve, argv up to ArgvCap bytes;
//   - refused: every syscall that fails with EPERM (tp_btf/sys_exit:
//     seccomp's refusals, and what a missing capability refuses), by name;
//   - signal: every signal but SIGCHLD sent to a task that is pid 1 of its
//     pid namespace (tp_btf/signal_generate: the sandbox's agent);
//   - connect: every TCP connection attempt of a sandbox process (not of
//     its agent), with its destination (tp_btf/inet_sock_set_state, as a
//     socket enters SYN_SENT);
//   - file (Options.Files): also every open for reading of /proc/kpage*,
//     /proc/kcore, a /proc/<pid>/mem or environ, or a file under the
//     sandbox's protected directory (Protect);
//   - file (Options.Files): every syscall of a sandbox process (not of its
//     agent's cgroup) that asks to write, create, truncate, rename, unlink
//     or chmod a file (tp_btf/sys_enter), with the path as named.
//
// fentry/fexit programs are refused on this machine (EPERM), so the hooks
// are BTF tracepoints only.
//
// Cgroup ids: bpf_get_current_cgroup_id is the task's cgroup in the v2
// (unified) hierarchy, on a hybrid host too (/sys/fs/cgroup/unified); the
// id is the cgroup directory's inode number. A sandbox registers its cgroup
// and its `work` child (the trust split); a process in any deeper cgroup
// is found through its ancestors.
//
// Lock order: Collector.mu only.
package telemetry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/sys/unix"
)

// ArgvCap bounds the argv bytes kept per exec (the rest is cut and the
// record says so).
const ArgvCap = 1024

// Kinds of records.
const (
	KindExec    = "exec"    // an execve that succeeded
	KindRefused = "refused" // a syscall failed with EPERM (seccomp, capabilities)
	KindSignal  = "signal"  // a signal sent to the sandbox's PID 1 (its agent)
	KindFile    = "file"    // a syscall asking to write, rename, unlink or chmod a file
	KindConnect = "connect" // a TCP connection attempt
)

// kinds maps the programs' event kinds (exec.c) to names.
var kinds = map[uint32]string{1: KindExec, 2: KindRefused, 3: KindSignal, 4: KindFile, 5: KindConnect}

// Record is one event of a sandbox, as the kernel saw it.
type Record struct {
	Cookie uint64 // the sandbox (Add)
	Step   int64  // its trajectory step then (0 = between steps)
	Time   time.Time
	Kind   string
	Pid    int // in the sandbox's pid namespace
	Ppid   int
	// HostPid and UID are as the host sees them.
	HostPid       int
	UID           int
	Path          string
	Argv          []string
	ArgvTruncated bool
	// Syscall is the refused syscall's name (refused).
	Syscall string
	// Signal and Target: the signal and the pid it was sent to, as the
	// target's namespace numbers it: 1 (signal).
	Signal, Target int
	// Outcome is what the kernel did with a signal: delivered, ignored,
	// already_pending, overflow_fail, lose_info.
	Outcome string
	// Op is a file operation (file): write (an open for writing, creating
	// or truncating), rename, unlink, chmod; Path is its file as the
	// process named it, To a rename's new name.
	Op, To string
	// Dest is a connection attempt's destination, "ip:port" (connect).
	Dest string
	// Beside: a file operation or connection of a process in the agent's
	// cgroup other than the agent: a trusted command, or a process the
	// agent started and has not moved into work/ yet.
	Beside bool
}

// signalOutcomes names the kernel's TRACE_SIGNAL_* results.
var signalOutcomes = []string{"delivered", "ignored", "already_pending", "overflow_fail", "lose_info"}

// Collector is the loaded programs of one node.
type Collector struct {
	log   *slog.Logger
	objs  execObjects
	links []link.Link
	rd    *ringbuf.Reader
	// monoOff turns the kernel's CLOCK_MONOTONIC stamps into wall time.
	monoOff time.Duration

	mu    sync.Mutex
	ids   map[uint64][]uint64 // cookie -> its registered cgroup ids
	flags map[uint64]uint32   // cgroup id -> its slot's flags (slotAgent)
	prot  map[uint64]string   // cookie -> its protected directory (Protect)
	steps map[uint64]int64    // cookie -> its step now (SetStep)
}

// ProtCap bounds a protected directory's path (exec.c PROT_CAP, with
// room for the end).
const ProtCap = 63

// slot is what the programs read for one of cookie's cgroups.
func (c *Collector) slot(cookie uint64, flags uint32) execSlot {
	sl := execSlot{Cookie: cookie, Step: c.steps[cookie], Flags: flags}
	if p := c.prot[cookie]; p != "" {
		sl.ProtLen = uint32(len(p))
		for i := range len(p) {
			sl.Prot[i] = int8(p[i])
		}
	}
	return sl
}

// slotAgent marks the cgroup of a sandbox's agent (exec.c SLOT_AGENT).
const slotAgent = 1

// Options choose what a Collector records besides execs and signals.
type Options struct {
	// Refusals records every syscall of a sandbox that fails with EPERM.
	// Off by default: its hook (the sys_exit tracepoint) puts every syscall
	// of the host on the kernel's slow path: a getppid takes ~75 ns more,
	// +60 % (docs/BENCHMARKS.md).
	Refusals bool
	// Files records every syscall of a sandbox's processes (not its
	// agent's) that asks to write, create, truncate, rename, unlink or
	// chmod a file, with the path as named. Off by default for the same
	// reason (its hook is the sys_enter tracepoint).
	Files bool
}

// Open loads and attaches the programs. It fails (and the node runs
// without telemetry) where the kernel has no BTF or we may not load BPF.
func Open(log *slog.Logger, opts Options) (*Collector, error) {
	if log == nil {
		log = slog.Default()
	}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return nil, fmt.Errorf("telemetry: kernel has no BTF: %w", err)
	}
	c := &Collector{log: log, ids: map[uint64][]uint64{}, flags: map[uint64]uint32{}, prot: map[uint64]string{}, steps: map[uint64]int64{}}
	if err := c.load(); err != nil {
		return nil, err
	}
	tp, err := link.AttachTracing(link.TracingOptions{Program: c.objs.Exec})
	if err != nil {
		_ = c.objs.Close()
		return nil, fmt.Errorf("telemetry: attach sched_process_exec: %w", err)
	}
	c.links = append(c.links, tp)
	// The rest is optional: a kernel without one of these functions still
	// records execs.
	optional := map[string]*ebpf.Program{"signal_generate": c.objs.SignalGenerate, "inet_sock_set_state": c.objs.InetSockSetState}
	if opts.Refusals {
		optional["sys_exit"] = c.objs.SysExit
	}
	if opts.Files {
		optional["sys_enter"] = c.objs.SysEnter
	}
	for name, p := range optional {
		if p == nil {
			continue
		}
		l, err := link.AttachTracing(link.TracingOptions{Program: p})
		if err != nil {
			log.Warn("telemetry: not recorded", "function", name, "err", err)
			continue
		}
		c.links = append(c.links, l)
	}
	rd, err := ringbuf.NewReader(c.objs.Events)
	if err != nil {
		_ = c.Close()
		return nil, fmt.Errorf("telemetry: ring buffer: %w", err)
	}
	c.rd = rd
	var mono unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &mono); err == nil {
		c.monoOff = time.Duration(time.Now().UnixNano() - mono.Nano())
	}
	return c, nil
}

// load loads the maps and programs; where the kernel refuses the optional
// ones (refusals, signals), the exec program alone.
func (c *Collector) load() error {
	spec, err := loadExec()
	if err != nil {
		return fmt.Errorf("telemetry: %w", err)
	}
	err = spec.LoadAndAssign(&c.objs, nil)
	if err == nil {
		return nil
	}
	c.log.Warn("telemetry: records execs only", "err", verr(err))
	var base struct {
		execMaps
		Exec *ebpf.Program `ebpf:"exec"`
	}
	if err := spec.LoadAndAssign(&base, nil); err != nil {
		return fmt.Errorf("telemetry: load programs: %w", verr(err))
	}
	c.objs.execMaps, c.objs.Exec = base.execMaps, base.Exec
	return nil
}

// verr spells a verifier error out whole.
func verr(err error) error {
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return fmt.Errorf("%+v", ve)
	}
	return err
}

// CgroupID is the id of the cgroup v2 directory dir (its inode number).
func CgroupID(dir string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return 0, fmt.Errorf("telemetry: cgroup %s: %w", dir, err)
	}
	return st.Ino, nil
}

// Add registers the cgroup v2 directories dirs as cookie's: the programs
// record what runs in them (and below them) from now on. A cookie added
// again replaces its directories.
func (c *Collector) Add(cookie uint64, dirs ...string) error {
	return c.AddSandbox(cookie, "", dirs...)
}

// AddSandbox is Add where agentDir (also registered) holds the sandbox's
// agent and trusted commands: the agent's own file operations and
// connections (pid 1 of its namespace) are not recorded; those of other
// processes there (trusted commands, and processes not yet moved into
// work/) are, marked Beside.
func (c *Collector) AddSandbox(cookie uint64, agentDir string, dirs ...string) error {
	if agentDir != "" {
		dirs = append(dirs, agentDir)
	}
	ids := make([]uint64, 0, len(dirs))
	for _, d := range dirs {
		id, err := CgroupID(d)
		if err != nil {
			return err
		}
		ids = append(ids, id)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removeLocked(cookie)
	for i, id := range ids {
		var flags uint32
		if agentDir != "" && i == len(ids)-1 {
			flags = slotAgent
		}
		c.flags[id] = flags
		if err := c.objs.Sandboxes.Put(id, c.slot(cookie, flags)); err != nil {
			c.removeLocked(cookie)
			return fmt.Errorf("telemetry: register cgroup %d: %w", id, err)
		}
		c.ids[cookie] = append(c.ids[cookie], id)
	}
	return nil
}

// Remove forgets cookie's cgroups.
func (c *Collector) Remove(cookie uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removeLocked(cookie)
}

func (c *Collector) removeLocked(cookie uint64) {
	for _, id := range c.ids[cookie] {
		if err := c.objs.Sandboxes.Delete(id); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			c.log.Warn("telemetry: unregister cgroup", "id", id, "err", err)
		}
		delete(c.flags, id)
	}
	delete(c.ids, cookie)
	delete(c.prot, cookie)
	delete(c.steps, cookie)
}

// Protect names cookie's protected directory (an absolute path without a
// trailing slash, at most ProtCap bytes): with Options.Files, opens for
// reading under it are recorded too. Call it after AddSandbox.
func (c *Collector) Protect(cookie uint64, dir string) error {
	if len(dir) > ProtCap || len(dir) < 2 || dir[0] != '/' || dir[len(dir)-1] == '/' {
		return fmt.Errorf("telemetry: protected directory %q: want an absolute path of at most %d bytes", dir, ProtCap)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.prot[cookie] = dir
	return c.updateLocked(cookie)
}

// updateLocked rewrites cookie's slots.
func (c *Collector) updateLocked(cookie uint64) error {
	for _, id := range c.ids[cookie] {
		if err := c.objs.Sandboxes.Update(id, c.slot(cookie, c.flags[id]), ebpf.UpdateExist); err != nil {
			return fmt.Errorf("telemetry: update cgroup %d: %w", id, err)
		}
	}
	return nil
}

// SetStep stamps what cookie's processes do from now on with step (0 =
// between steps).
func (c *Collector) SetStep(cookie uint64, step int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.ids[cookie]; !ok {
		return
	}
	c.steps[cookie] = step
	if err := c.updateLocked(cookie); err != nil {
		c.log.Warn("telemetry: set step", "cookie", cookie, "err", err)
	}
}

// Lost is the number of events the kernel dropped because the ring buffer
// was full.
func (c *Collector) Lost() uint64 {
	var n uint64
	if err := c.objs.Lost.Lookup(uint32(0), &n); err != nil {
		return 0
	}
	return n
}

// DrainEvery is how often Run drains the ring buffer: the programs wake
// it only when the ring is a quarter full, so a record reaches deliver at
// most this late.
const DrainEvery = 50 * time.Millisecond

// Run reads events until ctx ends or Close, handing each to deliver (in
// the order the kernel produced them).
func (c *Collector) Run(ctx context.Context, deliver func(Record)) error {
	stop := context.AfterFunc(ctx, func() { _ = c.rd.Close() })
	defer stop()
	var raw ringbuf.Record
	c.rd.SetDeadline(time.Now().Add(DrainEvery))
	for {
		if err := c.rd.ReadInto(&raw); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				// The ring is drained: sleep until the next round.
				c.rd.SetDeadline(time.Now().Add(DrainEvery))
				continue
			}
			if errors.Is(err, os.ErrClosed) || ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("telemetry: read ring buffer: %w", err)
		}
		if len(raw.RawSample) < int(unsafe.Sizeof(execEvent{})) {
			c.log.Warn("telemetry: short event", "bytes", len(raw.RawSample))
			continue
		}
		// The sample is the kernel's struct event, in this host's layout
		// (execEvent has structs.HostLayout): read it in place.
		ev := (*execEvent)(unsafe.Pointer(&raw.RawSample[0]))
		deliver(c.record(ev))
	}
}

func (c *Collector) record(ev *execEvent) Record {
	r := Record{
		Cookie: ev.Cookie, Step: ev.Step, Time: time.Unix(0, int64(ev.TimeNs)+int64(c.monoOff)).UTC(),
		Kind: kinds[ev.Kind], Pid: int(int32(ev.Pid)), Ppid: int(int32(ev.Ppid)), HostPid: int(int32(ev.HostPid)), UID: int(ev.Uid),
		Path: cString(ev.Path[:]), ArgvTruncated: ev.ArgvTruncated != 0, Beside: ev.Beside != 0,
	}
	switch r.Kind {
	case KindFile:
		r.Syscall = syscallName(int(ev.Nr))
		r.Op = fileOps[r.Syscall]
		if r.Op == "" {
			r.Op = "write" // open, openat, openat2, creat
			if r.Syscall != "creat" && ev.Result&(unix.O_ACCMODE|unix.O_CREAT|unix.O_TRUNC) == 0 {
				r.Op = "read" // of a sensitive path (exec.c)
			}
		}
		if n := min(int(ev.ArgvLen), len(ev.Argv)); n > 0 {
			r.To = cString(ev.Argv[:n])
		}
		return r
	case KindRefused:
		r.Syscall = syscallName(int(ev.Nr))
		return r
	case KindConnect:
		r.Dest = dest(ev)
		return r
	case KindSignal:
		r.Signal, r.Target = int(ev.Nr), int(ev.Target)
		if int(ev.Result) >= 0 && int(ev.Result) < len(signalOutcomes) {
			r.Outcome = signalOutcomes[ev.Result]
		}
		return r
	}
	n := min(int(ev.ArgvLen), len(ev.Argv))
	b := make([]byte, n)
	for i := range n {
		b[i] = byte(ev.Argv[i])
	}
	b = bytes.TrimSuffix(b, []byte{0})
	r.Argv = []string{}
	if len(b) > 0 {
		for _, a := range bytes.Split(b, []byte{0}) {
			r.Argv = append(r.Argv, string(a))
		}
	}
	return r
}

// dest formats a connect event's destination: the address's bytes are in
// path, the family in nr, the port in target.
func dest(ev *execEvent) string {
	n := 4
	if ev.Nr == unix.AF_INET6 {
		n = 16
	}
	b := make([]byte, n)
	for i := range n {
		b[i] = byte(ev.Path[i])
	}
	addr, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(addr.Unmap(), uint16(ev.Target)).String()
}

// fileOps names the file operations that are not an open for writing.
var fileOps = map[string]string{"rename": "rename", "renameat": "rename", "renameat2": "rename",
	"unlink": "unlink", "unlinkat": "unlink", "chmod": "chmod", "fchmodat": "chmod", "fchmodat2": "chmod"}

// syscallNames are this architecture's syscall names by number.
var syscallNames = func() map[int]string {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil
	}
	return info.SyscallNumbers
}()

func syscallName(nr int) string {
	if n, ok := syscallNames[nr]; ok {
		return n
	}
	return fmt.Sprintf("syscall_%d", nr)
}

func cString(s []int8) string {
	b := make([]byte, 0, len(s))
	for _, c := range s {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// Close detaches the programs and frees their maps; Run returns.
func (c *Collector) Close() error {
	var errs []error
	if c.rd != nil {
		errs = append(errs, c.rd.Close())
	}
	for _, l := range c.links {
		errs = append(errs, l.Close())
	}
	errs = append(errs, c.objs.Close())
	return errors.Join(errs...)
}
