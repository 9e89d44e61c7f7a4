package microvm

// Fork from memory: N VMs restored from one memory snapshot of a running
// VM, each continuing its processes. The parent is stopped for the
// snapshot and for a copy of its writable disk (the guest writes nothing
// then, and QEMU has flushed it), and continues afterwards. Each child has
// its own disk copy (cp --reflink=auto: a clone where the filesystem can),
// sockets and cgroup; its hostname is set to its spec's.
//
// Not yet: the API (POST /v1/sandboxes/{id}/fork {"memory": true}) and the
// edge's records of the children; guest memory is read into each child
// (no copy-on-write sharing between them); machine-id and entropy are not
// reseeded.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/digitalocean/go-qemu/qmp/raw"

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
	args, err := qemuArgs(pid)
	if err != nil {
		return nil, err
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

	// Stop, snapshot, copy the disks, continue.
	if err := r.Freeze(ctx, h); err != nil {
		return nil, err
	}
	disks := make([]string, len(specs))
	err = r.saveMemory(ctx, h, mem)
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
	if err != nil {
		for i, s := range specs {
			if disks[i] != "" {
				os.Remove(disks[i])
				os.Remove(filepath.Join(s.StateDir, DiskLink))
			}
		}
		return nil, fmt.Errorf("microvm: fork: %w", err)
	}

	for i, s := range specs {
		inst, err := r.startChild(ctx, s, args, parentState, parentDisk, disks[i], mem)
		if err != nil {
			return insts, fmt.Errorf("microvm: fork: child %s: %w", s.ID, err)
		}
		insts = append(insts, inst)
	}
	return insts, nil
}

// startChild starts one child of a fork from the parent's command line with
// the child's name, state directory and disk, and sets its hostname.
func (r *Runtime) startChild(ctx context.Context, s *runtime.Spec, parentArgs []string, parentState, parentDisk, disk, mem string) (*runtime.Instance, error) {
	if s.ID == "" || s.ID != filepath.Base(s.ID) || strings.ContainsAny(s.ID, ", ") {
		return nil, fmt.Errorf("bad sandbox id %q", s.ID)
	}
	args := make([]string, len(parentArgs))
	for i, a := range parentArgs {
		switch {
		case i > 0 && parentArgs[i-1] == "-name":
			a = r.qemuName(s.ID)
		default:
			a = strings.ReplaceAll(a, parentDisk, disk)
			a = strings.ReplaceAll(a, parentState+"/", s.StateDir+"/")
		}
		args[i] = a
	}
	h := runtime.Handle{ID: s.ID, Tier: Tier, Socket: filepath.Join(s.StateDir, SocketName), Cgroup: r.cgroupPath(s.ID)}
	fail := func(err error) (*runtime.Instance, error) {
		_ = r.Destroy(context.WithoutCancel(ctx), h)
		return nil, err
	}
	if err := r.cg.create(h.Cgroup, memoryOf(s)+overheadMB); err != nil {
		return fail(err)
	}
	nh, err := r.startIncoming(ctx, h, args, mem)
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
	if err := setIdentity(ctx, client, hostname); err != nil {
		client.Close()
		return fail(err)
	}
	return inst, nil
}

// setIdentity gives a restored child its own hostname, machine-id and
// random pool (agentproto.OpIdentity): the host's random bytes, which no
// sibling saw, are credited to the guest kernel's pool.
func setIdentity(ctx context.Context, client *agentproto.Client, hostname string) error {
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
	req := &agentproto.IdentityRequest{Hostname: hostname, MachineID: hex.EncodeToString(id), Entropy: seed}
	if err := client.Call(cctx, agentproto.OpIdentity, req, nil, nil); err != nil {
		return fmt.Errorf("identity: %w", err)
	}
	return nil
}
