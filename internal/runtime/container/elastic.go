package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/hoststat"
	"github.com/warrenhq/warren/internal/runtime"
)

var (
	_ runtime.Reclaimer            = (*Runtime)(nil)
	_ runtime.UsageReporter        = (*Runtime)(nil)
	_ runtime.SandboxUsageReporter = (*Runtime)(nil)
)

// pausedSlack is the headroom above the reclaimed usage that a paused
// sandbox's memory limit keeps (page-aligned; frozen tasks do not fault).
const pausedSlack = 1 << 20

// Reclaim pushes a (frozen) sandbox's memory out: anonymous pages to swap,
// page cache dropped; then it lowers the memory limit to what is left so
// nothing grows back until Restore.
func (r *Runtime) Reclaim(ctx context.Context, h runtime.Handle) (before, after int64, err error) {
	if h.Cgroup == "" {
		h.Cgroup = r.cgroupPath(h.ID)
	}
	before, after, err = r.cg.reclaim(h.Cgroup)
	if errors.Is(err, os.ErrNotExist) {
		err = fmt.Errorf("%w: cgroup %s", runtime.ErrGone, h.Cgroup)
	}
	return before, after, err
}

// Restore sets the sandbox's memory limit back to memoryMB.
func (r *Runtime) Restore(ctx context.Context, h runtime.Handle, memoryMB int64) error {
	if h.Cgroup == "" {
		h.Cgroup = r.cgroupPath(h.ID)
	}
	err := r.cg.setMemoryLimit(h.Cgroup, memoryMB<<20)
	if errors.Is(err, os.ErrNotExist) {
		err = fmt.Errorf("%w: cgroup %s", runtime.ErrGone, h.Cgroup)
	}
	return err
}

// Usage measures every sandbox of this runtime together (the parent cgroup).
func (r *Runtime) Usage() (runtime.Usage, error) {
	ns, mem, err := r.cg.usage(r.cfg.CgroupParent)
	if errors.Is(err, os.ErrNotExist) {
		return runtime.Usage{}, nil // no sandbox yet
	}
	return runtime.Usage{CPUSeconds: float64(ns) / 1e9, MemoryBytes: mem}, err
}

// MemoryUsage is the memory charged to one sandbox now, in bytes.
func (r *Runtime) MemoryUsage(h runtime.Handle) (int64, error) {
	if h.Cgroup == "" {
		h.Cgroup = r.cgroupPath(h.ID)
	}
	_, mem, err := r.cg.usage(h.Cgroup)
	return mem, err
}

// SandboxUsage measures one sandbox: the CPU time its container used and
// the memory charged to it now.
func (r *Runtime) SandboxUsage(h runtime.Handle) (runtime.Usage, error) {
	if h.Cgroup == "" {
		h.Cgroup = r.cgroupPath(h.ID)
	}
	ns, mem, err := r.cg.usage(h.Cgroup)
	if errors.Is(err, os.ErrNotExist) {
		err = fmt.Errorf("%w: cgroup %s", runtime.ErrGone, h.Cgroup)
	}
	return runtime.Usage{CPUSeconds: float64(ns) / 1e9, MemoryBytes: mem}, err
}

// coreCookie gives a latency sandbox's agent its own core-scheduling
// cookie where the kernel supports it (children inherit it).
func (r *Runtime) coreCookie(pid int) {
	if !r.coreSched {
		return
	}
	if err := hoststat.CreateCoreCookie(pid); err != nil {
		r.log.Warn("container: core-scheduling cookie", "pid", pid, "err", err)
	}
}

