// Command injector is a hostile daemon a sandbox leaves behind to rewrite
// its own grader (issue 13, "a sandbox rewrites its own grader"). It polls
// /proc/*/cmdline for a process whose command line holds MARKER and then,
// once per such process: writes a forged report into its /proc/<pid>/fd/1,
// writes into its memory through /proc/<pid>/mem (the bytes it read there,
// so the victim runs on unharmed if the write succeeds), reads its environ,
// and with -kill sends it SIGKILL. Each attempt is logged to LOG as
// "<what> ok <pid>" or "<what> <error> <pid>"; "ready" is logged once the
// first scan is done, and TICK counts scans (to tell a frozen injector from
// a live one). With -once it makes one scan and exits (a racing daemon
// starts it again and again); with -spray it also writes the forged report,
// every scan, into every FIFO it finds and every pipe on fd 0-2 of every
// other process it can open. Built static by the container tests and run
// inside sandboxes.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Forged is the report the injector writes into its victims' stdout.
const Forged = "FORGED-BY-SANDBOX: all tests passed\n"

func main() {
	kill := flag.Bool("kill", false, "also SIGKILL each victim")
	once := flag.Bool("once", false, "scan once and exit")
	spray := flag.Bool("spray", false, "write the forged report into every pipe and FIFO")
	flag.Parse()
	if flag.NArg() != 3 {
		fmt.Fprintln(os.Stderr, "usage: injector [-kill] MARKER LOG TICK")
		os.Exit(2)
	}
	marker, logPath, tickPath := []byte(flag.Arg(0)), flag.Arg(1), flag.Arg(2)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	logln := func(format string, a ...any) { fmt.Fprintf(logf, format+"\n", a...) }
	seen := map[int]bool{}
	self := os.Getpid()
	for n := 1; ; n++ {
		for _, pid := range victims(marker, self) {
			if seen[pid] {
				continue
			}
			seen[pid] = true
			logln("fd1 %s %d", result(forge(pid)), pid)
			logln("mem %s %d", result(pokeMem(pid)), pid)
			_, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
			logln("environ %s %d", result(err), pid)
			if *kill {
				logln("kill %s %d", result(unix.Kill(pid, unix.SIGKILL)), pid)
			}
		}
		if *spray {
			for _, p := range sprayed(self) {
				logln("spray ok %s", p)
			}
		}
		_ = os.WriteFile(tickPath, []byte(strconv.Itoa(n)), 0o644)
		if n == 1 {
			logln("ready")
		}
		if *once {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

func result(err error) string {
	if err == nil {
		return "ok"
	}
	return strings.ReplaceAll(err.Error(), " ", "_")
}

// victims are the processes whose command line holds marker, other than
// injectors.
func victims(marker []byte, self int) []int {
	paths, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var out []int
	for _, p := range paths {
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile(p)
		// Injectors (and shells starting them) carry the marker too.
		if err == nil && bytes.Contains(b, marker) && !bytes.Contains(b, []byte("injector")) {
			out = append(out, pid)
		}
	}
	return out
}

func forge(pid int) error {
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/1", pid), os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(Forged)
	return err
}

// pokeMem opens the victim's memory read-write and writes back the first
// bytes of its first writable mapping.
func pokeMem(pid int) error {
	mem, err := os.OpenFile(fmt.Sprintf("/proc/%d/mem", pid), os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer mem.Close()
	maps, err := os.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return err
	}
	defer maps.Close()
	s := bufio.NewScanner(maps)
	for s.Scan() {
		f := strings.Fields(s.Text())
		if len(f) < 2 || !strings.HasPrefix(f[1], "rw") {
			continue
		}
		start, err := strconv.ParseUint(strings.Split(f[0], "-")[0], 16, 64)
		if err != nil {
			continue
		}
		b := make([]byte, 8)
		if _, err := mem.ReadAt(b, int64(start)); err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if _, err := mem.WriteAt(b, int64(start)); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		return nil
	}
	return fmt.Errorf("no writable mapping")
}

// sprayed writes the forged report into every FIFO under / and every pipe
// on fd 0-2 of other processes that it can open without blocking; it
// returns what it wrote to.
func sprayed(self int) []string {
	var targets []string
	for _, fd := range []string{"0", "1", "2"} {
		ps, _ := filepath.Glob("/proc/[0-9]*/fd/" + fd)
		for _, p := range ps {
			if !strings.HasPrefix(p, "/proc/"+strconv.Itoa(self)+"/") {
				targets = append(targets, p)
			}
		}
	}
	_ = filepath.WalkDir("/", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if d.IsDir() && (p == "/proc" || p == "/sys") {
			return filepath.SkipDir
		}
		if d.Type()&os.ModeNamedPipe != 0 {
			targets = append(targets, p)
		}
		return nil
	})
	var out []string
	for _, p := range targets {
		st, err := os.Stat(p)
		if err != nil || st.Mode()&os.ModeNamedPipe == 0 {
			continue // only pipes and FIFOs
		}
		f, err := os.OpenFile(p, os.O_WRONLY|unix.O_NONBLOCK, 0)
		if err != nil {
			continue
		}
		if _, err := f.WriteString(Forged); err == nil {
			out = append(out, p)
		}
		f.Close()
	}
	return out
}
