package microvm

// Fork from memory: N VMs restored from one memory snapshot of a running
// VM, each continuing its processes. The parent is stopped for the
// snapshot and for a copy of its writable disk (the guest writes nothing
// then, and QEMU has flushed it), and continues afterwards. Each child has
// its own disk copy (cp --reflink=auto: a clone where the filesystem can),
// sockets and cgroup.
//
// Memory is shared copy-on-write: a template QEMU restores the snapshot
// into RAM that is a file (on /dev/shm) mapped shared, is snapshotted again
// with x-ignore-shared (the device state only) and ends; the file is copied
// into a sealed memfd (ramfile.go) and removed; each child maps the memfd
// privately (memory-backend-file,share=off) and restores the small
// snapshot, so it holds only the pages it writes, and stops reporting free
// pages (OpIdentity). A child that is paused or
// forked in its turn goes back to anonymous RAM (withoutRAMFile). If the
// template fails, each child reads the whole snapshot instead.
//
// Identity: the agent's OpIdentity gives each child its hostname, a new
// /etc/machine-id, and the host's random bytes credited to the guest
// kernel's pool (which was every sibling's) before it is handed out.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-qemu/qmp/raw"
	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/runtime"
)

// Fork starts one VM per spec from a memory snapshot of h's running VM.
// The specs name the children (ID, Hostname, StateDir, Work, MemoryMB must
// be the parent's). On an error nothing of the children is left.
func (r *Runtime) Fork(ctx context.Context, h runtime.Handle, specs []*runtime.Spec) (insts []*runtime.Instance, err error) {
	pid := r.pidOf(h)
	if pid == 0 {
		return nil, runtime.ErrGone
	}
	args, err := qemuArgs(filepath.Dir(h.Socket), pid)
	if err != nil {
		return nil, err
	}
	args = withoutRAMFile(args)
	memMB, err := memoryArg(args)
	if err != nil {
		return nil, fmt.Errorf("microvm: fork: %w", err)
	}
	parentState := filepath.Dir(h.Socket)
	parentDisk, err := os.Readlink(filepath.Join(parentState, DiskLink))
	if err != nil {
		return nil, fmt.Errorf("microvm: fork: %w", err)
	}
	mem := filepath.Join(filepath.Dir(parentDisk), "vm-fork-memory")
	defer os.Remove(mem)
	defer func() {
		if err != nil {
			for _, in := range insts {
				in.Agent.Close()
				_ = r.Destroy(context.WithoutCancel(ctx), in.Handle)
			}
			insts = nil
		}
	}()

	t0 := time.Now()
	disks, frozen, err := r.snapshotForFork(ctx, h, mem, parentDisk, specs)
	if err != nil {
		return nil, fmt.Errorf("microvm: fork: %w", err)
	}
	tmpl := &forkSource{args: args, parentState: parentState, parentDisk: parentDisk, snapshot: mem}
	release := r.shareForkRAM(ctx, h.ID, tmpl, disks[0], memMB)
	defer release() // the children hold the RAM mapped
	if insts, err = r.startChildren(ctx, specs, tmpl, disks); err != nil {
		return insts, err
	}
	r.log.Debug("microvm: forked from memory", "id", h.ID, "children", len(specs), "frozen", frozen, "shared", tmpl.ram != nil, "took", time.Since(t0))
	return insts, nil
}

