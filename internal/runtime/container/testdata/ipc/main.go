// Command ipc makes IPC objects that outlive their process inside a
// sandbox (make), or reports which exist (count). Built static by the
// container tests and run inside sandboxes.
package main

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/confine/confinetest"
)

func main() {
	if len(os.Args) == 4 && os.Args[1] == "signal-pid1" {
		// signal-pid1 METHOD SIGNUM: send PID 1 a signal (confinetest.SendSignal).
		sig, err := strconv.Atoi(os.Args[3])
		if err == nil {
			err = confinetest.SendSignal(os.Args[2], 1, sig)
		}
		fmt.Println(err)
		return
	}
	if len(os.Args) == 3 && os.Args[1] == "memfd" {
		// memfd MB: write MB MiB into a memfd (memory charged to the
		// sandbox that no process maps) and hold it.
		mb, _ := strconv.Atoi(os.Args[2])
		fmt.Println(fillMemfd(mb))
		return
	}
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: ipc make|count|prlimit|signal-pid1 METHOD SIGNUM")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "make":
		if err := confinetest.MakeIPC(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("made")
	case "prlimit":
		// Lower the agent's (PID 1's) open-file limit, as a process of
		// the same uid may.
		lim := unix.Rlimit{Cur: 64, Max: 64}
		if err := unix.Prlimit(1, unix.RLIMIT_NOFILE, &lim, nil); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println("lowered")
	case "count":
		s, err := confinetest.CountIPC()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(s)
	}
}

func fillMemfd(mb int) error {
	fd, err := unix.MemfdCreate("fill", 0)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for i := 0; i < mb; i++ {
		if _, err := unix.Write(fd, buf); err != nil {
			return fmt.Errorf("after %d MiB: %w", i, err)
		}
	}
	return nil
}
