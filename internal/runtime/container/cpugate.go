package container

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/runtime/cpugate"
)

// The CPU gate (docs/architecture.md, "Density and elasticity"): the
// sandbox's cgroup's files, switched by internal/runtime/cpugate. With
// idle_cpu 0 the idle level also freezes the sandbox (its agent too): the
// cgroup.freeze of its cgroup in the v2 hierarchy (on hybrid hosts the
// unified mount, which needs no controller for it), else v1's
// freezer.state. It is the sandbox's cgroup, the one pause uses on v2, not
// the trust split's work/, which the agent freezes for trusted commands:
// the two never undo each other. v1's thaw costs ~4 ms when no other group
// is frozen (the kernel switches the freezer's static key), v2's ~40 µs.

var _ runtime.CPUGater = (*Runtime)(nil)

// CPUGate opens the sandbox's CPU controls.
func (r *Runtime) CPUGate(h runtime.Handle, full, idle float64) (runtime.CPUGate, error) {
	return r.cpuGate(h, full, idle, idle <= 0)
}

// cpuGate opens h's gate; freeze: the idle level freezes the group too.
func (r *Runtime) cpuGate(h runtime.Handle, full, idle float64, freeze bool) (runtime.CPUGate, error) {
	if h.Cgroup == "" {
		h.Cgroup = r.cgroupPath(h.ID)
	}
	var f cpugate.Files
	switch d := r.cg.(type) {
	case *v1Driver:
		cpu := filepath.Join(d.mountOf("cpu"), h.Cgroup)
		acct := d.mountOf("cpuacct")
		if acct == "" {
			acct = d.mountOf("cpu") // co-mounted cpu,cpuacct
		}
		f = cpugate.Files{Quota: filepath.Join(cpu, "cpu.cfs_quota_us"), Stat: filepath.Join(cpu, "cpu.stat"),
			Usage: filepath.Join(acct, h.Cgroup, "cpuacct.usage")}
		if err := os.WriteFile(filepath.Join(cpu, "cpu.cfs_period_us"), []byte(strconv.Itoa(cpugate.Period)), 0); err != nil {
			return nil, gateErr(h, err)
		}
		if freeze {
			if u := d.unified(h.Cgroup); u != "" {
				f.Freeze, f.FreezeV2 = filepath.Join(u, "cgroup.freeze"), true
			} else {
				f.Freeze = filepath.Join(d.root, "freezer", h.Cgroup, "freezer.state")
			}
		}
	case *v2Driver:
		dir := filepath.Join(d.mount, h.Cgroup)
		f = cpugate.Files{Quota: filepath.Join(dir, "cpu.max"), Stat: filepath.Join(dir, "cpu.stat"), V2: true}
		if freeze {
			f.Freeze, f.FreezeV2 = filepath.Join(dir, "cgroup.freeze"), true
		}
	default:
		return nil, errors.New("container: no cgroup driver for a CPU gate")
	}
	g, err := cpugate.Open(f, full, idle)
	if err != nil {
		return nil, gateErr(h, err)
	}
	return g, nil
}

func gateErr(h runtime.Handle, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: cgroup %s", runtime.ErrGone, h.Cgroup)
	}
	return fmt.Errorf("container: cpu gate of %s: %w", h.Cgroup, err)
}
