package container

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/runtime"
)

// The CPU gate (docs/architecture.md, "Density and elasticity"): a
// sandbox's CPU quota switches between its full CPU, while an operation
// runs, and its idle budget, between operations. The quota file and the
// CPU usage file stay open for the sandbox's life, so a switch is one
// pwrite (about 3 µs here, against 37 µs for open+write+close) and a
// sample one pread. Writing a quota refills the group's runtime and
// unthrottles it at once (tg_set_cfs_bandwidth), so a command sent right
// after a raise never waits for the next period.

var _ runtime.CPUGater = (*Runtime)(nil)

// minQuota is the smallest CFS quota the kernel accepts (1 ms), i.e. 1 %
// of a core at the 100 ms period: the quota of idle_cpu 0, whose sandbox
// is also frozen between operations.
const minQuota = 1000

// cpuGate is the container tier's runtime.CPUGate.
type cpuGate struct {
	quotaPath, usagePath, statPath string
	quota, usage, stat             *os.File // nil when the node is out of descriptors: paths are used
	levels                         [2][]byte
	v2                             bool
	// idle_cpu 0: the sandbox's freezer (v1 freezer.state, or the v2
	// cgroup.freeze of the sandbox's cgroup: the one pause uses, not the
	// trust split's work/, which the agent freezes for trusted commands)
	// holds it between operations, the agent too. A frozen task uses no
	// CPU at all; the thaw is synchronous (the tasks are woken when the
	// write returns).
	freezePath string
	freeze     *os.File
	freezes    [2][]byte
}

// CPUGate opens the sandbox's CPU controls.
func (r *Runtime) CPUGate(h runtime.Handle, full, idle float64) (runtime.CPUGate, error) {
	if h.Cgroup == "" {
		h.Cgroup = r.cgroupPath(h.ID)
	}
	g := &cpuGate{}
	idleQ := max(int64(idle*cfsPeriod), minQuota)
	fullQ := int64(-1)
	if full > 0 {
		fullQ = max(int64(full*cfsPeriod), minQuota)
		idleQ = min(idleQ, fullQ)
	}
	switch d := r.cg.(type) {
	case *v1Driver:
		cpu := filepath.Join(d.mountOf("cpu"), h.Cgroup)
		acct := d.mountOf("cpuacct")
		if acct == "" {
			acct = d.mountOf("cpu") // co-mounted cpu,cpuacct
		}
		g.quotaPath, g.statPath = filepath.Join(cpu, "cpu.cfs_quota_us"), filepath.Join(cpu, "cpu.stat")
		g.usagePath = filepath.Join(acct, h.Cgroup, "cpuacct.usage")
		g.levels = [2][]byte{[]byte(strconv.FormatInt(idleQ, 10)), []byte(strconv.FormatInt(fullQ, 10))}
		if err := os.WriteFile(filepath.Join(cpu, "cpu.cfs_period_us"), []byte(strconv.Itoa(cfsPeriod)), 0); err != nil {
			return nil, gateErr(h, err)
		}
		if idle <= 0 {
			if u := d.unified(h.Cgroup); u != "" {
				g.freezePath = filepath.Join(u, "cgroup.freeze")
				g.freezes = [2][]byte{[]byte("1"), []byte("0")}
			} else {
				g.freezePath = filepath.Join(d.root, "freezer", h.Cgroup, "freezer.state")
				g.freezes = [2][]byte{[]byte("FROZEN"), []byte("THAWED")}
			}
		}
	case *v2Driver:
		dir := filepath.Join(d.mount, h.Cgroup)
		g.v2 = true
		g.quotaPath, g.statPath, g.usagePath = filepath.Join(dir, "cpu.max"), filepath.Join(dir, "cpu.stat"), filepath.Join(dir, "cpu.stat")
		fq := "max"
		if fullQ > 0 {
			fq = strconv.FormatInt(fullQ, 10)
		}
		g.levels = [2][]byte{[]byte(fmt.Sprintf("%d %d", idleQ, cfsPeriod)), []byte(fmt.Sprintf("%s %d", fq, cfsPeriod))}
		if idle <= 0 {
			g.freezePath = filepath.Join(dir, "cgroup.freeze")
			g.freezes = [2][]byte{[]byte("1"), []byte("0")}
		}
	default:
		return nil, errors.New("container: no cgroup driver for a CPU gate")
	}
	var err error
	if g.quota, err = os.OpenFile(g.quotaPath, os.O_WRONLY, 0); err != nil {
		if !errors.Is(err, unix.EMFILE) && !errors.Is(err, unix.ENFILE) {
			return nil, gateErr(h, err)
		}
		g.quota = nil
	}
	for _, r := range []struct {
		f    **os.File
		path string
	}{{&g.stat, g.statPath}, {&g.usage, g.usagePath}, {&g.freeze, g.freezePath}} {
		if r.path == "" {
			continue
		}
		if g.v2 && r.f == &g.usage {
			continue // cpu.stat has the usage too
		}
		flag := os.O_RDONLY
		if r.f == &g.freeze {
			flag = os.O_WRONLY
		}
		f, err := os.OpenFile(r.path, flag, 0)
		if err != nil {
			if !errors.Is(err, unix.EMFILE) && !errors.Is(err, unix.ENFILE) {
				g.Close()
				return nil, gateErr(h, err)
			}
			continue
		}
		*r.f = f
	}
	return g, nil
}

func gateErr(h runtime.Handle, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: cgroup %s", runtime.ErrGone, h.Cgroup)
	}
	return fmt.Errorf("container: cpu gate of %s: %w", h.Cgroup, err)
}

func (g *cpuGate) Set(full bool) error {
	lvl := 0
	if full {
		lvl = 1
	}
	if full {
		// The quota first: thawed tasks find their CPU there.
		if err := writeOpen(g.quota, g.quotaPath, g.levels[lvl]); err != nil {
			return err
		}
		return g.setFrozen(lvl)
	}
	if err := g.setFrozen(lvl); err != nil {
		return err
	}
	return writeOpen(g.quota, g.quotaPath, g.levels[lvl])
}

// setFrozen writes the freezer's level, when the gate has one.
func (g *cpuGate) setFrozen(lvl int) error {
	if g.freezePath == "" {
		return nil
	}
	return writeOpen(g.freeze, g.freezePath, g.freezes[lvl])
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

func (g *cpuGate) Sample() (usage, throttled int64, err error) {
	var buf [512]byte
	stat, err := readOpen(g.stat, g.statPath, buf[:])
	if err != nil {
		return 0, 0, err
	}
	if g.v2 {
		return statField(stat, "usage_usec") * 1000, statField(stat, "throttled_usec") * 1000, nil
	}
	throttled = statField(stat, "throttled_time")
	var ubuf [32]byte
	b, err := readOpen(g.usage, g.usagePath, ubuf[:])
	if err != nil {
		return 0, 0, err
	}
	usage, err = strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
	return usage, throttled, err
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

// statField is one field of a cpu.stat text (0 when absent).
func statField(b []byte, name string) int64 {
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

func (g *cpuGate) Close() error {
	var errs []error
	for _, f := range []*os.File{g.quota, g.usage, g.stat, g.freeze} {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	g.quota, g.usage, g.stat, g.freeze = nil, nil, nil, nil
	return errors.Join(errs...)
}
