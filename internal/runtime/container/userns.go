package container

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/confine"
	"github.com/warrenhq/warren/internal/runtime"
)

// User namespaces. Each sandbox's root is the first id of a range of
// RangeSize host ids of its own (uid and gid alike), so per-user kernel
// budgets (POSIX message queues, pipe buffers, inotify, RLIMIT_NPROC,
// pending signals) count per sandbox, and whatever escapes is an
// unprivileged user on the host. Ranges are IDBase + i*RangeSize for i in
// [0, IDRanges). The kernel is the record of which are in use: a live
// agent's /proc/<pid>/uid_map names its range, so after a crash of the edge
// Leftovers and Attach reserve the ranges of the sandboxes that survived.
//
// The layers are idmapped for a sandbox through a user namespace with its
// range's map (confine.MountRoot) before the agent is cloned, so that the
// agent gets its root as an inherited mount. One such namespace is kept per
// range once used (a descriptor; made by a child stopped at its exec, ~1 ms
// on a quiet host); freed ranges that have one are handed out first, and
// refill keeps warmRanges free ranges with one made ahead, in the
// background.
//
// Lock order: Runtime.mu, then idRanges.mu (never the other way).

// RangeSize is the number of host ids of one sandbox (ids 0..65535 inside).
const RangeSize = 65536

// Defaults of Config.IDBase and Config.IDRanges: ranges from 2^20 (above
// the usual /etc/subuid allocations of login users), 16,384 of them.
const (
	DefaultIDBase   = 1 << 20
	DefaultIDRanges = 16384
)

// idRanges hands out ranges of host ids, one per sandbox.
type idRanges struct {
	base  uint32
	count int
	agent string // agent binary, the child whose user namespace is kept

	mu      sync.Mutex
	owner   map[int]string // range index -> sandbox id
	next    int            // where the search for a free range starts
	userns  map[int]int    // range index -> descriptor of a user namespace with its map
	warm    []int          // free ranges that have one (used first: no new namespace to make)
	filling bool           // a refill goroutine runs
	closed  bool
}

// warmRanges is how many free ranges refill keeps ready with their user
// namespace made, so that a create never waits for one (a child stopped at
// exec: ~1 ms on a quiet host, tens under load).
const warmRanges = 8

func newIDRanges(base uint32, count int, agent string) (*idRanges, error) {
	if base == 0 || count <= 0 {
		return nil, fmt.Errorf("container: id ranges need a base > 0 and a count > 0 (got %d, %d)", base, count)
	}
	if uint64(base)+uint64(count)*RangeSize > 1<<32-2 {
		return nil, fmt.Errorf("container: %d id ranges from %d pass the last uid", count, base)
	}
	// The search starts at a random range: several runtimes on one host
	// (tests; edges that share a base by mistake) then rarely meet.
	return &idRanges{base: base, count: count, agent: agent, owner: map[int]string{}, userns: map[int]int{},
		next: rand.IntN(count)}, nil
}

// alloc reserves a free range for sandbox id and returns its first host id,
// and has the ranges that wait warm refilled in the background.
func (r *idRanges) alloc(id string) (uint32, error) {
	defer func() { go r.refill() }()
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.warm) > 0 {
		i := r.warm[len(r.warm)-1]
		r.warm = r.warm[:len(r.warm)-1]
		if _, used := r.owner[i]; !used {
			r.owner[i] = id
			return r.base + uint32(i)*RangeSize, nil
		}
	}
	if i, ok := r.freeLocked(); ok {
		r.owner[i] = id
		r.next = (i + 1) % r.count
		return r.base + uint32(i)*RangeSize, nil
	}
	return 0, fmt.Errorf("container: all %d id ranges are in use", r.count)
}

// freeLocked finds a free range without a kept user namespace, from next.
func (r *idRanges) freeLocked() (int, bool) {
	for n := 0; n < r.count; n++ {
		i := (r.next + n) % r.count
		_, used := r.owner[i]
		_, made := r.userns[i]
		if !used && !made {
			return i, true
		}
	}
	return 0, false
}

