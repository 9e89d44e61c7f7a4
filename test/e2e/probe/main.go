// Command probe runs inside a sandbox (as root) and tries, one by one, the
// escapes and abuses warren must refuse. It prints one line per check:
// "NAME: blocked (...)" or "NAME: ALLOWED (...)". Built static by the e2e tests.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/confine/confinetest"
)

const (
	ficlone       = 0x40049409
	ficlonerange  = 0x4020940d
	fideduperange = 0xc0189436
	ext4MoveExt   = 0xc028660f
	xfsSwapExt    = 0xc0c0586d
)

func report(name string, err error, detail string) {
	if err != nil {
		fmt.Printf("%s: blocked (%v)\n", name, err)
	} else {
		fmt.Printf("%s: ALLOWED %s\n", name, detail)
	}
}

func ioctlCheck(name string, req uintptr) {
	a, err := os.Create("/tmp/probe-a")
	if err != nil {
		fmt.Printf("%s: setup failed %v\n", name, err)
		return
	}
	defer os.Remove("/tmp/probe-a")
	defer a.Close()
	a.WriteString("data")
	b, _ := os.Create("/tmp/probe-b")
	defer os.Remove("/tmp/probe-b")
	defer b.Close()
	var arg [256]byte
	_, _, e := unix.Syscall(unix.SYS_IOCTL, b.Fd(), req, uintptr(unsafe.Pointer(&arg[0])))
	if e == unix.EPERM {
		report(name, e, "")
	} else {
		// Anything but EPERM means the filter did not stop it (the
		// filesystem answered instead).
		fmt.Printf("%s: ALLOWED (reached the filesystem: %v)\n", name, e)
	}
}

func readAll(name, path string) {
	b, err := os.ReadFile(path)
	if err == nil && len(b) > 0 {
		report(name, nil, fmt.Sprintf("(read %d bytes)", len(b)))
		return
	}
	if err == nil {
		err = fmt.Errorf("empty")
	}
	report(name, err, "")
}

func syscallCheck(name string, nr uintptr, a ...uintptr) {
	args := make([]uintptr, 6)
	copy(args, a)
	_, _, e := unix.Syscall6(nr, args[0], args[1], args[2], args[3], args[4], args[5])
	if e == 0 {
		report(name, nil, "")
		return
	}
	report(name, e, "")
}

func capBits() (eff, bnd uint64, nnp string) {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		switch f[0] {
		case "CapEff:":
			eff, _ = strconv.ParseUint(f[1], 16, 64)
		case "CapBnd:":
			bnd, _ = strconv.ParseUint(f[1], 16, 64)
		case "NoNewPrivs:":
			nnp = f[1]
		}
	}
	return
}

// hold starts `sleep` processes until the pids limit refuses one, then
// holds them (and itself) for secs seconds.
func hold(secs string) {
	n := 0
	for ; n < 100000; n++ {
		p, err := os.StartProcess("/bin/sleep", []string{"sleep", secs}, &os.ProcAttr{})
		if err != nil {
			break
		}
		_ = p.Release()
	}
	fmt.Printf("holding %d\n", n)
	d, _ := strconv.Atoi(secs)
	time.Sleep(time.Duration(d) * time.Second)
}

