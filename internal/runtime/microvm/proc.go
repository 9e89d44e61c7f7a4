package microvm

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// procStat is /proc/<pid>/stat's fields from field 3 on.
func procStat(pid int) ([]string, error) {
	if pid <= 0 {
		return nil, errors.New("microvm: no pid")
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	// The command name (field 2) may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil, fmt.Errorf("microvm: malformed /proc/%d/stat", pid)
	}
	return strings.Fields(string(b[i+1:])), nil
}

// pidStart is the start time of pid (field 22), which guards against pid
// reuse.
func pidStart(pid int) (uint64, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	const idx = 22 - 3
	if len(f) <= idx {
		return 0, fmt.Errorf("microvm: short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[idx], 10, 64)
}

// isZombie reports whether pid has exited but is not reaped yet.
func isZombie(pid int) bool {
	f, err := procStat(pid)
	return err == nil && len(f) > 0 && (f[0] == "Z" || f[0] == "X")
}