// refill makes user namespaces for free ranges until warmRanges wait.
// It runs in a goroutine of its own, one at a time.
func (r *idRanges) refill() {
	r.mu.Lock()
	if r.filling {
		r.mu.Unlock()
		return
	}
	r.filling = true
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.filling = false
		r.mu.Unlock()
	}()
	for {
		r.mu.Lock()
		if len(r.warm) >= warmRanges || r.closed {
			r.mu.Unlock()
			return
		}
		i, ok := r.freeLocked()
		r.next = (i + 1) % r.count
		r.mu.Unlock()
		if !ok {
			return
		}
		fd, err := newUserns(r.agent, r.base+uint32(i)*RangeSize)
		if err != nil {
			return // the next Start makes its own and reports the error
		}
		r.mu.Lock()
		_, made := r.userns[i]
		if made || r.closed {
			unix.Close(fd)
		} else {
			r.userns[i] = fd
			if _, used := r.owner[i]; !used {
				r.warm = append(r.warm, i)
			}
		}
		r.mu.Unlock()
	}
}

// index is the range that starts at host id first; false if none does.
func (r *idRanges) index(first uint32) (int, bool) {
	if first < r.base || (first-r.base)%RangeSize != 0 {
		return 0, false
	}
	i := int((first - r.base) / RangeSize)
	return i, i < r.count
}

// reserve marks the range at first as sandbox id's (a sandbox found alive
// after a restart). It fails when another sandbox holds it.
func (r *idRanges) reserve(first uint32, id string) error {
	i, ok := r.index(first)
	if !ok {
		return fmt.Errorf("container: host id %d starts no range of this node", first)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if o, used := r.owner[i]; used && o != id {
		return fmt.Errorf("container: id range %d is %s's, not %s's", first, o, id)
	}
	r.owner[i] = id
	return nil
}

// free releases the range at first when sandbox id holds it (Destroy may
// run twice, and the range may belong to another sandbox by then).
func (r *idRanges) free(first uint32, id string) {
	i, ok := r.index(first)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.owner[i] == id {
		delete(r.owner, i)
		if _, ok := r.userns[i]; ok {
			r.warm = append(r.warm, i)
		}
	}
}

// inUse is how many ranges are held.
func (r *idRanges) inUse() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.owner)
}

// usernsOf returns a descriptor (kept by r) of a user namespace whose map
// is the range at first.
func (r *idRanges) usernsOf(first uint32) (int, error) {
	i, ok := r.index(first)
	if !ok {
		return -1, fmt.Errorf("container: host id %d starts no range of this node", first)
	}
	r.mu.Lock()
	fd, ok := r.userns[i]
	r.mu.Unlock()
	if ok {
		return fd, nil
	}
	fd, err := newUserns(r.agent, first)
	if err != nil {
		return -1, err
	}
	r.mu.Lock()
	if old, ok := r.userns[i]; ok {
		unix.Close(fd)
		fd = old
	} else {
		r.userns[i] = fd
	}
	r.mu.Unlock()
	return fd, nil
}

// close releases the kept user namespaces.
func (r *idRanges) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, fd := range r.userns {
		unix.Close(fd)
		delete(r.userns, i)
	}
	r.warm = nil
	r.closed = true
}

// idMaps is the map of the range at first: ids 0..RangeSize-1 inside.
func idMaps(first uint32) []syscall.SysProcIDMap {
	return []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(first), Size: RangeSize}}
}

// newUserns makes a user namespace mapped to the range at first and
// returns a descriptor of it: a child of binary (never run: it stops at
// its exec, traced) is cloned into it, the namespace is opened and the
// child killed. The descriptor keeps the namespace.
func newUserns(binary string, first uint32) (int, error) {
	cmd := &exec.Cmd{
		Path: binary,
		Args: []string{"warren-userns"},
		Env:  []string{},
		SysProcAttr: &syscall.SysProcAttr{
			Cloneflags:  syscall.CLONE_NEWUSER,
			UidMappings: idMaps(first),
			GidMappings: idMaps(first),
			Ptrace:      true, // stops at the exec: the binary never runs
			Pdeathsig:   syscall.SIGKILL,
		},
	}
	if err := cmd.Start(); err != nil {
		return -1, fmt.Errorf("container: user namespace for ids %d: %w", first, err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	fd, err := unix.Open("/proc/"+strconv.Itoa(cmd.Process.Pid)+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("container: open user namespace: %w", err)
	}
	return fd, nil
}

// rangeOf reads the first host id that pid's user namespace maps id 0 to;
// false when pid is in the host's (an identity map) or has no such map.
func rangeOf(pid int) (uint32, bool) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/uid_map")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fs := strings.Fields(s.Text())
		if len(fs) != 3 || fs[0] != "0" {
			continue
		}
		host, err1 := strconv.ParseUint(fs[1], 10, 32)
		n, err2 := strconv.ParseUint(fs[2], 10, 32)
		if err1 != nil || err2 != nil || (host == 0 && n == 1<<32-1) {
			return 0, false
		}
		return uint32(host), true
	}
	return 0, false
}

