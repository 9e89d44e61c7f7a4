package microvm

// Memory templates: a create restores a booted guest instead of booting
// one. The first create of a shape (guest memory, vCPUs) boots a template
// VM whose agent stops before the guest knows any disk: the disk driver
// (agent.VMDiskModule) is not loaded, nor the balloon's (no free page
// reporting: the RAM will be shared), and no root is assembled. Its memory
// is saved, restored once into RAM that is a file (as fork.go's ramTemplate
// does) and saved again without the RAM (the device state alone). Every
// later create of the shape restores that device state over a private
// mapping of the RAM file (its sealed copy in memory: ramfile.go), with its
// own disks in the template's disk
// slots, and its agent then loads the disk driver and assembles the root
// at setup (SetupConfig.VMLayers), and takes an identity of its own
// (hostname, random pool, clock: OpIdentity).
//
// What it buys: the guest's kernel and agent pages are the RAM file's,
// shared by every VM of the shape until one writes them (host memory per
// idle VM), and a restore skips the kernel's boot (create→first exec).
//
// A networked VM restores a template of its own shape with a virtio-net
// interface (no host end in the template; the VM's tap in the VM), whose
// driver the template does not load either (agent.VMDeferredModules): it
// negotiates with the VM's tap. The template's MAC is migrated state, so
// the agent gives the interface the VM's MAC at setup.
//
// The disk slots: a template's VM has templateLayers layer disks and
// templateBinds bind disks besides the writable one, so that every VM
// restored from it has the same devices; a VM with fewer fills the rest
// with a one-page placeholder, which its guest never mounts. A spec that
// needs more disks, its own boot disk or the vm tier's extra devices boots
// as before, and so does every VM of a guest kernel whose
// virtio_blk is built in (it would probe the template's own disks). So does every VM when the template of its shape
// cannot be built (logged; tried again a minute later).
//
// Templates live in CacheDir/templates/<generation>-<shape>; the generation
// hashes what the guest's memory depends on (initramfs, kernel, QEMU,
// accelerator, the slots), and New removes every other generation.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/digitalocean/go-qemu/qmp/raw"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/runtime"
)

const (
	templateLayers = 6 // layer disk slots of a template's VM
	templateBinds  = 2 // bind disk slots
	// templateFormat changes when what a template holds changes in a way
	// the generation's other inputs do not show.
	templateFormat = 2
	templatesDir   = "templates"
	// templateRetry is how long after a failed build a shape boots
	// without a template.
	templateRetry = time.Minute
)

// Files of a template's directory.
const (
	// placeholderName is the disk of an unused slot, in CacheDir/templates
	// and shared by every generation: a VM's recorded command line names
	// it, and a VM of an older generation may still be paused or resumed.
	placeholderName = ".placeholder"
	templateDevice  = "dev" // the device state (x-ignore-shared)
	templateRAM     = "ram" // the guest's memory, mapped privately
)

// templateShape is what a template is built for.
type templateShape struct {
	memMB int64
	smp   int
	net   bool // a network interface (virtio-net) after the writable disk
}

func (s templateShape) String() string {
	n := ""
	if s.net {
		n = "-net"
	}
	return fmt.Sprintf("%dm-%dc%s", s.memMB, s.smp, n)
}

// templateMAC is the MAC of a networked template's interface, which its
// VMs inherit (the MAC is part of virtio-net's migrated state): their agent
// gives the interface its own at setup (agent.vmNetwork).
const templateMAC = "02:77:61:72:00:01"

// vmTemplate is a built template.
type vmTemplate struct {
	dir   string
	shape templateShape
	ram   *os.File // the RAM file's sealed copy, which the VMs map (ramfile.go)
}

func (t *vmTemplate) path(name string) string { return filepath.Join(t.dir, name) }

// templateBuild is one shape's template, built once (done closes).
type templateBuild struct {
	done    chan struct{}
	t       *vmTemplate
	err     error
	retryAt time.Time
}

// smpOf is the vCPU count of spec's VM.
func smpOf(spec *runtime.Spec) int {
	return max(1, int(math.Ceil(spec.CPU)))
}

// templateFor is the template spec's VM restores from, or nil: the VM
// boots from its kernel (see the file comment for which do).
func (r *Runtime) templateFor(ctx context.Context, spec *runtime.Spec, layers, binds int) *vmTemplate {
	if !r.templatesOn() || spec.Disk != "" || layers > templateLayers || binds > templateBinds || (spec.Network != nil && !r.netTemplates) {
		return nil
	}
	b := r.startTemplate(templateShape{memMB: memoryOf(spec), smp: smpOf(spec), net: spec.Network != nil})
	if b == nil {
		return nil
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		return nil
	}
	if b.err != nil {
		return nil
	}
	return b.t
}

// templatesOn reports whether this runtime restores VMs from templates at
// all (the microvm machine, without extra devices, templates not off).
func (r *Runtime) templatesOn() bool {
	return !r.cfg.NoTemplates && r.cfg.Machine == "" && r.cfg.Extra == nil
}

