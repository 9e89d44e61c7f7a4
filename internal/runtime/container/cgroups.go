package container

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	cgroups "github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup1"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/runtime/cpugate"
)

// cfsPeriod is the cpu quota period (100 ms).
const cfsPeriod = cpugate.Period

// v1Controllers are the cgroup v1 controllers a sandbox gets.
var v1Controllers = []string{"cpu", "cpuacct", "memory", "pids", "freezer"}

// limits are the resource limits a sandbox's cgroup is created with; zero
// means unlimited. The CPU quota comes later (setCPULimit), once the agent
// is set up.
type limits struct {
	memoryMB int64
	pids     int64
	idle     bool // best-effort: lowest CPU weight, cpu.idle where the kernel has it
}

// CPU weights (cgroup v1 cpu.shares) of the QoS classes.
const (
	sharesBestEffort = 2
	sharesLatency    = 1024
)

// cgroupDriver knows one cgroup layout of the host (v1 or v2).
type cgroupDriver interface {
	// create makes the cgroup path (relative to the hierarchy roots).
	create(path string, lim limits) error
	// start starts cmd so that it runs inside path from its first
	// instruction; with idle, it is born under SCHED_IDLE; with owner > 0,
	// from a thread whose effective uid is owner (startAs).
	start(path string, cmd *exec.Cmd, idle bool, owner uint32) error
	// dirs are path's directories that exist, one per hierarchy, the
	// trust split's children (split.go) before their parent.
	dirs(path string) []string
	// unified is path's directory in the cgroup v2 hierarchy, where the
	// trust split lives; "" when the host mounts none.
	unified(path string) string
	// children lists the names of the child cgroups of parent.
	children(parent string) ([]string, error)
	// freeze and thaw every process of path.
	freeze(path string, within time.Duration) error
	thaw(path string) error
	// remove deletes path (it must hold no process).
	remove(path string) error
	// reclaim pushes path's memory out and caps it (see Runtime.Reclaim).
	reclaim(path string) (before, after int64, err error)
	// setMemoryLimit sets path's memory limit in bytes.
	setMemoryLimit(path string, b int64) error
	// setCPULimit caps path at cores (a CFS quota per 100 ms period).
	setCPULimit(path string, cores float64) error
	// usage is path's cumulative CPU time (ns) and charged memory (bytes).
	usage(path string) (cpuNs, mem int64, err error)
	// spawnerCgroups are the cgroup directories that the agent's spawner
	// thread (the one that forks every process of the sandbox) joins.
	spawnerCgroups(path string) []string
}

// The box (cgroup v1): the sandbox's processes are limited in a child
// cgroup "box" of the sandbox's memory and pids cgroups, which hold the
// agent. The box gets the sandbox's limits; the sandbox's cgroup the same
// plus the agent's reserve. Only the agent's spawner thread joins the box,
// before it forks anything (agentproto.SetupConfig.SpawnerCgroups; a child
// inherits the cgroups of the thread that forks it), so:
//   - the agent's memory is charged to the sandbox's cgroup, not the box:
//     cgroup v1 charges a process's pages to the memory cgroup of its
//     main thread (the mm's owner), which stays outside;
//   - an OOM in the box (the sandbox's processes at their limit, by
//     memory that no process maps too: /dev/shm, memfd) chooses among the
//     box's processes only (the kernel walks thread-group leaders, and
//     the agent's is outside), never the agent: its oom_score_adj cannot
//     be lowered where CAP_SYS_RESOURCE is missing (these hosts);
//   - a fork bomb at the box's pids limit leaves the agent threads to grow;
//   - the sandbox's CPU quota (on its cgroup, setCPULimit) is shared by
//     the agent's threads and the box as one group of the lowest weight
//     (cpu.shares 2), so busy processes of the sandbox, however many, take
//     what the agent leaves and the agent answers within a quota period or
//     two; without it each busy process weighs as much as an agent thread,
//     and forty of them at 0.1 core made a stat take two seconds
//     (TestAgentAnswersUnderCPUFlood).
const (
	boxName          = "box"
	agentReserveMB   = 32
	agentReservePids = 64
)