// agentFD makes the copy of the agent binary that sandboxes' agents are
// started from (through /proc/self/fd/N): a sealed memfd, mode 0711,
// opened read-only. Two reasons:
//   - the agent starts as an unprivileged host user, which may not search
//     the directories on the way to the binary (a 0700 temporary directory);
//   - a binary its user may execute but not read makes the kernel tie the
//     agent's memory to the host's user namespace (exec's would_dump), so
//     the agent is not dumpable and its /proc/1 files belong to host root,
//     not to the sandbox's root: the sandbox's root cannot list /proc/1/fd
//     (or trace or read the agent). Sealed, nothing can change the copy.
//
// The descriptor is close-on-exec; each start passes it to the agent's
// child at a known number (inUserns).
func agentFD(path string) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("container: open agent: %w", err)
	}
	defer src.Close()
	mfd, err := unix.MemfdCreate("warren-agent", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("container: memfd for the agent: %w", err)
	}
	mem := os.NewFile(uintptr(mfd), "warren-agent")
	defer mem.Close()
	if _, err := io.Copy(mem, src); err != nil {
		return nil, fmt.Errorf("container: copy the agent: %w", err)
	}
	if err := mem.Chmod(0o711); err != nil {
		return nil, fmt.Errorf("container: chmod the agent's copy: %w", err)
	}
	const seals = unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(mem.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		return nil, fmt.Errorf("container: seal the agent's copy: %w", err)
	}
	// A file open for writing cannot be executed (ETXTBSY): reopen it
	// read-only and let the writable descriptor go.
	ro, err := unix.Open("/proc/self/fd/"+strconv.Itoa(mfd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("container: reopen the agent's copy: %w", err)
	}
	return os.NewFile(uintptr(ro), "warren-agent"), nil
}

// probeUsernsFn is probeUserns (tests replace it with a kernel that cannot).
var probeUsernsFn = probeUserns

// probeUserns checks that this kernel runs sandboxes in user namespaces:
// it makes one mapped to the first range and idmaps a fresh tmpfs through
// it (idmapped tmpfs: Linux 6.3; EROFS and overlayfs over idmapped layers:
// 5.19).
func probeUserns(r *idRanges) error {
	fd, err := newUserns(r.agent, r.base)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	fsfd, err := unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen tmpfs: %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fmt.Errorf("create tmpfs: %w", err)
	}
	m, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("fsmount tmpfs: %w", err)
	}
	defer unix.Close(m)
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(fd)}
	if err := unix.MountSetattr(m, "", unix.AT_EMPTY_PATH, attr); err != nil {
		return fmt.Errorf("idmapped mounts unsupported: %w", err)
	}
	return nil
}

// userRoot prepares the root of a sandbox whose root is host id base:
// its writable layer's root directory becomes base's, and the overlay and
// the bind sources are mounted, idmapped, detached (confine.MountRoot).
// setup is changed to take them as inherited descriptors (first the root,
// then the binds); the files are returned in that order, to follow the
// other ExtraFiles of exec.Cmd from descriptor first on.
func (r *Runtime) userRoot(spec *runtime.Spec, base uint32, setup *agentproto.SetupConfig, first int) (files []*os.File, err error) {
	usfd, err := r.ids.usernsOf(base)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			closeFiles(files)
			files = nil
		}
	}()
	if spec.Upper != "" {
		if err := confine.OwnRoot(spec.Upper, base); err != nil {
			return nil, err
		}
	}
	// The agent's spawner thread joins the box (cgroups.go) itself, as the
	// range's root: delegate the box's tasks files to it. Nothing inside
	// can reach them (no cgroupfs is mounted there).
	for _, d := range setup.SpawnerCgroups {
		if err := os.Lchown(filepath.Join(d, "tasks"), int(base), int(base)); err != nil {
			return nil, fmt.Errorf("container: delegate %s: %w", d, err)
		}
	}
	mfd, err := confine.MountRoot(&confine.RootConfig{Lowers: spec.Lowers, Upper: spec.Upper, Work: spec.Work, UsernsFD: usfd})
	if err != nil {
		return nil, err
	}
	files = append(files, os.NewFile(uintptr(mfd), "root"))
	setup.RootFD = first
	setup.Binds = slices.Clone(spec.Binds)
	for i := range setup.Binds {
		fd, err := confine.IDMapped(setup.Binds[i].Source, usfd,
			unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
		if err != nil {
			return nil, err
		}
		files = append(files, os.NewFile(uintptr(fd), setup.Binds[i].Source))
		setup.Binds[i].FD = first + 1 + i
	}
	return files, nil
}

