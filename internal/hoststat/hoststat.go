// Package hoststat measures the host for admission and the node view:
// memory and swap from /proc/meminfo, pressure stall information (PSI) from
// /proc/pressure, and which scheduling and elasticity features the kernel
// offers.
package hoststat

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
)

// Memory is a reading of /proc/meminfo, in bytes.
type Memory struct {
	Total     int64
	Available int64
	SwapTotal int64
	SwapFree  int64
}

// Tasks is how many tasks (threads) the host runs against the smaller of
// its two limits, kernel.pid_max and kernel.threads-max: every thread takes
// a pid, and a sandbox is several (its agent's threads and its shells).
type Tasks struct {
	Used, Limit int64
}

// ReadTasks reads the task count from /proc/loadavg and the limits from
// /proc/sys/kernel.
func ReadTasks() (Tasks, error) {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return Tasks{}, err
	}
	t, err := parseLoadavgTasks(b)
	if err != nil {
		return Tasks{}, err
	}
	for _, f := range []string{"/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"} {
		if b, err := os.ReadFile(f); err == nil {
			if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil && n > 0 && (t.Limit == 0 || n < t.Limit) {
				t.Limit = n
			}
		}
	}
	if t.Limit == 0 {
		return Tasks{}, errors.New("hoststat: no pid or thread limit readable")
	}
	return t, nil
}

// parseLoadavgTasks reads the total of the "running/total" field.
func parseLoadavgTasks(b []byte) (Tasks, error) {
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return Tasks{}, errors.New("hoststat: short /proc/loadavg")
	}
	_, total, ok := strings.Cut(f[3], "/")
	n, err := strconv.ParseInt(total, 10, 64)
	if !ok || err != nil {
		return Tasks{}, errors.New("hoststat: bad task field in /proc/loadavg")
	}
	return Tasks{Used: n}, nil
}

// SwapUsed is swap in use, in bytes.
func (m Memory) SwapUsed() int64 { return m.SwapTotal - m.SwapFree }

// ReadMemory reads /proc/meminfo.
func ReadMemory() (Memory, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return Memory{}, err
	}
	return parseMeminfo(b), nil
}

func parseMeminfo(b []byte) Memory {
	var m Memory
	s := bufio.NewScanner(bytes.NewReader(b))
	for s.Scan() {
		k, rest, ok := strings.Cut(s.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			v <<= 10
		}
		switch k {
		case "MemTotal":
			m.Total = v
		case "MemAvailable":
			m.Available = v
		case "SwapTotal":
			m.SwapTotal = v
		case "SwapFree":
			m.SwapFree = v
		}
	}
	return m
}

// Pressure is one PSI resource's "some" averages, in percent.
type Pressure struct {
	Avg10, Avg60, Avg300 float64
}

// ErrNoPSI means the kernel has no pressure stall information.
var ErrNoPSI = errors.New("hoststat: no /proc/pressure")

// ReadPressure reads /proc/pressure/<resource> ("cpu", "memory", "io").
func ReadPressure(resource string) (Pressure, error) {
	b, err := os.ReadFile("/proc/pressure/" + resource)
	if errors.Is(err, os.ErrNotExist) {
		return Pressure{}, ErrNoPSI
	}
	if err != nil {
		return Pressure{}, err
	}
	return parsePressure(b), nil
}

func parsePressure(b []byte) Pressure {
	var p Pressure
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "some" {
			continue
		}
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				continue
			}
			switch k {
			case "avg10":
				p.Avg10 = x
			case "avg60":
				p.Avg60 = x
			case "avg300":
				p.Avg300 = x
			}
		}
	}
	return p
}

// prSchedCore and friends are from linux/prctl.h (not all in x/sys).
const (
	prSchedCore       = 62
	prSchedCoreGet    = 0
	prSchedCoreCreate = 1
	pidTypeTGID       = 1
)

// CoreScheduling reports whether the kernel offers core-scheduling cookies
// (CONFIG_SCHED_CORE): PR_SCHED_CORE_GET on ourselves succeeds.
func CoreScheduling() bool {
	var cookie uint64
	return unix.Prctl(prSchedCore, prSchedCoreGet, 0, pidTypeTGID, uintptr(unsafe.Pointer(&cookie))) == nil
}

// CreateCoreCookie gives process pid (and all its threads) a fresh
// core-scheduling cookie, which its children inherit: no task with another
// cookie ever runs on a sibling hyperthread at the same time.
func CreateCoreCookie(pid int) error {
	return unix.Prctl(prSchedCore, prSchedCoreCreate, uintptr(pid), pidTypeTGID, 0)
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Features probes the host. Freezer is for the caller (it depends on the
// runtime's cgroup layout) and left false here.
func Features() api.NodeFeatures {
	f := api.NodeFeatures{
		SchedIdle:      true, // SCHED_IDLE is in every kernel warren supports
		CoreScheduling: CoreScheduling(),
		PSI:            exists("/proc/pressure/memory"),
	}
	for _, p := range []string{"/sys/fs/cgroup/cpu/cpu.idle", "/sys/fs/cgroup/cpu,cpuacct/cpu.idle"} {
		if exists(p) {
			f.CgroupCPUIdle = true
		}
	}
	if m, err := ReadMemory(); err == nil {
		f.Swap = m.SwapTotal > 0
	}
	return f
}