func readInt(p string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// ---- cgroup v1 ----

func (d *v1Driver) memDir(path string) string { return filepath.Join(d.mountOf("memory"), path) }

func (d *v1Driver) reclaim(path string) (before, after int64, err error) {
	dir := d.memDir(path)
	if before, err = readInt(filepath.Join(dir, "memory.usage_in_bytes")); err != nil {
		return 0, 0, err
	}
	// Prefer swapping anonymous memory out over keeping it.
	_ = os.WriteFile(filepath.Join(dir, "memory.swappiness"), []byte("100"), 0)
	// force_empty reclaims every page it can (to swap, or dropped if clean
	// page cache) and returns once no more progress is made.
	if err := os.WriteFile(filepath.Join(dir, "memory.force_empty"), []byte("0"), 0); err != nil {
		return before, 0, fmt.Errorf("container: force_empty %s: %w", path, err)
	}
	if after, err = readInt(filepath.Join(dir, "memory.usage_in_bytes")); err != nil {
		return before, 0, err
	}
	limit := (after + pausedSlack + 4095) &^ 4095
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		// Not fatal: the memory is out; only the cap did not stick.
		return before, after, nil
	}
	after, _ = readInt(filepath.Join(dir, "memory.usage_in_bytes"))
	return before, after, nil
}

func (d *v1Driver) setMemoryLimit(path string, b int64) error {
	dir := d.memDir(path)
	// Back to the swappiness a new cgroup gets (its parent's): reclaim
	// raised it, and a container is reused for later sandboxes.
	if v, err := os.ReadFile(filepath.Join(filepath.Dir(dir), "memory.swappiness")); err == nil {
		_ = os.WriteFile(filepath.Join(dir, "memory.swappiness"), bytes.TrimSpace(v), 0)
	}
	// The box gets the limit, the sandbox's cgroup (the agent's too) the
	// limit and the agent's reserve; the box first, so that a lower limit
	// reclaims (or OOM-kills) in the box, never the agent.
	box := filepath.Join(dir, boxName, "memory.limit_in_bytes")
	if err := os.WriteFile(box, []byte(strconv.FormatInt(b, 10)), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(strconv.FormatInt(b+agentReserveMB<<20, 10)), 0)
}

func (d *v1Driver) setCPULimit(path string, cores float64) error {
	dir := filepath.Join(d.mountOf("cpu"), path)
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.Itoa(cfsPeriod)), 0); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.FormatInt(int64(cores*cfsPeriod), 10)), 0)
}

func (d *v1Driver) usage(path string) (cpuNs, mem int64, err error) {
	mem, err = readInt(filepath.Join(d.memDir(path), "memory.usage_in_bytes"))
	if err != nil {
		return 0, 0, err
	}
	cpuNs, err = readInt(filepath.Join(d.mountOf("cpuacct"), path, "cpuacct.usage"))
	return cpuNs, mem, err
}

// ---- cgroup v2 ----

func (d *v2Driver) reclaim(path string) (before, after int64, err error) {
	dir := filepath.Join(d.mount, path)
	if before, err = readInt(filepath.Join(dir, "memory.current")); err != nil {
		return 0, 0, err
	}
	// memory.reclaim stops at what it cannot reclaim (EAGAIN); that is fine.
	_ = os.WriteFile(filepath.Join(dir, "memory.reclaim"), []byte(strconv.FormatInt(before, 10)), 0)
	after, err = readInt(filepath.Join(dir, "memory.current"))
	if err != nil {
		return before, 0, err
	}
	_ = os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("max"), 0)
	_ = os.WriteFile(filepath.Join(dir, "memory.high"), []byte(strconv.FormatInt((after+pausedSlack+4095)&^4095, 10)), 0)
	return before, after, nil
}

func (d *v2Driver) setCPULimit(path string, cores float64) error {
	return os.WriteFile(filepath.Join(d.mount, path, "cpu.max"), []byte(fmt.Sprintf("%d %d", int64(cores*cfsPeriod), cfsPeriod)), 0)
}