// boxControllers are the v1 controllers that have a box.
var boxControllers = []string{"cpu", "memory", "pids"}

// boxShares is the box's CPU weight beside the agent's threads (1024 each).
const boxShares = sharesBestEffort

func newCgroupDriver() (cgroupDriver, error) {
	switch cgroups.Mode() {
	case cgroups.Unified:
		return &v2Driver{mount: "/sys/fs/cgroup"}, nil
	case cgroups.Legacy, cgroups.Hybrid:
		return newV1Driver()
	default:
		return nil, errors.New("container: no cgroup hierarchy mounted")
	}
}

// procsOf lists the pids in the cgroup.procs files of dirs, without
// duplicates.
func procsOf(dirs []string) []int {
	seen := map[int]bool{}
	var pids []int
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
				seen[pid] = true
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

// ---- cgroup v1 ----

type v1Hierarchy struct {
	controller string
	mount      string // where the hierarchy is mounted
}

type v1Driver struct {
	root        string // parent of the per-controller mounts (for containerd/cgroups)
	hierarchies []v1Hierarchy
	subsystems  []cgroup1.Subsystem
	memsw       bool
	v2mount     string // the cgroup v2 hierarchy of a hybrid host, or ""
}

func newV1Driver() (*v1Driver, error) {
	mounts, err := v1Mounts()
	if err != nil {
		return nil, err
	}
	d := &v1Driver{}
	seen := map[string]bool{}
	for _, c := range v1Controllers {
		m, ok := mounts[c]
		if !ok {
			return nil, fmt.Errorf("container: cgroup v1 controller %s not mounted", c)
		}
		if d.root == "" {
			d.root = filepath.Dir(m)
		}
		if !seen[m] { // co-mounted controllers (cpu,cpuacct) share one hierarchy
			seen[m] = true
			d.hierarchies = append(d.hierarchies, v1Hierarchy{controller: c, mount: m})
		}
	}
	d.subsystems = []cgroup1.Subsystem{
		cgroup1.NewCpu(d.root), cgroup1.NewCpuacct(d.root), cgroup1.NewMemory(d.root),
		cgroup1.NewPids(d.root), cgroup1.NewFreezer(d.root),
	}
	_, err = os.Stat(filepath.Join(mounts["memory"], "memory.memsw.limit_in_bytes"))
	d.memsw = err == nil
	d.v2mount = mounts[cgroup2Key]
	return d, nil
}

// cgroup2Key names the cgroup v2 mount in v1Mounts' answer.
const cgroup2Key = " cgroup2"

// v1Mounts maps each v1 controller to its mount point (and cgroup2Key to
// the cgroup v2 hierarchy's, when mounted).
func v1Mounts() (map[string]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		pre, post, ok := strings.Cut(s.Text(), " - ")
		if !ok {
			continue
		}
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) >= 5 && len(qf) >= 1 && qf[0] == "cgroup2" {
			if _, dup := out[cgroup2Key]; !dup {
				out[cgroup2Key] = pf[4]
			}
			continue
		}
		if len(pf) < 5 || len(qf) < 3 || qf[0] != "cgroup" {
			continue
		}
		for _, opt := range strings.Split(qf[2], ",") {
			if _, dup := out[opt]; !dup {
				out[opt] = pf[4]
			}
		}
	}
	return out, s.Err()
}

func (d *v1Driver) hierarchy() cgroup1.InitOpts {
	return cgroup1.WithHierarchy(func() ([]cgroup1.Subsystem, error) { return d.subsystems, nil })
}

