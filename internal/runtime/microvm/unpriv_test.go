package microvm

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	wruntime "github.com/warrenhq/warren/internal/runtime"
)

type (
	runtimeSpec   = wruntime.Spec
	runtimeHandle = wruntime.Handle
)

// qemuCreds is what /proc/<pid>/status says of a QEMU's credentials.
type qemuCreds struct {
	uids, gids, groups []string
	caps               map[string]string // CapInh, CapPrm, CapEff, CapAmb
}

func readCreds(t *testing.T, pid int) qemuCreds {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	c := qemuCreds{caps: map[string]string{}}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch f := strings.Fields(v); k {
		case "Uid":
			c.uids = f
		case "Gid":
			c.gids = f
		case "Groups":
			c.groups = f
		case "CapInh", "CapPrm", "CapEff", "CapAmb":
			c.caps[k] = strings.TrimSpace(v)
		}
	}
	return c
}

// assertUnprivileged checks that the QEMU at pid runs as a uid and gid of
// its own (real, effective, saved, fs all the same, not root), with no
// supplementary group but its gid, no capabilities, chrooted away from
// the host's root; it returns the uid.
func assertUnprivileged(t *testing.T, pid int) int {
	t.Helper()
	c := readCreds(t, pid)
	if len(c.uids) != 4 || len(c.gids) != 4 {
		t.Fatalf("qemu %d: Uid %v Gid %v", pid, c.uids, c.gids)
	}
	for i := range 4 {
		if c.uids[i] == "0" || c.uids[i] != c.uids[0] || c.gids[i] == "0" || c.gids[i] != c.gids[0] {
			t.Errorf("qemu %d runs privileged: Uid %v Gid %v", pid, c.uids, c.gids)
			break
		}
	}
	for _, g := range c.groups {
		if g != c.gids[0] {
			t.Errorf("qemu %d has supplementary groups %v", pid, c.groups)
		}
	}
	for k, v := range c.caps {
		if strings.Trim(v, "0") != "" {
			t.Errorf("qemu %d has capabilities: %s %s", pid, k, v)
		}
	}
	if root, err := os.Readlink(fmt.Sprintf("/proc/%d/root", pid)); err != nil || root == "/" {
		t.Errorf("qemu %d is not chrooted: root %q %v", pid, root, err)
	}
	uid, _ := strconv.Atoi(c.uids[0])
	return uid
}

// asUID runs fn on an OS thread whose credentials are uid:uid with no
// groups (the thread is discarded afterwards).
func asUID(t *testing.T, uid int, fn func() error) error {
	t.Helper()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); e != 0 {
			errc <- fmt.Errorf("setgroups: %w", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
			errc <- fmt.Errorf("setresgid: %w", e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
			errc <- fmt.Errorf("setresuid: %w", e)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// layerFDs lists the descriptors of QEMU pid open on the file at path,
// with their open flags.
func layerFDs(t *testing.T, pid int, path string) map[string]int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, e := range ents {
		p := fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())
		if st, err := os.Stat(p); err != nil || !os.SameFile(st, want) {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 8, 64)
				out[p] = int(n)
			}
		}
	}
	return out
}

// TestQEMUUnprivileged: each VM's QEMU runs as a uid of its own, without
// capabilities, chrooted; it holds the shared layer read-only and cannot
// write it, and its uid reaches neither another VM's sockets nor its disk.
func TestQEMUUnprivileged(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var pids, uids []int
	var specs []*struct{ state, work string }
	for _, id := range []string{"priv-a", "priv-b"} {
		spec := f.spec(t, id)
		inst, err := f.rt.Start(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			inst.Agent.Close()
			if err := f.rt.Destroy(context.Background(), inst.Handle); err != nil {
				t.Error(err)
			}
		}()
		pids = append(pids, inst.Handle.Pid)
		uids = append(uids, assertUnprivileged(t, inst.Handle.Pid))
		specs = append(specs, &struct{ state, work string }{spec.StateDir, spec.Work})
	}
	if uids[0] == uids[1] {
		t.Errorf("two VMs share the uid %d", uids[0])
	}
	// The shared layer: open read-only only, and not writable by the
	// QEMU's uid even through its own descriptor.
	fds := layerFDs(t, pids[0], f.layer)
	if len(fds) == 0 {
		t.Fatalf("qemu %d holds no descriptor of the layer %s", pids[0], f.layer)
	}
	for p, flags := range fds {
		if flags&unix.O_ACCMODE != unix.O_RDONLY {
			t.Errorf("qemu holds the layer writable: %s flags %o", p, flags)
		}
		if err := asUID(t, uids[0], func() error {
			w, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err == nil {
				w.Close()
				return fmt.Errorf("opened %s for writing", p)
			}
			return nil
		}); err != nil {
			t.Errorf("the QEMU's uid writes the shared layer: %v", err)
		}
	}
	// VM b's uid reaches neither VM a's agent and QMP sockets nor its disk.
	for _, p := range []string{filepath.Join(specs[0].state, SocketName), filepath.Join(specs[0].state, QMPName)} {
		if err := asUID(t, uids[1], func() error {
			c, err := net.Dial("unix", p)
			if err == nil {
				c.Close()
				return fmt.Errorf("connected to %s", p)
			}
			return nil
		}); err != nil {
			t.Errorf("another VM's uid: %v", err)
		}
	}
	disk := filepath.Join(specs[0].work, DiskName)
	if err := asUID(t, uids[1], func() error {
		w, err := os.OpenFile(disk, os.O_RDWR, 0)
		if err == nil {
			w.Close()
			return fmt.Errorf("opened %s", disk)
		}
		return nil
	}); err != nil {
		t.Errorf("another VM's uid: %v", err)
	}
}

