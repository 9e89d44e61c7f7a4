// Command budget uses up per-user kernel budgets inside a sandbox, or
// checks that one is still there. Built static by the container tests and
// run inside sandboxes.
//
//	budget mq-fill      make POSIX message queues until refused; print "filled N ERRNO"
//	budget mq-one       make one queue; print "ok" or the errno
//	budget pipe-hold F  enlarge pipes to 1 MiB until refused, write "held N" to F, sleep
//	budget pipe-one     make one pipe; print its size and whether it grows to 1 MiB
//	budget handle       open_by_handle_at with a handle of "/"; print the error
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: budget mq-fill|mq-one|pipe-hold FILE|pipe-one")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "mq-fill":
		for i := 0; ; i++ {
			if err := mqOpen("budget-" + strconv.Itoa(i)); err != nil {
				fmt.Printf("filled %d %v\n", i, err)
				return
			}
		}
	case "mq-one":
		if err := mqOpen("one-" + strconv.Itoa(os.Getpid())); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println("ok")
	case "pipe-hold":
		n := 0
		for ; n < 4096; n++ {
			var p [2]int
			if err := unix.Pipe(p[:]); err != nil {
				break
			}
			if _, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, 1<<20); err != nil {
				break
			}
		}
		if err := os.WriteFile(os.Args[2], []byte("held "+strconv.Itoa(n)+"\n"), 0o644); err != nil {
			os.Exit(1)
		}
		time.Sleep(time.Hour)
	case "handle":
		// A handle of the root, made by hand where name_to_handle_at
		// refuses (overlayfs without nfs_export): either way the
		// question is whether open_by_handle_at reaches the filesystem.
		h, _, err := unix.NameToHandleAt(unix.AT_FDCWD, "/", 0)
		if err != nil {
			h = unix.NewFileHandle(1, []byte{2, 0, 0, 0, 0, 0, 0, 0})
		}
		fd, err := unix.OpenByHandleAt(unix.AT_FDCWD, h, unix.O_RDONLY)
		if err == nil {
			unix.Close(fd)
			fmt.Println("open_by_handle_at: opened")
			return
		}
		fmt.Printf("open_by_handle_at: %v\n", err)
	case "pipe-one":
		var p [2]int
		if err := unix.Pipe(p[:]); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		size, _ := unix.FcntlInt(uintptr(p[1]), unix.F_GETPIPE_SZ, 0)
		_, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, 1<<20)
		fmt.Printf("size %d grow %v\n", size, err)
	}
}

// mqOpen creates a POSIX message queue with the default attributes.
func mqOpen(name string) error {
	b, err := unix.BytePtrFromString(name)
	if err != nil {
		return err
	}
	fd, _, e := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(b)),
		uintptr(unix.O_CREAT|unix.O_RDWR|unix.O_CLOEXEC), 0o600, 0, 0, 0)
	if e != 0 {
		return e
	}
	_ = fd // kept open: the queue outlives this process anyway
	return nil
}