func (d *v1Driver) create(path string, lim limits) error {
	res := &specs.LinuxResources{}
	shares := uint64(sharesLatency)
	if lim.idle {
		shares = sharesBestEffort
	}
	res.CPU = &specs.LinuxCPU{Shares: &shares}
	if lim.memoryMB > 0 {
		b := (lim.memoryMB + agentReserveMB) << 20
		res.Memory = &specs.LinuxMemory{Limit: &b}
		if d.memsw {
			res.Memory.Swap = &b
		}
	}
	if lim.pids > 0 {
		p := lim.pids + agentReservePids
		res.Pids = &specs.LinuxPids{Limit: &p}
	}
	if _, err := cgroup1.New(cgroup1.StaticPath(path), res, d.hierarchy()); err != nil {
		return fmt.Errorf("container: create cgroup %s: %w", path, err)
	}
	if err := d.createBox(path, lim); err != nil {
		return err
	}
	if u := d.unified(path); u != "" {
		if err := makeSplit(u, true); err != nil {
			return err
		}
	}
	if lim.idle {
		// Group-level SCHED_IDLE (Linux 5.15+): the whole sandbox yields
		// to non-idle siblings. Older kernels lack the file; shares and
		// the tasks' own SCHED_IDLE still apply.
		if m := d.mountOf("cpu"); m != "" {
			err := os.WriteFile(filepath.Join(m, path, "cpu.idle"), []byte("1"), 0)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("container: cpu.idle of %s: %w", path, err)
			}
		}
	}
	return nil
}

// createBox makes path's box cgroups with the sandbox's own limits.
func (d *v1Driver) createBox(path string, lim limits) error {
	for _, c := range boxControllers {
		dir := filepath.Join(d.mountOf(c), path, boxName)
		if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("container: create cgroup %s:%s: %w", c, dir, err)
		}
	}
	files := [][2]string{{"cpu", "cpu.shares=" + strconv.Itoa(boxShares)}}
	if lim.memoryMB > 0 {
		b := strconv.FormatInt(lim.memoryMB<<20, 10)
		files = append(files, [2]string{"memory", "memory.limit_in_bytes=" + b})
		if d.memsw {
			files = append(files, [2]string{"memory", "memory.memsw.limit_in_bytes=" + b})
		}
	}
	if lim.pids > 0 {
		files = append(files, [2]string{"pids", "pids.max=" + strconv.FormatInt(lim.pids, 10)})
	}
	for _, f := range files {
		name, val, _ := strings.Cut(f[1], "=")
		if err := os.WriteFile(filepath.Join(d.mountOf(f[0]), path, boxName, name), []byte(val), 0); err != nil {
			return fmt.Errorf("container: %s of %s box: %w", name, path, err)
		}
	}
	return nil
}

