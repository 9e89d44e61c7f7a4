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
// of a core at the 100 ms period: what idle_cpu 0 gets.
const minQuota = 1000

// cpuGate is the container tier's runtime.CPUGate.
type cpuGate struct {
	quotaPath, usagePath, statPath string
	quota, usage                   *os.File // nil when the node is out of descriptors: paths are used
	levels                         [2][]byte
	v2                             bool
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
	case *v2Driver:
		dir := filepath.Join(d.mount, h.Cgroup)
		g.v2 = true
		g.quotaPath, g.statPath, g.usagePath = filepath.Join(dir, "cpu.max"), filepath.Join(dir, "cpu.stat"), filepath.Join(dir, "cpu.stat")
		fq := "max"
		if fullQ > 0 {
			fq = strconv.FormatInt(fullQ, 10)
		}
		g.levels = [2][]byte{[]byte(fmt.Sprintf("%d %d", idleQ, cfsPeriod)), []byte(fmt.Sprintf("%s %d", fq, cfsPeriod))}
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
	if g.usage, err = os.Open(g.usagePath); err != nil {
		if !errors.Is(err, unix.EMFILE) && !errors.Is(err, unix.ENFILE) {
			g.Close()
			return nil, gateErr(h, err)
		}
		g.usage = nil
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
	v := g.levels[0]
	if full {
		v = g.levels[1]
	}
	if g.quota == nil {
		return os.WriteFile(g.quotaPath, v, 0)
	}
	_, err := unix.Pwrite(int(g.quota.Fd()), v, 0)
	return err
}

func (g *cpuGate) Usage() (int64, error) {
	if g.v2 {
		return g.statField("usage_usec", 1000)
	}
	var buf [32]byte
	var b []byte
	if g.usage == nil {
		var err error
		if b, err = os.ReadFile(g.usagePath); err != nil {
			return 0, err
		}
	} else {
		n, err := unix.Pread(int(g.usage.Fd()), buf[:], 0)
		if err != nil {
			return 0, err
		}
		b = buf[:n]
	}
	return strconv.ParseInt(string(bytes.TrimSpace(b)), 10, 64)
}

func (g *cpuGate) Throttled() (int64, error) {
	if g.v2 {
		return g.statField("throttled_usec", 1000)
	}
	return g.statField("throttled_time", 1)
}

// statField reads one field of cpu.stat, times scale.
func (g *cpuGate) statField(name string, scale int64) (int64, error) {
	b, err := os.ReadFile(g.statPath)
	if err != nil {
		return 0, err
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte(name+" ")); ok {
			n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			return n * scale, err
		}
	}
	return 0, nil
}

func (g *cpuGate) Close() error {
	var errs []error
	for _, f := range []*os.File{g.quota, g.usage} {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	g.quota, g.usage = nil, nil
	return errors.Join(errs...)
}