// snapshotForFork freezes h's VM, saves its memory to mem, gives each
// child spec a copy of the parent's disk (linked from its state
// directory), and thaws the VM; it returns the copies' paths and how long
// the parent stood still. On an error it removes the copies.
func (r *Runtime) snapshotForFork(ctx context.Context, h runtime.Handle, mem, parentDisk string, specs []*runtime.Spec) (disks []string, frozen time.Duration, err error) {
	if err := r.Freeze(ctx, h); err != nil {
		return nil, 0, err
	}
	t0 := time.Now()
	disks = make([]string, len(specs))
	err = r.saveMemory(ctx, h, mem, false)
	for i, s := range specs {
		if err != nil {
			break
		}
		dir := s.Work
		if dir == "" {
			dir = s.StateDir
		}
		if err = os.MkdirAll(s.StateDir, 0o700); err != nil {
			break
		}
		disks[i] = filepath.Join(dir, DiskName)
		if out, cerr := exec.Command("cp", "--sparse=always", "--reflink=auto", parentDisk, disks[i]).CombinedOutput(); cerr != nil {
			err = fmt.Errorf("copy disk: %v: %s", cerr, strings.TrimSpace(string(out)))
			break
		}
		link := filepath.Join(s.StateDir, DiskLink)
		os.Remove(link)
		err = os.Symlink(disks[i], link)
	}
	if terr := r.Thaw(context.WithoutCancel(ctx), h); terr != nil && err == nil {
		err = terr
	}
	frozen = time.Since(t0)
	if err != nil {
		for i, s := range specs {
			if disks[i] != "" {
				os.Remove(disks[i])
				os.Remove(filepath.Join(s.StateDir, DiskLink))
			}
		}
		return nil, frozen, err
	}
	return disks, frozen, nil
}

// shareForkRAM gives tmpl the children's memory: one sealed RAM memfd
// that each maps privately (copy-on-write), made from the snapshot by
// restoring it once (disk is a child's disk, for that restore). If that
// fails, tmpl is left as it was and each child reads the snapshot. The
// returned release closes the memfd and removes its device state once the
// children have started.
func (r *Runtime) shareForkRAM(ctx context.Context, id string, tmpl *forkSource, disk string, memMB int64) (release func()) {
	ram, dev, err := r.ramTemplate(ctx, id, tmpl, disk, memMB, "")
	if err != nil {
		r.log.Warn("microvm: fork: no shared memory, each child reads the snapshot", "id", id, "err", err)
		return func() {}
	}
	mf, err := sealedCopy(ram, forkRAMName)
	os.Remove(ram)
	if err != nil {
		os.Remove(dev)
		r.log.Warn("microvm: fork: no shared memory, each child reads the snapshot", "id", id, "err", err)
		return func() {}
	}
	tmpl.ram, tmpl.ramMB, tmpl.snapshot = mf, memMB, dev
	return func() {
		os.Remove(dev)
		mf.Close()
	}
}

// startChildren starts one child per spec from tmpl, side by side (each
// waits mostly on its QEMU), and returns those that started, with the
// errors of those that did not.
func (r *Runtime) startChildren(ctx context.Context, specs []*runtime.Spec, tmpl *forkSource, disks []string) ([]*runtime.Instance, error) {
	started := make([]*runtime.Instance, len(specs))
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i, s := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if started[i], errs[i] = r.startChild(ctx, s, tmpl, disks[i]); errs[i] != nil {
				errs[i] = fmt.Errorf("microvm: fork: child %s: %w", s.ID, errs[i])
			}
		}()
	}
	wg.Wait()
	var insts []*runtime.Instance
	for _, in := range started {
		if in != nil {
			insts = append(insts, in)
		}
	}
	return insts, errors.Join(errs...)
}

// forkSource is what a fork's children start from.
type forkSource struct {
	args                    []string // the parent's QEMU arguments (anonymous RAM)
	parentState, parentDisk string
	snapshot                string   // the memory snapshot the children read
	ram                     *os.File // the sealed RAM memfd they map privately (nil: none)
	ramMB                   int64
}

// argsFor is src's command line for the VM named name with the state
// directory state and the disk disk.
func (src *forkSource) argsFor(name, state, disk string) []string {
	args := make([]string, len(src.args))
	for i, a := range src.args {
		switch {
		case i > 0 && src.args[i-1] == "-name":
			a = name
		default:
			a = strings.ReplaceAll(a, src.parentDisk, disk)
			a = strings.ReplaceAll(a, src.parentState+"/", state+"/")
		}
		args[i] = a
	}
	return args
}

