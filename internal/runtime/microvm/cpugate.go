package microvm

import (
	"errors"
	"fmt"
	"os"

	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/runtime/cpugate"
)

var _ runtime.CPUGater = (*Runtime)(nil)

// CPUGate implements runtime.CPUGater on QEMU's cgroup (docs/architecture.md,
// "Density and elasticity"): its quota, which the vCPUs and QEMU's own
// threads share, switches between the sandbox's cpu while an operation runs
// and its idle_cpu between operations. A VM is never frozen: idle_cpu 0 is
// the kernel's minimum quota (0.01 core) here, so the guest keeps its
// clock and devices. The edge holds the full CPU over a pause and a resume
// (QEMU writes and reads the memory snapshot inside this cgroup).
func (r *Runtime) CPUGate(h runtime.Handle, full, idle float64) (runtime.CPUGate, error) {
	if h.Cgroup == "" {
		h.Cgroup = r.cgroupPath(h.ID)
	}
	f, err := r.cg.gateFiles(h.Cgroup)
	if err == nil {
		var g *cpugate.Gate
		if g, err = cpugate.Open(f, full, idle); err == nil {
			return g, nil
		}
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: cgroup %s", runtime.ErrGone, h.Cgroup)
	}
	return nil, fmt.Errorf("microvm: cpu gate of %s: %w", h.Cgroup, err)
}