// boxDirs are path's box directories that exist.
func (d *v1Driver) boxDirs(path string) []string {
	var out []string
	for _, c := range boxControllers {
		p := filepath.Join(d.mountOf(c), path, boxName)
		if _, err := os.Stat(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}

func (d *v1Driver) spawnerCgroups(path string) []string {
	var out []string
	for _, c := range boxControllers {
		out = append(out, filepath.Join(d.mountOf(c), path, boxName))
	}
	return out
}

// mountOf is the mount point of controller's hierarchy, or "".
func (d *v1Driver) mountOf(controller string) string {
	for _, h := range d.hierarchies {
		if h.controller == controller {
			return h.mount
		}
	}
	return ""
}

func (d *v1Driver) unified(path string) string {
	if d.v2mount == "" {
		return ""
	}
	return filepath.Join(d.v2mount, path)
}

// dirs lists the box and split directories first: they must go before
// path's.
func (d *v1Driver) dirs(path string) []string {
	out := d.boxDirs(path)
	if u := d.unified(path); u != "" {
		out = append(out, splitDirs(u)...)
	}
	for _, h := range d.hierarchies {
		p := filepath.Join(h.mount, path)
		if _, err := os.Stat(p); err == nil {
			out = append(out, p)
		}
	}
	return out
}

func (d *v1Driver) children(parent string) ([]string, error) {
	seen := map[string]bool{}
	var names []string
	for _, h := range d.hierarchies {
		ents, err := os.ReadDir(filepath.Join(h.mount, parent))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if e.IsDir() && !seen[e.Name()] {
				seen[e.Name()] = true
				names = append(names, e.Name())
			}
		}
	}
	return names, nil
}

func (d *v1Driver) load(path string) (cgroup1.Cgroup, error) {
	cg, err := cgroup1.Load(cgroup1.StaticPath(path), d.hierarchy())
	if errors.Is(err, cgroup1.ErrCgroupDeleted) {
		return nil, os.ErrNotExist
	}
	return cg, err
}

// freezeTimeout bounds how long freeze waits for FROZEN: tasks in
// uninterruptible sleep can keep a cgroup FREEZING for a long time (and
// containerd's Freeze would wait for ever). A pause of a sandbox with much
// memory on a loaded node takes well over 200 ms; destroy, which kills the
// tasks anyway, waits only killFreezeTimeout.
const (
	freezeTimeout     = 10 * time.Second
	killFreezeTimeout = 200 * time.Millisecond
)

func (d *v1Driver) freeze(path string, within time.Duration) error {
	state := filepath.Join(d.root, "freezer", path, "freezer.state")
	if err := os.WriteFile(state, []byte("FROZEN"), 0); err != nil {
		return err
	}
	deadline := time.Now().Add(within)
	for {
		b, err := os.ReadFile(state)
		if err != nil {
			return err
		}
		if strings.TrimSpace(string(b)) == "FROZEN" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("container: cgroup %s still %s after %v", path, strings.TrimSpace(string(b)), within)
		}
		time.Sleep(time.Millisecond)
	}
}

// thaw thaws the v1 freezer and, on the unified mount, the sandbox's v2
// freezer, which the CPU gate of idle_cpu 0 sets (cpugate.go): a thaw
// restarts every process of the sandbox, whichever froze it. The trust
// split's work/, which the agent freezes for a trusted command, is left
// alone.
func (d *v1Driver) thaw(path string) error {
	if u := d.unified(path); u != "" {
		err := os.WriteFile(filepath.Join(u, "cgroup.freeze"), []byte("0"), 0)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("container: thaw %s: %w", u, err)
		}
	}
	cg, err := d.load(path)
	if err != nil {
		return err
	}
	return cg.Thaw()
}

func (d *v1Driver) remove(path string) error {
	for _, b := range d.boxDirs(path) {
		if err := os.Remove(b); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("container: remove %s: %w", b, err)
		}
	}
	if u := d.unified(path); u != "" {
		if err := removeSplit(u); err != nil {
			return err
		}
	}
	cg, err := d.load(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return cg.Delete()
}

// start uses the per-thread trick: cgroup v1 cannot clone into a cgroup,
// but a child inherits the cgroups of the thread that forks it, and Go forks
// from the calling thread. So a locked thread moves itself into the
// sandbox's cgroups, starts cmd, and moves itself back. The main thread is
// never used (it is the memory cgroup's owner of the whole process); a
// thread that cannot be moved back is left locked and so destroyed when its
// goroutine ends, instead of running edge code in a sandbox's cgroup.
func (d *v1Driver) start(path string, cmd *exec.Cmd, idle bool, owner uint32) error {
	errc := make(chan error, 1)
	var attempt func()
	attempt = func() {
		runtime.LockOSThread()
		tid := unix.Gettid()
		if tid == unix.Getpid() {
			// Hold the main thread so the retry runs on another one.
			done := make(chan struct{})
			go func() { attempt(); close(done) }()
			<-done
			runtime.UnlockOSThread()
			return
		}
		err, restored := d.startFromThread(tid, path, cmd, idle, owner)
		if restored {
			runtime.UnlockOSThread()
		}
		errc <- err
	}
	go attempt()
	return <-errc
}