// inUserns makes cmd start the agent in a new user namespace mapped to the
// range at base, as its root, with mounts inherited after its other extra
// files (the agent keeps all of them: agentproto.KeepFDsEnv).
//
// The agent is exec'd from its sealed copy passed as the last extra file,
// through the number it gets in the child (3 + its index), not through
// the edge's own number: os/exec's child moves its status pipe to one past
// the highest descriptor passed, over whatever the edge has there (it was
// the copy when a passed file happened to be numbered right below it: the
// exec then found a pipe, "permission denied"). The agent closes the copy
// first thing (it is not among the kept ones and not close-on-exec).
func (r *Runtime) inUserns(cmd *exec.Cmd, base uint32, mounts []*os.File) {
	cmd.ExtraFiles = append(cmd.ExtraFiles, mounts...)
	keep := len(cmd.ExtraFiles) - 1 // after the listener
	cmd.ExtraFiles = append(cmd.ExtraFiles, r.agentExe)
	cmd.Path = "/proc/self/fd/" + strconv.Itoa(3+len(cmd.ExtraFiles)-1)
	cmd.Args = []string{"warren-agent"}
	cmd.Env = append(cmd.Env, agentproto.KeepFDsEnv+"="+strconv.Itoa(keep))
	a := cmd.SysProcAttr
	a.Cloneflags |= syscall.CLONE_NEWUSER
	a.UidMappings, a.GidMappings = idMaps(base), idMaps(base)
	a.GidMappingsEnableSetgroups = true // the agent switches users
	a.Credential = &syscall.Credential{Uid: 0, Gid: 0}
}

// reserveRange records the range of a sandbox found alive (Leftovers).
func (r *Runtime) reserveRange(h *runtime.Handle) {
	base, ok := rangeOf(h.Pid)
	if !ok {
		return
	}
	h.IDBase = base
	if r.ids == nil {
		return
	}
	if err := r.ids.reserve(base, h.ID); err != nil {
		r.log.Warn("container: id range of a leftover sandbox", "id", h.ID, "err", err)
	}
}

// startAs starts cmd from the calling thread (locked to its goroutine) with
// the thread's effective uid set to owner (0: as it is), and sets it back.
// The kernel makes the effective uid of the thread that clones a user
// namespace its owner, and charges the namespace's users' per-user counts
// (ucounts: message queue bytes, pending signals, inotify instances and
// watches, user namespaces) to the owner as well, against limits taken
// from the owner's at that moment. Owned by host root, every sandbox would
// share root's: A's message queues made B's mq_open fail (EMFILE). Owned by
// its range's first id, each sandbox has budgets of its own. The thread
// keeps its capabilities across the switch (SECBIT_NO_SETUID_FIXUP), so
// exec.Cmd can still write the id maps. restored is false when the thread
// could not be set back (the caller then lets it end).
func startAs(cmd *exec.Cmd, owner uint32) (err error, restored bool) {
	if owner == 0 {
		return cmd.Start(), true
	}
	bits, err := unix.PrctlRetInt(unix.PR_GET_SECUREBITS, 0, 0, 0, 0)
	if err != nil {
		return fmt.Errorf("container: get securebits: %w", err), true
	}
	if err := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits)|secbitNoSetuidFixup, 0, 0, 0); err != nil {
		return fmt.Errorf("container: keep capabilities: %w", err), true
	}
	// The raw syscall changes this thread only (glibc's and Go's setresuid
	// change every thread).
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), uintptr(owner), ^uintptr(0)); e != 0 {
		err = fmt.Errorf("container: switch to owner %d: %w", owner, e)
	} else {
		err = cmd.Start()
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ^uintptr(0), 0, ^uintptr(0)); e != 0 {
			return errors.Join(err, fmt.Errorf("container: switch back to root: %w", e)), false
		}
	}
	if perr := unix.Prctl(unix.PR_SET_SECUREBITS, uintptr(bits), 0, 0, 0); perr != nil {
		return errors.Join(err, fmt.Errorf("container: restore securebits: %w", perr)), false
	}
	return err, unix.Geteuid() == 0
}

// secbitNoSetuidFixup keeps a thread's capabilities when its uids change.
const secbitNoSetuidFixup = 1 << 2