// ramTemplate restores the snapshot once into a QEMU whose RAM is a file
// mapped shared (so the file holds the guest's memory), snapshots that
// QEMU again without its RAM (x-ignore-shared: the device state alone) and
// ends it. Children restore the small snapshot over a private mapping of
// the file: they share its pages until they write them.
// The RAM file goes into ramDir ("": /dev/shm where it exists).
func (r *Runtime) ramTemplate(ctx context.Context, parentID string, src *forkSource, disk string, memMB int64, ramDir string) (ram, dev string, err error) {
	dir, err := os.MkdirTemp("", "warren-vmt") // short: socket paths
	if err != nil {
		return "", "", err
	}
	tid := parentID + ".fork"
	th := runtime.Handle{ID: tid, Tier: Tier, Socket: filepath.Join(dir, SocketName), Cgroup: r.cgroupPath(tid)}
	defer func() {
		if derr := r.Destroy(context.WithoutCancel(ctx), th); derr != nil && err == nil {
			err = derr
		}
		os.RemoveAll(dir)
		if err != nil {
			os.Remove(ram)
			os.Remove(dev)
		}
	}()
	if ramDir == "" {
		ramDir = "/dev/shm"
		if st, serr := os.Stat(ramDir); serr != nil || !st.IsDir() {
			ramDir = filepath.Dir(src.snapshot)
		}
	}
	f, err := os.CreateTemp(ramDir, "warren-vm-ram-")
	if err != nil {
		return "", "", err
	}
	ram = f.Name()
	f.Close()
	args, err := withRAMFile(src.argsFor(r.qemuName(tid), dir, disk), ram, memMB, true)
	if err != nil {
		return ram, "", err
	}
	if err := r.cg.create(th.Cgroup, memMB+overheadMB); err != nil {
		return ram, "", err
	}
	if th, err = r.startIncoming(ctx, th, args, src.snapshot, false, nil); err != nil {
		return ram, "", err
	}
	dev = src.snapshot + ".dev"
	if err := r.saveMemory(ctx, th, dev, true); err != nil {
		return ram, dev, err
	}
	if err := punchZeros(ram); err != nil {
		r.log.Warn("microvm: fork: RAM file stays whole", "err", err)
	}
	return ram, dev, nil
}

// punchZeros frees the all-zero pages of the file at p (the restore read
// every page of the guest, so the file holds pages the guest never used):
// holes read as zeros, and a child's read of one shares a page again.
func punchZeros(p string) error {
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	const page = 4096
	buf := make([]byte, 2<<20)
	var off, run, runAt int64
	flush := func() error {
		if run > 0 {
			if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, runAt, run); err != nil {
				return err
			}
		}
		run = 0
		return nil
	}
	for {
		n, err := io.ReadFull(f, buf)
		for i := 0; i+page <= n; i += page {
			if allZero(buf[i : i+page]) {
				if run == 0 {
					runAt = off + int64(i)
				}
				run += page
			} else if ferr := flush(); ferr != nil {
				return ferr
			}
		}
		off += int64(n)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return flush()
		}
		if err != nil {
			return err
		}
	}
}

var zeroPage [4096]byte

func allZero(b []byte) bool { return bytes.Equal(b, zeroPage[:len(b)]) }

// The RAM backend of a fork's VMs: the machine's default RAM block's id,
// so that a snapshot of anonymous RAM restores into it and back.
const ramID = "microvm.ram"

// withRAMFile maps args's RAM (memMB) from the file path, shared (the
// template) or private (a child).
func withRAMFile(args []string, path string, memMB int64, share bool) ([]string, error) {
	if strings.ContainsAny(path, ", ") {
		return nil, fmt.Errorf("RAM file path %q has a comma or space", path)
	}
	out := append([]string(nil), args...)
	found := false
	for i := 0; i+1 < len(out); i++ {
		if out[i] == "-M" && strings.HasPrefix(out[i+1], "microvm") {
			out[i+1] += ",memory-backend=" + ramID
			found = true
		}
	}
	if !found {
		return nil, errors.New("no -M microvm argument")
	}
	on := "off"
	if share {
		on = "on"
	}
	return append(out, "-object", fmt.Sprintf("memory-backend-file,id=%s,size=%dM,mem-path=%s,share=%s", ramID, memMB, path, on)), nil
}

