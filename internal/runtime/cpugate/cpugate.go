// Package cpugate is a sandbox's CPU gate over its cgroup's files
// (runtime.CPUGate; docs/architecture.md, "Density and elasticity"): the
// CPU quota switches between the sandbox's full CPU, while an operation
// runs, and its idle budget, between operations. The runtimes name the
// files (the container tier its sandbox's cgroup, the VM tiers QEMU's).
//
// The quota file and the CPU usage files stay open for the sandbox's life,
// so a switch is one pwrite (about 3 µs here, against 37 µs for
// open+write+close) and a sample one or two preads. Writing a quota
// refills the group's runtime and unthrottles it at once
// (tg_set_cfs_bandwidth), so a command sent right after a raise never
// waits for the next period. A gate may also set a freezer at the idle
// level (idle_cpu 0 on the container tier): frozen tasks use no CPU at
// all, and the thaw is synchronous (the tasks are woken when the write
// returns).
package cpugate

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Period is the CFS quota period, in µs (100 ms).
const Period = 100000

// MinQuota is the smallest CFS quota the kernel accepts (1 ms), i.e. 1 %
// of a core at Period.
const MinQuota = 1000

// Files are the cgroup files of one gate.
type Files struct {
	// Quota is cpu.cfs_quota_us (cgroup v1) or cpu.max (v2).
	Quota string
	// Stat is cpu.stat (throttled time; on v2 the usage too).
	Stat string
	// Usage is cpuacct.usage on v1; "" on v2, or where the group has no
	// cpuacct (its usage then reads 0).
	Usage string
	// V2 says the files are cgroup v2's.
	V2 bool
	// Freeze, when set, is the freezer file the idle level freezes:
	// v1's freezer.state, or a v2 cgroup.freeze (FreezeV2).
	Freeze   string
	FreezeV2 bool
}

// Gate is one sandbox's gate. Its methods are not safe for concurrent use.
type Gate struct {
	files                        Files
	quota, usage, stat, freezeFD *os.File // nil when the node is out of descriptors: paths are used
	levels                       [2][]byte
}

// The freezer files' values for the idle and the full level.
var (
	freezesV1 = [2][]byte{[]byte("FROZEN"), []byte("THAWED")}
	freezesV2 = [2][]byte{[]byte("1"), []byte("0")}
)

// Levels are the quota file's contents for the idle and the full level,
// in cores: full 0 is unlimited, and neither is below MinQuota (nor idle
// above full).
func Levels(full, idle float64, v2 bool) [2][]byte {
	idleQ := max(int64(idle*Period), MinQuota)
	fullQ := int64(-1)
	if full > 0 {
		fullQ = max(int64(full*Period), MinQuota)
		idleQ = min(idleQ, fullQ)
	}
	if !v2 {
		return [2][]byte{[]byte(strconv.FormatInt(idleQ, 10)), []byte(strconv.FormatInt(fullQ, 10))}
	}
	fq := "max"
	if fullQ > 0 {
		fq = strconv.FormatInt(fullQ, 10)
	}
	return [2][]byte{[]byte(fmt.Sprintf("%d %d", idleQ, Period)), []byte(fmt.Sprintf("%s %d", fq, Period))}
}

// Open opens f's files with the levels full and idle, in cores (Levels).
// An error wraps the open's (os.ErrNotExist: the cgroup is gone).
func Open(f Files, full, idle float64) (*Gate, error) {
	g := &Gate{files: f, levels: Levels(full, idle, f.V2)}
	for _, o := range []struct {
		fd   **os.File
		path string
		flag int
	}{{&g.quota, f.Quota, os.O_WRONLY}, {&g.stat, f.Stat, os.O_RDONLY}, {&g.usage, f.Usage, os.O_RDONLY}, {&g.freezeFD, f.Freeze, os.O_WRONLY}} {
		if o.path == "" {
			continue
		}
		fd, err := os.OpenFile(o.path, o.flag, 0)
		if err != nil {
			if !errors.Is(err, unix.EMFILE) && !errors.Is(err, unix.ENFILE) {
				g.Close()
				return nil, err
			}
			continue // the paths are used
		}
		*o.fd = fd
	}
	return g, nil
}

// Set gives the sandbox its full CPU (true) or its idle budget (false).
// The raise writes the quota before it thaws, so thawed tasks find their
// CPU there.
func (g *Gate) Set(full bool) error {
	lvl := 0
	if full {
		lvl = 1
	}
	if full {
		if err := writeOpen(g.quota, g.files.Quota, g.levels[lvl]); err != nil {
			return err
		}
		return g.setFrozen(lvl)
	}
	if err := g.setFrozen(lvl); err != nil {
		return err
	}
	return writeOpen(g.quota, g.files.Quota, g.levels[lvl])
}

// setFrozen writes the freezer's level, when the gate has one.
func (g *Gate) setFrozen(lvl int) error {
	if g.files.Freeze == "" {
		return nil
	}
	v := freezesV1[lvl]
	if g.files.FreezeV2 {
		v = freezesV2[lvl]
	}
	return writeOpen(g.freezeFD, g.files.Freeze, v)
}

// Sample reads the group's cumulative CPU time and how long its tasks were
// throttled, in nanoseconds.
func (g *Gate) Sample() (usage, throttled int64, err error) {
	var buf [512]byte
	stat, err := readOpen(g.stat, g.files.Stat, buf[:])
	if err != nil {
		return 0, 0, err
	}
	if g.files.V2 {
		return StatField(stat, "usage_usec") * 1000, StatField(stat, "throttled_usec") * 1000, nil
	}
	throttled = StatField(stat, "throttled_time")
	if g.files.Usage == "" {
		return 0, throttled, nil
	}
	var ubuf [32]byte
	b, err := readOpen(g.usage, g.files.Usage, ubuf[:])
	if err != nil {
		return 0, 0, err
	}
	usage, err = strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	return usage, throttled, err
}

// Close closes the gate's files (the levels stay as they are).
func (g *Gate) Close() error {
	var errs []error
	for _, f := range []*os.File{g.quota, g.usage, g.stat, g.freezeFD} {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	g.quota, g.usage, g.stat, g.freezeFD = nil, nil, nil, nil
	return errors.Join(errs...)
}

// readOpen reads a small cgroup file through its open descriptor f (or
// its path when f is nil) into buf.
func readOpen(f *os.File, path string, buf []byte) ([]byte, error) {
	if f == nil {
		return os.ReadFile(path)
	}
	n, err := unix.Pread(int(f.Fd()), buf, 0)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// writeOpen writes a small cgroup file through its open descriptor f (or
// its path when f is nil).
func writeOpen(f *os.File, path string, v []byte) error {
	if f == nil {
		return os.WriteFile(path, v, 0)
	}
	_, err := unix.Pwrite(int(f.Fd()), v, 0)
	return err
}

// StatField is one field of a cpu.stat text (0 when absent).
func StatField(b []byte, name string) int64 {
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if v, ok := bytes.CutPrefix(line, []byte(name)); ok && len(v) > 0 && v[0] == ' ' {
			n, _ := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			return n
		}
	}
	return 0
}