// startFromThread moves thread tid into path, starts cmd and moves the
// thread back. restored reports whether the thread is back in its own
// cgroups.
func (d *v1Driver) startFromThread(tid int, path string, cmd *exec.Cmd, idle bool, owner uint32) (err error, restored bool) {
	orig, err := threadCgroups(tid)
	if err != nil {
		return err, true
	}
	tidb := []byte(strconv.Itoa(tid))
	var moved []v1Hierarchy
	defer func() {
		restored = true
		for _, h := range moved {
			back, ok := orig[h.controller]
			if !ok {
				back = "/"
			}
			if werr := os.WriteFile(filepath.Join(h.mount, back, "tasks"), tidb, 0); werr != nil {
				restored = false
				err = errors.Join(err, fmt.Errorf("container: move thread back to %s:%s: %w", h.controller, back, werr))
			}
		}
	}()
	for _, h := range d.hierarchies {
		moved = append(moved, h)
		if err := os.WriteFile(filepath.Join(h.mount, path, "tasks"), tidb, 0); err != nil {
			return fmt.Errorf("container: enter cgroup %s:%s: %w", h.controller, path, err), true
		}
	}
	if u := d.unified(path); u != "" {
		// The v2 hierarchy can clone into a cgroup (and cannot move one
		// thread): the agent is born in the trust split's parent.
		f, err := os.Open(u)
		if err != nil {
			return fmt.Errorf("container: open cgroup %s: %w", u, err), true
		}
		defer f.Close()
		cmd.SysProcAttr.UseCgroupFD = true
		cmd.SysProcAttr.CgroupFD = int(f.Fd())
	}
	if !idle {
		return startAs(cmd, owner)
	}
	return startIdle(tid, cmd, owner)
}

// startIdle starts cmd from thread tid (the calling, locked thread) under
// SCHED_IDLE: a child inherits its parent thread's scheduling policy, so
// the agent and everything it ever starts run as SCHED_IDLE. The thread's
// policy is restored afterwards; restored is false when that failed (the
// caller then discards the thread).
func startIdle(tid int, cmd *exec.Cmd, owner uint32) (err error, restored bool) {
	orig, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		return fmt.Errorf("container: sched_getattr: %w", err), true
	}
	if err := unix.SchedSetAttr(tid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0); err != nil {
		return fmt.Errorf("container: SCHED_IDLE: %w", err), true
	}
	err, restored = startAs(cmd, owner)
	orig.Size = unix.SizeofSchedAttr
	if rerr := unix.SchedSetAttr(tid, orig, 0); rerr != nil {
		return errors.Join(err, fmt.Errorf("container: restore scheduling policy: %w", rerr)), false
	}
	return err, restored
}

// threadCgroups maps each v1 controller to the cgroup of thread tid.
func threadCgroups(tid int) (map[string]string, error) {
	b, err := os.ReadFile("/proc/thread-self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("container: cgroups of thread %d: %w", tid, err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out, nil
}

// ---- cgroup v2 ----

// v2Driver writes the unified hierarchy's files directly: containerd's
// cgroup2 package needs modules (cilium/ebpf, containerd/log) this module
// does not require. It is not exercised on the hybrid test hosts.
type v2Driver struct {
	mount string
}

func (d *v2Driver) create(path string, lim limits) error {
	dir := filepath.Join(d.mount, path)
	// Enable the controllers along the way down from the root.
	parts := strings.Split(strings.Trim(path, "/"), "/")
	cur := d.mount
	for _, p := range parts {
		if err := os.WriteFile(filepath.Join(cur, "cgroup.subtree_control"), []byte("+cpu +memory +pids"), 0); err != nil {
			return fmt.Errorf("container: enable controllers in %s: %w", cur, err)
		}
		cur = filepath.Join(cur, p)
		if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("container: create cgroup %s: %w", cur, err)
		}
	}
	files := [][2]string{{"cpu.weight", "100"}}
	if lim.idle {
		files = [][2]string{{"cpu.weight", "1"}, {"cpu.idle", "1"}}
	}
	if lim.memoryMB > 0 {
		files = append(files, [2]string{"memory.max", strconv.FormatInt(lim.memoryMB<<20, 10)},
			[2]string{"memory.swap.max", "0"})
	}
	if lim.pids > 0 {
		files = append(files, [2]string{"pids.max", strconv.FormatInt(lim.pids, 10)})
	}
	for _, f := range files {
		optional := f[0] == "memory.swap.max" || f[0] == "cpu.idle"
		if err := os.WriteFile(filepath.Join(dir, f[0]), []byte(f[1]), 0); err != nil && !(optional && errors.Is(err, os.ErrNotExist)) {
			return fmt.Errorf("container: set %s of %s: %w", f[0], path, err)
		}
	}
	// The limits stay on dir (its subtree_control stays empty, so the
	// agent may live in dir beside the split's children).
	return makeSplit(dir, false)
}

