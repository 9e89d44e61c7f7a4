package container

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// pidStart reads the start time of pid (field 22 of /proc/<pid>/stat, in
// clock ticks since boot). It fails when the process does not exist.
func pidStart(pid int) (uint64, error) {
	if pid <= 0 {
		return 0, errors.New("container: no pid")
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces and parentheses: parse
	// after the last ')'. What follows starts with field 3.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("container: malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	const idx = 22 - 3
	if len(f) <= idx {
		return 0, fmt.Errorf("container: short /proc/%d/stat", pid)
	}
	return strconv.ParseUint(f[idx], 10, 64)
}

// sameProcess reports whether pid still is the process that started at
// start (and is not a zombie).
func sameProcess(pid int, start uint64) bool {
	st, err := pidStart(pid)
	if err != nil || st != start {
		return false
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

// namespacePid1 reports whether pid is PID 1 of its innermost pid namespace.
func namespacePid1(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "NSpid:"); ok {
			f := strings.Fields(rest)
			return len(f) > 1 && f[len(f)-1] == "1"
		}
	}
	return false
}