// withoutRAMFile undoes withRAMFile: anonymous RAM again (a child paused
// or forked in its turn).
func withoutRAMFile(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == "-object" && i+1 < len(args) && strings.HasPrefix(args[i+1], "memory-backend-file,id="+ramID+",") {
			i++
			continue
		}
		a := args[i]
		if i > 0 && args[i-1] == "-M" {
			a = strings.Replace(a, ",memory-backend="+ramID, "", 1)
		}
		out = append(out, a)
	}
	return out
}

// memoryArg is the guest memory (-m) of args, in MiB.
func memoryArg(args []string) (int64, error) {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-m" {
			n, err := strconv.ParseInt(strings.TrimSuffix(args[i+1], "M"), 10, 64)
			if err != nil || n <= 0 {
				return 0, fmt.Errorf("-m %q", args[i+1])
			}
			return n, nil
		}
	}
	return 0, errors.New("no -m argument")
}

// startChild starts one child of a fork from src with the child's name,
// state directory and disk, and gives it its identity.
func (r *Runtime) startChild(ctx context.Context, s *runtime.Spec, src *forkSource, disk string) (*runtime.Instance, error) {
	if s.ID == "" || s.ID != filepath.Base(s.ID) || strings.ContainsAny(s.ID, ", ") {
		return nil, fmt.Errorf("bad sandbox id %q", s.ID)
	}
	args := src.argsFor(r.qemuName(s.ID), s.StateDir, disk)
	h := runtime.Handle{ID: s.ID, Tier: Tier, Socket: filepath.Join(s.StateDir, SocketName), Cgroup: r.cgroupPath(s.ID)}
	fail := func(err error) (*runtime.Instance, error) {
		_ = r.Destroy(context.WithoutCancel(ctx), h)
		return nil, err
	}
	shared := src.ram != nil
	if shared {
		var err error
		if args, err = withRAMFile(args, ramFDPath, src.ramMB, false); err != nil {
			return fail(err)
		}
	}
	if err := r.cg.create(h.Cgroup, memoryOf(s)+overheadMB); err != nil {
		return fail(err)
	}
	nh, err := r.startIncoming(ctx, h, args, src.snapshot, shared, src.ram)
	h = nh
	if err != nil {
		return fail(err)
	}
	if s.CPU > 0 {
		if err := r.cg.setCPU(h.Cgroup, s.CPU); err != nil {
			return fail(err)
		}
	}
	if err := r.qmp(h, func(m *raw.Monitor) error { return m.Cont() }); err != nil {
		return fail(err)
	}
	conn, err := r.dial(ctx, h)
	if err != nil {
		return fail(err)
	}
	client := agentproto.NewClient(r.track(h.ID, conn))
	inst := &runtime.Instance{Handle: h, Agent: client}
	hostname := s.Hostname
	if hostname == "" {
		hostname = s.ID
	}
	if err := setIdentity(ctx, client, hostname, identityFork); err != nil {
		client.Close()
		return fail(err)
	}
	return inst, nil
}

// Whose identity setIdentity sets.
const (
	identityFork     = iota // a fork's child: its files too, and free page reporting ends (its RAM is shared)
	identityTemplate        // a template's VM: its kernel's only (its root is its own; no reporting since the template)
)

// setIdentity gives a restored VM its own hostname, machine-id (a fork's
// child), clock and random pool (agentproto.OpIdentity): the host's random
// bytes, which no sibling saw, are credited to the guest kernel's pool.
func setIdentity(ctx context.Context, client *agentproto.Client, hostname string, kind int) error {
	id := make([]byte, 16)
	seed := make([]byte, 256)
	if _, err := rand.Read(id); err != nil {
		return err
	}
	if _, err := rand.Read(seed); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req := &agentproto.IdentityRequest{Hostname: hostname, MachineID: hex.EncodeToString(id), Entropy: seed,
		UnixNano: time.Now().UnixNano(), KernelOnly: kind == identityTemplate, NoPageReporting: kind == identityFork}
	if err := client.Call(cctx, agentproto.OpIdentity, req, nil, nil); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	return nil
}