// WarmTemplate starts building the memory template of a create that asks
// for nothing (DefaultMemoryMB, one vCPU, no network), unless it is built
// or templates are off, and returns at once: the first such create then
// waits for less, or for nothing.
func (r *Runtime) WarmTemplate() {
	if !r.templatesOn() {
		return
	}
	r.startTemplate(templateShape{memMB: DefaultMemoryMB, smp: 1})
}

// startTemplate returns the build of shape's template, started now unless
// it is under way, done, or failed less than templateRetry ago; nil once
// the runtime is closing.
func (r *Runtime) startTemplate(shape templateShape) *templateBuild {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bgCtx.Err() != nil { // closed
		return nil
	}
	b := r.templates[shape]
	if b != nil && b.retryAt.After(time.Time{}) && time.Now().After(b.retryAt) {
		b = nil
	}
	if b == nil {
		b = &templateBuild{done: make(chan struct{})}
		r.templates[shape] = b
		r.bg.Add(1)
		go func() {
			defer r.bg.Done()
			t0 := time.Now()
			t, err := r.buildTemplate(r.bgCtx, shape)
			r.mu.Lock()
			b.t, b.err = t, err
			if err != nil {
				b.retryAt = time.Now().Add(templateRetry)
			}
			r.mu.Unlock()
			close(b.done)
			switch {
			case err != nil && r.bgCtx.Err() == nil:
				r.log.Warn("microvm: no memory template: VMs of this shape boot from the kernel", "shape", shape, "err", err)
			case err == nil:
				r.log.Info("microvm: memory template ready", "shape", shape.String(), "took", time.Since(t0).Round(time.Millisecond))
			}
		}()
	}
	return b
}

