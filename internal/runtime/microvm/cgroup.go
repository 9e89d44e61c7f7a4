package microvm

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/warrenhq/warren/internal/runtime/cpugate"
)

// cgroupDriver puts each VM's QEMU in a cgroup of its own with a memory
// limit: cgroup v1 (memory, cpu, cpuacct, pids; legacy and hybrid hosts) or
// the v2 hierarchy when the host has only that.
type cgroupDriver struct {
	root string   // /sys/fs/cgroup
	v2   bool     // pure cgroup v2
	v1   []string // v1 controllers used
}

func newCgroupDriver() cgroupDriver {
	d := cgroupDriver{root: "/sys/fs/cgroup"}
	if _, err := os.Stat(filepath.Join(d.root, "cgroup.controllers")); err == nil {
		d.v2 = true
		return d
	}
	for _, c := range []string{"memory", "cpu", "cpuacct", "pids"} {
		if _, err := os.Stat(filepath.Join(d.root, c)); err == nil {
			d.v1 = append(d.v1, c)
		}
	}
	return d
}

func (d cgroupDriver) dirs(path string) []string {
	if d.v2 {
		return []string{filepath.Join(d.root, path)}
	}
	var out []string
	for _, c := range d.v1 {
		out = append(out, filepath.Join(d.root, c, path))
	}
	return out
}

// create makes path's cgroups with a memory limit of memoryMB.
func (d cgroupDriver) create(path string, memoryMB int64) error {
	for _, dir := range d.dirs(path) {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("microvm: cgroup: %w", err)
		}
	}
	limit := strconv.FormatInt(memoryMB<<20, 10)
	file := filepath.Join(d.root, "memory", path, "memory.limit_in_bytes")
	if d.v2 {
		file = filepath.Join(d.root, path, "memory.max")
	} else if len(d.v1) == 0 || d.v1[0] != "memory" {
		return nil
	}
	if err := os.WriteFile(file, []byte(limit), 0); err != nil {
		return fmt.Errorf("microvm: memory limit: %w", err)
	}
	return nil
}

// gateFiles are path's files for a CPU gate (cpugate.Files); the period is
// set to the gate's. An error: the host has no cpu controller for QEMU.
func (d cgroupDriver) gateFiles(path string) (cpugate.Files, error) {
	if d.v2 {
		dir := filepath.Join(d.root, path)
		return cpugate.Files{Quota: filepath.Join(dir, "cpu.max"), Stat: filepath.Join(dir, "cpu.stat"), V2: true}, nil
	}
	if !slices.Contains(d.v1, "cpu") {
		return cpugate.Files{}, errors.New("microvm: no cpu controller for a CPU gate")
	}
	dir := filepath.Join(d.root, "cpu", path)
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.Itoa(cpugate.Period)), 0); err != nil {
		return cpugate.Files{}, err
	}
	f := cpugate.Files{Quota: filepath.Join(dir, "cpu.cfs_quota_us"), Stat: filepath.Join(dir, "cpu.stat")}
	if slices.Contains(d.v1, "cpuacct") { // also where it is mounted with cpu: a link to the same place
		f.Usage = filepath.Join(d.root, "cpuacct", path, "cpuacct.usage")
	}
	return f, nil
}

// setCPU limits path's cgroup to cores (CFS quota over a 100 ms period).
func (d cgroupDriver) setCPU(path string, cores float64) error {
	const period = cpugate.Period
	quota := max(int64(cores*period), cpugate.MinQuota)
	if d.v2 {
		return os.WriteFile(filepath.Join(d.root, path, "cpu.max"), []byte(fmt.Sprintf("%d %d", quota, period)), 0)
	}
	if !slices.Contains(d.v1, "cpu") {
		return nil
	}
	dir := filepath.Join(d.root, "cpu", path)
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.Itoa(period)), 0); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.FormatInt(quota, 10)), 0)
}

// startIn starts cmd and moves it into path's cgroups before it has done
// much (QEMU allocates guest memory lazily, on first touch).
func (d cgroupDriver) startIn(path string, cmd *exec.Cmd) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	pid := []byte(strconv.Itoa(cmd.Process.Pid))
	for _, dir := range d.dirs(path) {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0); err != nil {
			_ = cmd.Process.Kill()
			return fmt.Errorf("join cgroup %s: %w", dir, err)
		}
	}
	return nil
}

// remove deletes path's cgroups (their processes are gone).
func (d cgroupDriver) remove(path string) error {
	for _, dir := range d.dirs(path) {
		var err error
		for i := 0; i < 200; i++ {
			if err = os.Remove(dir); err == nil || errors.Is(err, os.ErrNotExist) {
				err = nil
				break
			}
			time.Sleep(5 * time.Millisecond) // the last task is still leaving
		}
		if err != nil {
			return fmt.Errorf("microvm: remove cgroup: %w", err)
		}
	}
	return nil
}

// list names the cgroups under parent.
func (d cgroupDriver) list(parent string) []string {
	dirs := d.dirs(parent)
	if len(dirs) == 0 {
		return nil
	}
	ents, err := os.ReadDir(dirs[0])
	if err != nil {
		return nil
	}
	var ids []string
	for _, e := range ents {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	return ids
}