// TestWithFDSets: disk paths become fd sets of descriptors opened here
// (a writable disk read-write and read-only, a read-only one read-only
// alone), image locking off; other arguments stay as they are.
func TestWithFDSets(t *testing.T) {
	dir := t.TempDir()
	rw, ro, base := filepath.Join(dir, "rw"), filepath.Join(dir, "ro"), filepath.Join(dir, "base")
	for _, p := range []string{rw, ro, base} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"-name", "x", "-kernel", "/k",
		"-drive", "id=rw,file=" + rw + ",format=raw,if=none",
		"-drive", "id=l0,file=" + ro + ",format=raw,if=none,readonly=on",
		"-blockdev", "driver=qcow2,node-name=o,file.driver=file,file.filename=" + rw + ",backing.file.filename=" + base}
	out, files, err := withFDSets(args)
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"-add-fd", "fd=3,set=1,opaque=" + rw, "-add-fd", "fd=4,set=1,opaque=" + rw,
		"-add-fd", "fd=5,set=2,opaque=" + ro,
		"-add-fd", "fd=6,set=3,opaque=" + rw, "-add-fd", "fd=7,set=3,opaque=" + rw,
		"-add-fd", "fd=8,set=4,opaque=" + base,
		"-name", "x", "-kernel", "/k",
		"-drive", "id=rw,file=/dev/fdset/1,format=raw,if=none,file.locking=off",
		"-drive", "id=l0,file=/dev/fdset/2,format=raw,if=none,readonly=on,file.locking=off",
		"-blockdev", "driver=qcow2,node-name=o,file.driver=file,file.filename=/dev/fdset/3,backing.file.filename=/dev/fdset/4,file.locking=off,backing.file.locking=off"}
	if strings.Join(out, " ") != strings.Join(want, " ") {
		t.Errorf("args:\n got %q\nwant %q", out, want)
	}
	modes := []int{os.O_RDWR, os.O_RDONLY, os.O_RDONLY, os.O_RDWR, os.O_RDONLY, os.O_RDONLY}
	if len(files) != len(modes) {
		t.Fatalf("%d files, want %d", len(files), len(modes))
	}
	for i, f := range files {
		fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
		if err != nil || fl&unix.O_ACCMODE != modes[i] {
			t.Errorf("file %d (%s): flags %o %v, want mode %o", i, f.Name(), fl, err, modes[i])
		}
	}
}

// TestLegacyArgs: a VM that an earlier edge started (QEMU as root, no
// recorded command line) is paused and forked from its /proc command line,
// made fit for -runas; an unprivileged QEMU's /proc command line is never
// trusted.
func TestLegacyArgs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root")
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("SKIP: no qemu-system-x86_64")
	}
	run := func(sandbox string, extra ...string) *exec.Cmd {
		args := append([]string{"-M", "microvm", "-accel", "tcg", "-display", "none", "-nodefaults", "-S",
			"-sandbox", sandbox, "-incoming", "defer"}, extra...)
		cmd := exec.Command(qemu, args...)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	root := run("on,obsolete=deny,elevateprivileges=deny,spawn=deny")
	dir := t.TempDir()
	var args []string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if args, err = qemuArgs(dir, root.Process.Pid); err == nil {
			break
		}
	}
	want := "-M microvm -accel tcg -display none -nodefaults -S -sandbox on,obsolete=deny,spawn=deny"
	if err != nil || strings.Join(args, " ") != want {
		t.Errorf("legacy args: %q %v, want %q", args, err, want)
	}
	unpriv := run("on,obsolete=deny,spawn=deny", "-runas", "2130706433:2130706433")
	var st []byte
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !strings.Contains(string(st), "\nUid:\t2130706433"); time.Sleep(20 * time.Millisecond) {
		st, _ = os.ReadFile(fmt.Sprintf("/proc/%d/status", unpriv.Process.Pid))
	}
	if !strings.Contains(string(st), "\nUid:\t2130706433") {
		t.Fatalf("qemu -runas did not start: %s", st)
	}
	if args, err := qemuArgs(dir, unpriv.Process.Pid); err == nil {
		t.Errorf("an unprivileged QEMU's /proc command line was trusted: %q", args)
	}
}

// TestPidOfIgnoresImpostor: an unprivileged process that names itself as
// a sandbox's QEMU in its command line (an escaped QEMU can rewrite its
// own) is not taken for that sandbox's QEMU: not while it is paused (no
// QEMU runs) and not while its own QEMU runs as another uid.
func TestPidOfIgnoresImpostor(t *testing.T) {
	f := newFixture(t)
	spec := f.spec(t, "ghost")
	if err := os.WriteFile(filepath.Join(spec.StateDir, uidName), []byte("2130706441"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := f.rtHandle(spec)
	cmd := exec.Command("/bin/sh", "-c", "sleep 60", "-name", f.rt.qemuName(spec.ID), "-chardev", "socket,id=agent,path="+h.Socket)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 2130706440, Gid: 2130706440}}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		found, _ := f.rt.findQEMUs()
		if len(found) > 0 {
			break
		}
	}
	if pid := f.rt.pidOf(h); pid != 0 {
		t.Errorf("pidOf took the impostor %d (its own %d) for the sandbox's QEMU", pid, cmd.Process.Pid)
	}
}

func (f *fixture) rtHandle(spec *runtimeSpec) runtimeHandle {
	return runtimeHandle{ID: spec.ID, Tier: Tier, Socket: filepath.Join(spec.StateDir, SocketName), Cgroup: f.rt.cgroupPath(spec.ID)}
}