// templateGeneration hashes what a template's memory depends on.
func (r *Runtime) templateGeneration() (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "format %d\x00initramfs %s\x00accel %s\x00tb %d\x00slots %d %d\x00",
		templateFormat, filepath.Base(r.initramfs), r.cfg.Accel, TCGBufferMB, templateLayers, templateBinds)
	for _, p := range []string{r.cfg.Kernel.Vmlinux(), r.cfg.QEMU} {
		st, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %d %d\x00", p, st.Size(), st.ModTime().UnixNano())
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// removeOldTemplates removes the templates of other generations and
// builds that a crash interrupted (New: no build runs yet).
func (r *Runtime) removeOldTemplates() error {
	gen, err := r.templateGeneration()
	if err != nil {
		return err
	}
	root := filepath.Join(r.cfg.CacheDir, templatesDir)
	ents, err := os.ReadDir(root)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), gen+"-") && e.Name() != placeholderName {
			if err := os.RemoveAll(filepath.Join(root, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// placeholder is the disk of an unused slot (made by New).
func (r *Runtime) placeholder() string {
	return filepath.Join(r.cfg.CacheDir, templatesDir, placeholderName)
}

// makePlaceholder makes the placeholder disk unless it exists.
func (r *Runtime) makePlaceholder() error {
	p := r.placeholder()
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return writeAtomic(p, make([]byte, 4096))
}

// templateArgs is QEMU's command line for the VM id (state directory
// state) of a template of shape: its layers and binds in the template's
// slots, the rest filled with placeholder, and its network interface nc
// (a networked shape; nil: the template's own, which has no host end).
func (r *Runtime) templateArgs(id, state string, shape templateShape, layers, binds []string, disk, placeholder string, nc *nic) ([]string, error) {
	pad := func(files []string, n int) []string {
		out := append([]string(nil), files...)
		for len(out) < n {
			out = append(out, placeholder)
		}
		return out
	}
	spec := &runtime.Spec{ID: id, StateDir: state, MemoryMB: shape.memMB, CPU: float64(shape.smp)}
	if shape.net && nc == nil {
		nc = &nic{mac: templateMAC}
	}
	return r.command(spec, pad(layers, templateLayers), pad(binds, templateBinds), disk, nc, true)
}

// buildTemplate boots the template of shape, or finds it built.
func (r *Runtime) buildTemplate(ctx context.Context, shape templateShape) (*vmTemplate, error) {
	gen, err := r.templateGeneration()
	if err != nil {
		return nil, err
	}
	root := filepath.Join(r.cfg.CacheDir, templatesDir)
	t := &vmTemplate{dir: filepath.Join(root, gen+"-"+shape.String()), shape: shape}
	if templateComplete(t) {
		return t, t.seal()
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(root, ".build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)                      // renamed on success
	state, err := os.MkdirTemp("", "warren-vmt") // short: socket paths
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(state)
	// Sandbox ids never start with a dot (Start): no sandbox's name.
	tid := ".template-" + gen[:8] + "-" + shape.String()
	r.mu.Lock()
	r.building[tid], r.building[tid+".fork"] = true, true // ramTemplate's
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.building, tid)
		delete(r.building, tid+".fork")
		r.mu.Unlock()
	}()
	bctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	src, err := r.bootTemplate(bctx, tid, shape, state, tmp)
	if err != nil {
		return nil, err
	}
	ram, dev, err := r.ramTemplate(bctx, tid, src, src.parentDisk, shape.memMB, tmp)
	if err != nil {
		return nil, fmt.Errorf("RAM file: %w", err)
	}
	if err := os.Rename(ram, filepath.Join(tmp, templateRAM)); err != nil {
		return nil, err
	}
	if err := os.Rename(dev, filepath.Join(tmp, templateDevice)); err != nil {
		return nil, err
	}
	for _, p := range []string{src.snapshot, src.parentDisk} {
		if err := os.Remove(p); err != nil {
			return nil, err
		}
	}
	if err := os.Rename(tmp, t.dir); err != nil && !templateComplete(t) { // else another build of the shape won
		return nil, err
	}
	return t, t.seal()
}

// bootTemplate boots the template VM tid of shape (its sockets in state),
// waits for its agent, and saves its memory into dir; the VM is gone when
// it returns. The result names the VM's command line, its disk and the
// snapshot, for ramTemplate.
func (r *Runtime) bootTemplate(ctx context.Context, tid string, shape templateShape, state, dir string) (_ *forkSource, err error) {
	// The template's own disks (the writable one too): a page of its own,
	// which its guest never reads.
	disk := filepath.Join(dir, "disk")
	if err := os.WriteFile(disk, make([]byte, 4096), 0o600); err != nil {
		return nil, err
	}
	h := runtime.Handle{ID: tid, Tier: r.Name(), Socket: filepath.Join(state, SocketName), Cgroup: r.cgroupPath(tid)}
	defer func() {
		if derr := r.Destroy(context.WithoutCancel(ctx), h); derr != nil && err == nil {
			err = derr
		}
	}()
	args, err := r.templateArgs(tid, state, shape, nil, nil, disk, disk, nil)
	if err != nil {
		return nil, err
	}
	if err := r.cg.create(h.Cgroup, shape.memMB+overheadMB); err != nil {
		return nil, err
	}
	cmd, err := r.spawn(state, h.Cgroup, args, nil)
	if err != nil {
		return nil, err
	}
	h.Pid = cmd.Process.Pid
	if h.PidStart, err = pidStart(h.Pid); err != nil {
		return nil, err
	}
	conn, err := r.dial(ctx, h)
	if err != nil {
		return nil, err
	}
	client := agentproto.NewClient(conn)
	var pong agentproto.PingResult
	err = client.Call(ctx, agentproto.OpPing, nil, &pong, nil)
	client.Close()
	if err != nil {
		return nil, fmt.Errorf("template's agent: %w (guest console: %q)", err, logTail(filepath.Join(state, ConsoleName), 600))
	}
	if err := r.Freeze(ctx, h); err != nil {
		return nil, err
	}
	full := filepath.Join(dir, "full")
	if err := r.saveMemory(ctx, h, full, false); err != nil {
		return nil, fmt.Errorf("memory snapshot: %w", err)
	}
	return &forkSource{args: args, parentState: state, parentDisk: disk, snapshot: full}, nil
}

// seal loads t's RAM file into the sealed memfd its VMs map.
func (t *vmTemplate) seal() (err error) {
	t.ram, err = sealedCopy(t.path(templateRAM), templateRAMName)
	return err
}

// templateComplete reports whether t's files are all there.
func templateComplete(t *vmTemplate) bool {
	for _, n := range []string{templateDevice, templateRAM} {
		if _, err := os.Stat(t.path(n)); err != nil {
			return false
		}
	}
	return true
}

// startFromTemplate starts spec's VM (handle h, cgroup made) from t with
// its layers, binds and writable disk: QEMU restores t's device state over
// a private mapping of its RAM file, and runs. It returns h with QEMU's
// pid; the agent assembles the root at setup (SetupConfig.VMLayers).
func (r *Runtime) startFromTemplate(ctx context.Context, h runtime.Handle, spec *runtime.Spec, t *vmTemplate, layers, binds []string, disk string, nc *nic) (runtime.Handle, error) {
	args, err := r.templateArgs(spec.ID, spec.StateDir, t.shape, layers, binds, disk, r.placeholder(), nc)
	if err != nil {
		return h, err
	}
	if args, err = withRAMFile(args, ramFDPath, t.shape.memMB, false); err != nil {
		return h, err
	}
	// Not part of the migrated state: the buffer starts empty either way.
	for i, a := range args {
		if strings.HasPrefix(a, "tcg,tb-size=") {
			args[i] = "tcg,tb-size=" + strconv.Itoa(r.cfg.RestoredTCGBufferMB)
		}
	}
	if h, err = r.startIncoming(ctx, h, args, t.path(templateDevice), true, t.ram); err != nil {
		return h, fmt.Errorf("restore the memory template: %w", err)
	}
	if err := r.qmp(h, func(m *raw.Monitor) error { return m.Cont() }); err != nil {
		return h, err
	}
	return h, nil
}

// hostnameOf is the guest hostname of spec's VM.
func hostnameOf(spec *runtime.Spec) string {
	if spec.Hostname == "" || strings.ContainsAny(spec.Hostname, " \t\n") || len(spec.Hostname) > 64 {
		return "sandbox"
	}
	return spec.Hostname
}