// createClass makes path the best-effort class's parent (runtime.go,
// ClassBestEffort): the lowest CPU weight and cpu.idle, no limit, no split
// of its own.
func (d *v2Driver) createClass(path string) error {
	cur := d.mount
	for _, p := range strings.Split(strings.Trim(path, "/"), "/") {
		if err := os.WriteFile(filepath.Join(cur, "cgroup.subtree_control"), []byte("+cpu +memory +pids"), 0); err != nil {
			return fmt.Errorf("container: enable controllers in %s: %w", cur, err)
		}
		cur = filepath.Join(cur, p)
		if err := os.Mkdir(cur, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("container: create cgroup %s: %w", cur, err)
		}
	}
	return setIdleClass(cur, "cpu.weight", "1")
}

func (d *v2Driver) start(path string, cmd *exec.Cmd, idle bool, owner uint32) error {
	f, err := os.Open(filepath.Join(d.mount, path))
	if err != nil {
		return fmt.Errorf("container: open cgroup %s: %w", path, err)
	}
	defer f.Close()
	cmd.SysProcAttr.UseCgroupFD = true
	cmd.SysProcAttr.CgroupFD = int(f.Fd())
	if !idle && owner == 0 {
		return cmd.Start()
	}
	runtime.LockOSThread()
	var restored bool
	if idle {
		err, restored = startIdle(unix.Gettid(), cmd, owner)
	} else {
		err, restored = startAs(cmd, owner)
	}
	if restored {
		runtime.UnlockOSThread()
	}
	return err
}

func (d *v2Driver) unified(path string) string { return filepath.Join(d.mount, path) }

func (d *v2Driver) dirs(path string) []string { return splitDirs(d.unified(path)) }

func (d *v2Driver) children(parent string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(d.mount, parent))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

func (d *v2Driver) setFreeze(path, v string, within time.Duration) error {
	p := filepath.Join(d.mount, path, "cgroup.freeze")
	if err := os.WriteFile(p, []byte(v), 0); err != nil {
		return err
	}
	want := "frozen " + v
	for deadline := time.Now().Add(within); time.Now().Before(deadline); {
		b, err := os.ReadFile(filepath.Join(d.mount, path, "cgroup.events"))
		if err != nil {
			return err
		}
		if strings.Contains(string(b), want) {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
	return fmt.Errorf("container: cgroup %s: freeze=%s did not settle", path, v)
}

func (d *v2Driver) freeze(path string, within time.Duration) error {
	return d.setFreeze(path, "1", within)
}
func (d *v2Driver) thaw(path string) error { return d.setFreeze(path, "0", freezeTimeout) }

func (d *v2Driver) remove(path string) error { return removeSplit(d.unified(path)) }

// setIdleClass gives the class's cpu directory dir the lowest weight
// (weightFile) and cpu.idle. A group already idle (made by an earlier
// process) refuses a weight (EINVAL: sched_group_set_shares) and keeps it.
func setIdleClass(dir, weightFile, weight string) error {
	if b, err := os.ReadFile(filepath.Join(dir, "cpu.idle")); err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, weightFile), []byte(weight), 0); err != nil {
		return fmt.Errorf("set %s of %s: %w", weightFile, dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cpu.idle"), []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("set cpu.idle of %s: %w", dir, err)
	}
	return nil
}