func main() {
	if netMain(os.Args[1:]) {
		return
	}
	if len(os.Args) == 3 && os.Args[1] == "alloc" {
		alloc(os.Args[2])
		return
	}
	if len(os.Args) == 3 && os.Args[1] == "hold" {
		hold(os.Args[2])
		return
	}
	if len(os.Args) == 3 && os.Args[1] == "ipc" {
		ipc(os.Args[2])
		return
	}
	hostPath := ""
	if len(os.Args) > 1 {
		hostPath = os.Args[1]
	}
	report("mount", unix.Mount("tmpfs", "/mnt", "tmpfs", 0, ""), "")
	report("umount-proc", unix.Unmount("/proc/kcore", unix.MNT_DETACH), "")
	ioctlCheck("ioctl-ficlone", ficlone)
	ioctlCheck("ioctl-ficlonerange", ficlonerange)
	ioctlCheck("ioctl-fideduperange", fideduperange)
	ioctlCheck("ioctl-ext4-move-ext", ext4MoveExt)
	ioctlCheck("ioctl-xfs-swapext", xfsSwapExt)
	syscallCheck("bpf", unix.SYS_BPF, 0, 0, 0)
	syscallCheck("perf_event_open", unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0)
	syscallCheck("userfaultfd", unix.SYS_USERFAULTFD, 0)
	syscallCheck("keyctl", unix.SYS_KEYCTL, 0, 0)
	syscallCheck("add_key", unix.SYS_ADD_KEY, 0, 0, 0, 0, 0)
	syscallCheck("kexec_load", unix.SYS_KEXEC_LOAD, 0, 0, 0, 0)
	syscallCheck("init_module", unix.SYS_INIT_MODULE, 0, 0, 0)
	report("unshare-mnt", unix.Unshare(unix.CLONE_NEWNS), "")
	report("unshare-user", unix.Unshare(unix.CLONE_NEWUSER), "")
	report("ptrace-agent", unix.PtraceAttach(1), "")
	readAll("proc-kcore", "/proc/kcore")
	readAll("proc-kpagecgroup", "/proc/kpagecgroup")
	readAll("proc-kpageflags", "/proc/kpageflags")
	readAll("proc-kpagecount", "/proc/kpagecount")
	readAll("proc-timer_list", "/proc/timer_list")
	report("proc-sysrq-trigger", os.WriteFile("/proc/sysrq-trigger", []byte("h"), 0), "")
	report("proc-sys-write", os.WriteFile("/proc/sys/kernel/domainname", []byte("x"), 0), "")
	report("sys-write", os.WriteFile("/sys/kernel/mm/transparent_hugepage/enabled", []byte("never"), 0), "")
	// Listing /proc/1/fd needs only DAC (root has it); following one of its
	// links needs ptrace access to the agent, which nothing inside has.
	var linkErr error = fmt.Errorf("no fds")
	for fd := 0; fd < 64; fd++ {
		p := fmt.Sprintf("/proc/1/fd/%d", fd)
		if _, err := os.Readlink(p); err == nil {
			linkErr = nil
			break
		} else if !os.IsNotExist(err) {
			linkErr = err
		}
		if f, err := os.Open(p); err == nil {
			f.Close()
			linkErr = nil
			break
		}
	}
	report("agent-fds", linkErr, "(followed a link in /proc/1/fd)")
	// Listing them is refused too: in a user namespace the agent's /proc
	// files belong to host root, not to the sandbox's root.
	_, err := os.ReadDir("/proc/1/fd")
	report("agent-fd-list", err, "(listed /proc/1/fd)")
	// open_by_handle_at must be refused outright (EPERM), not reach the
	// filesystem; a handle of "/" made by hand where name_to_handle_at
	// refuses.
	h, _, herr := unix.NameToHandleAt(unix.AT_FDCWD, "/", 0)
	if herr != nil {
		h = unix.NewFileHandle(1, []byte{2, 0, 0, 0, 0, 0, 0, 0})
	}
	if fd, err := unix.OpenByHandleAt(unix.AT_FDCWD, h, unix.O_RDONLY); err == nil {
		unix.Close(fd)
		fmt.Println("open_by_handle_at: ALLOWED (opened)")
	} else if err == unix.EPERM {
		fmt.Printf("open_by_handle_at: blocked (%v)\n", err)
	} else {
		fmt.Printf("open_by_handle_at: ALLOWED (reached the kernel: %v)\n", err)
	}
	_, err = os.Readlink("/proc/1/exe")
	report("agent-exe", err, "(read /proc/1/exe)")
	_, err = os.Open("/proc/1/mem")
	report("agent-mem", err, "(opened /proc/1/mem)")
	_, err = os.ReadFile("/proc/1/environ")
	report("agent-environ", err, "(read /proc/1/environ)")
	_, err = os.Stat("/dev/kmsg")
	report("dev-kmsg", err, "(exists)")
	// Inherited descriptors: only stdio may be open.
	fds, _ := os.ReadDir("/proc/self/fd")
	var extra []string
	for _, fd := range fds {
		n, _ := strconv.Atoi(fd.Name())
		if n <= 2 {
			continue
		}
		// Descriptors this program opened itself are close-on-exec;
		// an inherited one is not.
		flags, err := unix.FcntlInt(uintptr(n), unix.F_GETFD, 0)
		if err == nil && flags&unix.FD_CLOEXEC == 0 {
			l, _ := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
			extra = append(extra, fd.Name()+"->"+l)
		}
	}
	if len(extra) > 0 {
		fmt.Printf("inherited-fds: ALLOWED %v\n", extra)
	} else {
		fmt.Printf("inherited-fds: blocked (none)\n")
	}
	eff, bnd, nnp := capBits()
	for _, c := range []struct {
		name string
		bit  uint
	}{{"cap-sys-admin", 21}, {"cap-sys-ptrace", 19}, {"cap-sys-module", 16}, {"cap-net-admin", 12}, {"cap-sys-rawio", 17}, {"cap-sys-time", 25}, {"cap-dac-read-search", 2}} {
		if eff&(1<<c.bit) != 0 || bnd&(1<<c.bit) != 0 {
			fmt.Printf("%s: ALLOWED (eff %x bnd %x)\n", c.name, eff, bnd)
		} else {
			fmt.Printf("%s: blocked (dropped)\n", c.name)
		}
	}
	if nnp == "1" {
		fmt.Println("no-new-privs: blocked (set)")
	} else {
		fmt.Printf("no-new-privs: ALLOWED (NoNewPrivs=%s)\n", nnp)
	}
	if hostPath != "" {
		_, err := os.Stat(hostPath)
		report("host-path", err, "(a host path is visible: "+hostPath+")")
	}
	ents, _ := os.ReadDir("/dev")
	allowed := map[string]bool{"null": true, "zero": true, "full": true, "random": true, "urandom": true, "tty": true,
		"ptmx": true, "pts": true, "shm": true, "fd": true, "stdin": true, "stdout": true, "stderr": true, "mqueue": true}
	var bad []string
	for _, e := range ents {
		// .warren: the agent's FIFO directory, once a command ran in a
		// live shell.
		if !allowed[e.Name()] && !(e.Name() == ".warren" && e.IsDir()) {
			bad = append(bad, e.Name())
		}
	}
	if len(bad) > 0 {
		fmt.Printf("dev-nodes: ALLOWED %v\n", bad)
	} else {
		fmt.Println("dev-nodes: blocked (only the allowed nodes)")
	}
	ifs, _ := os.ReadDir("/sys/class/net")
	var names []string
	for _, i := range ifs {
		names = append(names, i.Name())
	}
	if len(names) == 1 && names[0] == "lo" {
		fmt.Println("network: blocked (only lo)")
	} else {
		fmt.Printf("network: ALLOWED %v\n", names)
	}
}

// alloc touches N MiB of anonymous memory and holds it; it prints "held"
// only if the whole allocation succeeded.
func alloc(mib string) {
	n, _ := strconv.Atoi(mib)
	bufs := make([][]byte, 0, n)
	for i := 0; i < n; i++ {
		b := make([]byte, 1<<20)
		for j := 0; j < len(b); j += 4096 {
			b[j] = 1
		}
		bufs = append(bufs, b)
	}
	fmt.Printf("held %d MiB\n", len(bufs))
}

// ipc makes IPC objects that outlive their process (make), or reports
// which exist (count).
func ipc(op string) {
	var err error
	if op == "make" {
		err = confinetest.MakeIPC()
		if err == nil {
			fmt.Println("made")
		}
	} else {
		var s string
		if s, err = confinetest.CountIPC(); err == nil {
			fmt.Println(s)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