func (d *v2Driver) setMemoryLimit(path string, b int64) error {
	dir := filepath.Join(d.mount, path)
	if err := os.WriteFile(filepath.Join(dir, "memory.high"), []byte("max"), 0); err != nil {
		return err
	}
	_ = os.WriteFile(filepath.Join(dir, "memory.swap.max"), []byte("0"), 0)
	return os.WriteFile(filepath.Join(dir, "memory.max"), []byte(strconv.FormatInt(b, 10)), 0)
}

// spawnerCgroups: cgroup v2 has no box (a cgroup with processes cannot
// have controller-enabled children, and a thread cannot leave its
// process's cgroup outside threaded mode); the agent shares its sandbox's
// limits there.
func (d *v2Driver) spawnerCgroups(path string) []string { return nil }

func (d *v2Driver) usage(path string) (cpuNs, mem int64, err error) {
	dir := filepath.Join(d.mount, path)
	mem, err = readInt(filepath.Join(dir, "memory.current"))
	if err != nil {
		return 0, 0, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return 0, mem, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return us * 1000, mem, nil
		}
	}
	return 0, mem, nil
}

// Prefetch starts reading a resumed sandbox's swapped-out anonymous memory
// back ahead of use: process_madvise(MADV_WILLNEED) over every private
// anonymous mapping of the agent (rest false) or of every other process of
// the sandbox (rest true), which on an anonymous range is swap readahead
// of the pages it holds in swap. It returns once the reads are queued (not
// done) with the bytes advised. Call it after Restore raised the memory
// limit: pages read back are charged to the sandbox again.
func (r *Runtime) Prefetch(ctx context.Context, h runtime.Handle, rest bool) (int64, error) {
	if h.Cgroup == "" {
		h.Cgroup = r.cgroupPath(h.ID)
	}
	pids := []int{h.Pid}
	if rest {
		pids = slices.DeleteFunc(procsOf(r.cg.dirs(h.Cgroup)), func(p int) bool { return p == h.Pid })
	}
	var total int64
	var firstErr error
	for _, pid := range pids {
		if ctx.Err() != nil {
			return total, ctx.Err()
		}
		n, err := prefetchProcess(pid)
		total += n
		if err != nil && firstErr == nil && !errors.Is(err, unix.ESRCH) && !errors.Is(err, os.ErrNotExist) {
			firstErr = fmt.Errorf("container: prefetch pid %d: %w", pid, err)
		}
	}
	return total, firstErr
}

// prefetchProcess advises MADV_WILLNEED on pid's private anonymous
// mappings (heap, stacks, anonymous mmaps).
func prefetchProcess(pid int) (int64, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(pidfd)
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/maps")
	if err != nil {
		return 0, err
	}
	iovs := anonRanges(b)
	var total int64
	for len(iovs) > 0 {
		k := min(len(iovs), 512) // below UIO_MAXIOV
		n, _, errno := unix.Syscall6(unix.SYS_PROCESS_MADVISE, uintptr(pidfd),
			uintptr(unsafe.Pointer(&iovs[0])), uintptr(k), unix.MADV_WILLNEED, 0, 0)
		if errno != 0 {
			return total, errno
		}
		total += int64(n)
		iovs = iovs[k:]
	}
	return total, nil
}

// remoteIovec is a struct iovec naming memory of another process: an
// address there, never dereferenced here.
type remoteIovec struct {
	Base uintptr
	Len  uintptr
}

// anonRanges picks the private anonymous mappings out of a /proc/PID/maps
// text: no backing inode, private, and not one of the kernel's special
// mappings ([vdso], [vvar], [vsyscall]).
func anonRanges(maps []byte) []remoteIovec {
	var out []remoteIovec
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || len(f[1]) < 4 || f[1][3] != 'p' || f[4] != "0" {
			continue
		}
		if len(f) >= 6 && f[5] != "[heap]" && f[5] != "[stack]" && !strings.HasPrefix(f[5], "[anon") {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		out = append(out, remoteIovec{Base: uintptr(start), Len: uintptr(end - start)})
	}
	return out
}
