package microvm

// Locks: Runtime.mu only (children), never held across a call that blocks.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/digitalocean/go-qemu/qmp"
	"github.com/digitalocean/go-qemu/qmp/raw"

	"github.com/warrenhq/warren/internal/agent"
	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/sandboxnet"
)

// Tier is the tier's name.
const Tier = "microvm"

// Files in a sandbox's StateDir.
const (
	SocketName  = "agent.sock" // the host end of the agent's virtio-serial port
	QMPName     = "qmp.sock"
	ConsoleName = "console.log" // the guest's serial console (kernel and agent log)
	LogName     = "qemu.log"
	DiskLink    = "disk" // symlink to the writable disk (it lives on the writable storage)
	DiskName    = "vm-disk.ext4"
	portName    = "warren.agent"
	// namePrefix starts QEMU's -name, "warren-vm:<cgroup parent>/<id>":
	// how Leftovers and Destroy recognise this runtime's VMs (and not
	// those of another warren on the host).
	namePrefix = "warren-vm:"
)

// Defaults of a sandbox that asks for nothing.
const (
	DefaultMemoryMB = 256
	DefaultDiskMB   = 1024
	// overheadMB is what QEMU needs beyond the guest's memory (TCG's code
	// buffer, the kernel file's mapping, QEMU itself): the cgroup's limit
	// is the guest memory plus this.
	overheadMB = 256
)

// TCGBufferMB caps TCG's translated-code buffer (QEMU 7.2's default is 1
// GiB). A booting guest fills ~55 MiB of it, and what it filled stays
// resident while the VM lives, idle or not. 32 MiB (one flush of the
// buffer during boot) saved ~26 MiB per VM against 64 at no measurable
// cost to create→first exec; 16 and 8 MiB slowed the boot (flushes and
// retranslation). See docs/BENCHMARKS.md, "MicroVM figures".
const TCGBufferMB = 32

// RestoredTCGBufferMB is the default code buffer of a VM restored from a
// memory template (Config.RestoredTCGBufferMB): it translates only what
// runs after the restore (assembling the root, the agent's work), not the
// boot. 20 idle VMs of 256 MiB, one run each: 32 MiB gave 67 MiB of host
// memory (PSS) per VM and create→first exec p50 0.51 s; 16 MiB 50 MiB and
// 0.69 s; 8 MiB 41 MiB and 1.2 s (docs/BENCHMARKS.md).
const RestoredTCGBufferMB = 16

// Config configures the tier.
type Config struct {
	// Kernel is the guest kernel (OpenKernel).
	Kernel Kernel
	// AgentPath is the warren-agent binary: /init of the initramfs.
	AgentPath string
	// CacheDir holds the initramfs (built once per agent and kernel).
	CacheDir string
	// LayerFile maps a layer's mounted directory (runtime.Spec.Lowers) to
	// its EROFS image, which the VM attaches as a read-only disk.
	LayerFile func(dir string) (string, error)
	// QEMU is the qemu-system-x86_64 binary (default: found in PATH).
	QEMU string
	// Accel is "kvm" or "tcg"; "" picks KVM when a guest really runs
	// with it (ProbeKVM), else TCG.
	Accel string
	// CgroupParent is the cgroup (relative to each hierarchy's root) under
	// which every VM's QEMU gets its own; default "warren-vm".
	CgroupParent string
	Logger       *slog.Logger
	// Machine is QEMU's machine: "" (microvm) or MachineQ35, which the
	// "vm" tier (internal/runtime/vm) boots with the same kernel,
	// initramfs, disks and agent port on PCI.
	Machine string
	// TierName names the tier (default Tier).
	TierName string
	// Extra, when set, adds QEMU arguments and kernel parameters for a
	// sandbox (the vm tier's display).
	Extra func(spec *runtime.Spec) (args, params []string)
	// Net gives networked sandboxes their networks (the container tier's
	// manager: one per node); nil refuses them.
	Net *sandboxnet.Manager
	// NoTemplates boots every VM from its kernel instead of restoring most
	// from a memory template of their shape (template.go).
	NoTemplates bool
	// RestoredTCGBufferMB is TCG's code buffer, in MiB, of a VM restored
	// from a memory template (0: RestoredTCGBufferMB; no effect under KVM).
	// What a VM filled of it stays resident while it lives: smaller holds
	// more idle VMs per node, and retranslates more.
	RestoredTCGBufferMB int
}

// MachineQ35 is the full-VM machine of the "vm" tier.
const MachineQ35 = "q35"

// Runtime is the "microvm" tier.
type Runtime struct {
	cfg       Config
	log       *slog.Logger
	initramfs string
	chroot    string // QEMU's empty root (spawn.go)
	cg        cgroupDriver

	mu        sync.Mutex
	children  map[int]chan struct{}            // QEMUs this process started, closed when reaped
	conns     map[string]*vmConn               // the edge's agent connection per sandbox (snapshot.go)
	templates map[templateShape]*templateBuild // template.go
	// netTemplates: networked VMs restore templates too (template.go).
	netTemplates bool
	// building holds the ids of the template VMs this process runs now:
	// not leftovers (a build may run while the edge reconciles at start).
	building map[string]bool

	// Template builds run beside the creates that wait for them; Close
	// cancels and waits for them.
	bg       sync.WaitGroup
	bgCtx    context.Context
	bgCancel context.CancelFunc
}

var _ runtime.Runtime = (*Runtime)(nil)

// New checks the configuration and builds the initramfs.
func New(cfg Config) (*Runtime, error) {
	if cfg.AgentPath == "" || cfg.Kernel.Dir == "" || cfg.CacheDir == "" || cfg.LayerFile == nil {
		return nil, errors.New("microvm: AgentPath, Kernel, CacheDir and LayerFile are required")
	}
	if cfg.QEMU == "" {
		p, err := exec.LookPath("qemu-system-x86_64")
		if err != nil {
			return nil, fmt.Errorf("microvm: qemu-system-x86_64 not found (scripts/install-deps.sh installs it): %w", err)
		}
		cfg.QEMU = p
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "warren-vm"
	}
	if strings.ContainsAny(cfg.CgroupParent, ", \t\n") {
		return nil, fmt.Errorf("microvm: cgroup parent %q: no commas or spaces (it is part of QEMU's -name)", cfg.CgroupParent)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.RestoredTCGBufferMB <= 0 {
		cfg.RestoredTCGBufferMB = RestoredTCGBufferMB
	}
	if cfg.TierName == "" {
		cfg.TierName = Tier
	}
	if cfg.Accel == "" {
		cfg.Accel = "tcg"
		if ProbeKVM() {
			cfg.Accel = "kvm"
		}
	}
	initrd, err := BuildInitramfs(cfg.Kernel, cfg.AgentPath, cfg.CacheDir)
	if err != nil {
		return nil, err
	}
	chroot := filepath.Join(cfg.CacheDir, chrootName)
	if err := makeChroot(chroot); err != nil {
		return nil, err
	}
	r := &Runtime{cfg: cfg, log: cfg.Logger, initramfs: initrd, chroot: chroot, cg: newCgroupDriver(),
		children: map[int]chan struct{}{}, conns: map[string]*vmConn{}, templates: map[templateShape]*templateBuild{},
		building: map[string]bool{}}
	r.bgCtx, r.bgCancel = context.WithCancel(context.Background())
	if cfg.Machine != "" {
		return r, nil // no templates (template.go); CacheDir may be the microvm tier's
	}
	mods, err := cfg.Kernel.modules()
	if err != nil {
		return nil, fmt.Errorf("microvm: modules: %w", err)
	}
	if !slices.Contains(mods, agent.VMDiskModule) {
		// Built in, the disk driver would probe the template's own disks.
		r.log.Info("microvm: no memory templates: the guest kernel has no " + agent.VMDiskModule + " module")
		r.cfg.NoTemplates = true
	}
	// Built in, the network driver would bind the template's interface,
	// which has no host end: networked VMs boot then.
	r.netTemplates = slices.Contains(mods, agent.VMNetModule)
	if err := r.removeOldTemplates(); err != nil {
		return nil, fmt.Errorf("microvm: old memory templates: %w", err)
	}
	if err := r.makePlaceholder(); err != nil {
		return nil, fmt.Errorf("microvm: memory templates: %w", err)
	}
	return r, nil
}

// Close ends the template builds under way and removes the tier's parent
// cgroups (when no VM is left in them).
func (r *Runtime) Close() error {
	r.mu.Lock() // templateFor starts no build once bgCtx is done
	r.bgCancel()
	r.mu.Unlock()
	r.bg.Wait()
	r.mu.Lock()
	for _, b := range r.templates {
		select {
		case <-b.done:
			if b.t != nil {
				b.t.ram.Close() // the VMs keep their mappings
			}
		default:
		}
	}
	r.mu.Unlock()
	return r.cg.remove(r.cfg.CgroupParent)
}

// Name is the tier.
func (r *Runtime) Name() string { return r.cfg.TierName }

// Accel is the accelerator the VMs run with: "kvm" or "tcg".
func (r *Runtime) Accel() string { return r.cfg.Accel }

// KernelVersion names the guest kernel.
func (r *Runtime) KernelVersion() string { return r.cfg.Kernel.Version }

func (r *Runtime) cgroupPath(id string) string { return r.cfg.CgroupParent + "/" + id }

// Start boots the VM and returns once its agent answers setup.
func (r *Runtime) Start(ctx context.Context, spec *runtime.Spec) (inst *runtime.Instance, err error) {
	if err := r.checkStartSpec(spec); err != nil {
		return nil, err
	}
	t0 := time.Now()
	h := runtime.Handle{ID: spec.ID, Tier: r.Name(), Socket: filepath.Join(spec.StateDir, SocketName), Cgroup: r.cgroupPath(spec.ID)}
	var client *agentproto.Client
	defer func() {
		if err == nil {
			return
		}
		if client != nil {
			client.Close()
		}
		if derr := r.Destroy(context.WithoutCancel(ctx), h); derr != nil {
			r.log.Error("microvm: undo failed start", "id", spec.ID, "err", derr)
		}
	}()
	if err := os.MkdirAll(spec.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("microvm: state dir: %w", err)
	}
	layers := make([]string, len(spec.Lowers))
	for i, d := range spec.Lowers {
		if layers[i], err = r.cfg.LayerFile(d); err != nil {
			return nil, fmt.Errorf("microvm: layer %s: %w", d, err)
		}
	}
	binds, setupBinds, err := r.bindDisks(spec)
	if err != nil {
		return nil, err
	}
	disk, err := makeDisk(spec)
	if err != nil {
		return nil, err
	}
	tDisk := time.Now()
	if err := r.cg.create(h.Cgroup, memoryOf(spec)+overheadMB); err != nil {
		return nil, err
	}
	// After the cgroup: a crash leaves the network with a cgroup, which
	// Leftovers finds and reconcile destroys.
	nc, err := r.attachNetwork(spec)
	if err != nil {
		return nil, err
	}
	if nc != nil {
		h.Net = &runtime.NetHandle{Address: nc.address, Gateway: nc.gateway}
	}
	tmpl := r.templateFor(ctx, spec, len(layers), len(binds))
	if h, err = r.launch(ctx, h, spec, tmpl, layers, binds, disk, nc); err != nil {
		return nil, err
	}
	conn, err := r.dial(ctx, h)
	if err != nil {
		return nil, err
	}
	client = agentproto.NewClient(r.track(h.ID, conn))
	tQEMU := time.Now()
	setup := &agentproto.SetupConfig{
		RootDir: "/", Unconfined: true, // the VM is the boundary; the agent assembled the root at boot
		Hostname: spec.Hostname, Env: spec.Env, User: spec.User, Cwd: spec.Cwd, Net: nc.setup(),
		Binds: setupBinds,
	}
	if tmpl != nil {
		setup.VMLayers = len(layers)
	}
	if err := r.setUp(ctx, client, h, spec, setup, tmpl != nil); err != nil {
		return nil, err
	}
	r.log.Debug("microvm: started", "id", spec.ID, "pid", h.Pid, "accel", r.cfg.Accel,
		"disk", tDisk.Sub(t0), "qemu", tQEMU.Sub(tDisk), "boot", time.Since(tQEMU), "total", time.Since(t0))
	return &runtime.Instance{Handle: h, Agent: client}, nil
}

// checkStartSpec refuses a spec that Start cannot run: a bad id, no state
// directory, no layers (or a bad disk for a full VM), stateless paths, or
// a network on a node that gives VMs none.
func (r *Runtime) checkStartSpec(spec *runtime.Spec) error {
	if spec.ID == "" || spec.ID != filepath.Base(spec.ID) || spec.ID[0] == '.' || strings.ContainsAny(spec.ID, ", ") {
		return fmt.Errorf("microvm: bad sandbox id %q", spec.ID)
	}
	if spec.StateDir == "" {
		return errors.New("microvm: StateDir is required")
	}
	switch {
	case spec.Disk != "":
		return r.checkDiskSpec(spec)
	case len(spec.Lowers) == 0:
		return errors.New("microvm: no layers")
	case len(spec.Stateless) > 0:
		return errors.New("microvm: stateless sandboxes are not supported by this tier")
	case spec.Network != nil && r.cfg.Net == nil:
		return errors.New("microvm: this node gives VMs no network")
	}
	return nil
}

// setUp sends the agent its setup, then, for a VM restored from a
// template, its own identity; writes resolv.conf for a networked VM; and
// from then on holds the VM to its CPU limit.
func (r *Runtime) setUp(ctx context.Context, client *agentproto.Client, h runtime.Handle, spec *runtime.Spec, setup *agentproto.SetupConfig, fromTemplate bool) error {
	var res agentproto.SetupResult
	if err := client.Call(ctx, agentproto.OpSetup, setup, &res, nil); err != nil {
		return fmt.Errorf("microvm: agent setup: %w (qemu: %q; guest console: %q)", err,
			logTail(filepath.Join(spec.StateDir, LogName), 300), logTail(filepath.Join(spec.StateDir, ConsoleName), 600))
	}
	if fromTemplate {
		// Its template's hostname, random pool and clock until now.
		if err := setIdentity(ctx, client, hostnameOf(spec), identityTemplate); err != nil {
			return fmt.Errorf("microvm: %w", err)
		}
	}
	if h.Net != nil {
		if err := runtime.WriteResolvConf(ctx, client, h.Net.Gateway); err != nil {
			return fmt.Errorf("microvm: %w", err)
		}
	}
	// The CPU limit holds from now on: the boot (seconds of CPU under TCG)
	// ran without it, as a container's agent set-up does.
	if spec.CPU > 0 {
		if err := r.cg.setCPU(h.Cgroup, spec.CPU); err != nil {
			return fmt.Errorf("microvm: cpu limit: %w", err)
		}
	}
	return nil
}

// launch starts spec's QEMU (handle h, cgroup made) with its disks and
// network, restored from tmpl or, when nil, booting; it returns h with
// QEMU's pid.
func (r *Runtime) launch(ctx context.Context, h runtime.Handle, spec *runtime.Spec, tmpl *vmTemplate, layers, binds []string, disk string, nc *nic) (runtime.Handle, error) {
	if tmpl != nil {
		h, err := r.startFromTemplate(ctx, h, spec, tmpl, layers, binds, disk, nc)
		if err != nil {
			return h, fmt.Errorf("microvm: %w", err)
		}
		return h, nil
	}
	args, err := r.command(spec, layers, binds, disk, nc, false)
	if err != nil {
		return h, err
	}
	cmd, err := r.spawn(spec.StateDir, h.Cgroup, args, nil)
	if err != nil {
		return h, err
	}
	h.Pid = cmd.Process.Pid
	if h.PidStart, err = pidStart(h.Pid); err != nil {
		return h, fmt.Errorf("microvm: qemu start time: %w", err)
	}
	return h, nil
}

// bindDisks are the EROFS images of spec's layers attached at paths (read-
// only disks with the serials bind0, bind1, …) and the binds the agent in
// the guest mounts from them. A protected bind is refused: root in the
// guest could replace it (sandboxspec refuses it first).
func (r *Runtime) bindDisks(spec *runtime.Spec) (files []string, binds []agentproto.Bind, err error) {
	for i, b := range spec.Binds {
		if b.Protected {
			return nil, nil, fmt.Errorf("microvm: protected layer at %s: not offered by this tier", b.Target)
		}
		f, err := r.cfg.LayerFile(b.Source)
		if err != nil {
			return nil, nil, fmt.Errorf("microvm: layer %s: %w", b.Source, err)
		}
		files = append(files, f)
		binds = append(binds, agentproto.Bind{Source: agent.VMBindPrefix + strconv.Itoa(i), Target: b.Target})
	}
	return files, binds, nil
}

// logTail is the last n bytes of the file at p (for errors: the state
// directory goes with the failed sandbox).
func logTail(p string, n int64) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return string(bytes.TrimSpace(b))
}

func memoryOf(spec *runtime.Spec) int64 {
	if spec.MemoryMB > 0 {
		return spec.MemoryMB
	}
	return DefaultMemoryMB
}

// makeDisk makes the sandbox's writable disk: a sparse ext4 file on the
// writable storage (spec.Work, else the state directory), linked from the
// state directory so that Destroy finds it.
func makeDisk(spec *runtime.Spec) (string, error) {
	if spec.Disk != "" {
		return makeOverlay(spec) // diskboot.go
	}
	dir := spec.Work
	if dir == "" {
		dir = spec.StateDir
	}
	size := spec.DiskMB
	if size <= 0 {
		size = DefaultDiskMB
	}
	p := filepath.Join(dir, DiskName)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return "", fmt.Errorf("microvm: disk: %w", err)
	}
	err = f.Truncate(size << 20)
	f.Close()
	if err != nil {
		return "", fmt.Errorf("microvm: disk: %w", err)
	}
	link := filepath.Join(spec.StateDir, DiskLink)
	os.Remove(link)
	if err := os.Symlink(p, link); err != nil {
		return "", fmt.Errorf("microvm: disk link: %w", err)
	}
	// No journal: the disk lives and dies with one sandbox. Lazy init:
	// mkfs writes only the metadata it needs (~30 ms).
	out, err := exec.Command("mkfs.ext4", "-q", "-F", "-O", "^has_journal", "-m", "0",
		"-E", "lazy_itable_init=1,root_owner=0:0", p).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("microvm: mkfs.ext4: %v: %s", err, bytes.TrimSpace(out))
	}
	return p, nil
}

// command is QEMU's command line for spec (spawn starts it).
// With template, the guest boots as a memory template (template.go).
func (r *Runtime) command(spec *runtime.Spec, layers, binds []string, disk string, nc *nic, template bool) ([]string, error) {
	smp := smpOf(spec)
	params := r.kernelParams(spec, len(layers), template)
	machine, bus := "microvm,x-option-roms=off,isa-serial=on,rtc=on", "-device"
	if r.cfg.Machine == MachineQ35 {
		machine, bus = MachineQ35, "-pci"
	}
	netArgs := nc.args(bus)
	cpu, accel := "max", "tcg,tb-size="+strconv.Itoa(TCGBufferMB)
	if r.cfg.Accel == "kvm" {
		cpu, accel = "host", "kvm"
	}
	// virtio devices: on MMIO for microvm, on PCI for q35 (machine and
	// bus above).
	args := []string{
		"-name", r.qemuName(spec.ID),
		"-M", machine,
		"-accel", accel, "-cpu", cpu,
		"-m", strconv.FormatInt(memoryOf(spec), 10), "-smp", strconv.Itoa(smp),
		"-no-reboot", "-nodefaults", "-no-user-config", "-display", "none",
		// QEMU's own seccomp filter: no obsolete syscalls, no processes
		// spawned, no scheduler/affinity changes. set*id stays allowed:
		// "-runas" (spawn.go) drops QEMU to a uid of its own with them,
		// after which they cannot raise anything (no capabilities).
		"-sandbox", "on,obsolete=deny,spawn=deny,resourcecontrol=deny",
		"-serial", "file:" + filepath.Join(spec.StateDir, ConsoleName),
		"-kernel", r.cfg.Kernel.Vmlinux(), "-initrd", r.initramfs,
		"-append", strings.Join(params, " "),
		"-qmp", "unix:" + filepath.Join(spec.StateDir, QMPName) + ",server=on,wait=off",
		// Free page reporting: memory the guest frees goes back to the
		// host (within seconds; blocks of any size, as the agent sets the
		// guest's page_reporting_order to 0).
		"-device", "virtio-balloon" + bus + ",free-page-reporting=on",
		"-device", "virtio-serial" + bus,
		"-chardev", "socket,id=agent,path=" + filepath.Join(spec.StateDir, SocketName) + ",server=on,wait=off",
		"-device", "virtserialport,chardev=agent,name=" + portName,
		"-drive", "id=rw,file=" + disk + ",format=raw,if=none,cache=unsafe,discard=unmap",
		"-device", "virtio-blk" + bus + ",drive=rw,serial=" + agent.VMDiskRW,
	}
	if r.cfg.Extra != nil {
		more, _ := r.cfg.Extra(spec)
		args = append(args, more...)
	}
	args = append(args, netArgs...)
	args, err := readOnlyDisks(args, bus, layers, "layer")
	if err != nil {
		return nil, err
	}
	if args, err = readOnlyDisks(args, bus, binds, agent.VMBindPrefix); err != nil {
		return nil, err
	}
	if spec.Disk != "" {
		args = bootFromDisk(args, spec.Disk) // diskboot.go
	}
	return args, nil
}

// kernelParams is the guest kernel's command line for spec: quiet, no
// reboot, the agent's parameters (layer count, port, hostname, template
// or not), after whatever the configuration's Extra adds.
func (r *Runtime) kernelParams(spec *runtime.Spec, layers int, template bool) []string {
	params := []string{
		"console=ttyS0", "quiet", "loglevel=3", "panic=-1", "reboot=t",
		// Without it ~30 % of TCG boots hang calibrating the TSC.
		"tsc_early_khz=2000000",
		"cryptomgr.notests", // crypto self-tests cost ~1.2 s under TCG
		agent.VMParamLayers + "=" + strconv.Itoa(layers),
		agent.VMParamPort + "=" + portName,
		agent.VMParamHostname + "=" + hostnameOf(spec),
	}
	if template {
		params = append(params, agent.VMParamTemplate+"=1")
	}
	if r.cfg.Extra != nil {
		_, more := r.cfg.Extra(spec)
		params = append(more, params...)
	}
	return params
}

// readOnlyDisks appends to args one read-only virtio-blk disk per file,
// on bus, with ids and serials prefix0, prefix1, ... (the agent finds
// them by serial).
func readOnlyDisks(args []string, bus string, files []string, prefix string) ([]string, error) {
	for i, l := range files {
		if strings.Contains(l, ",") {
			return nil, fmt.Errorf("microvm: layer path %q has a comma", l)
		}
		id := prefix + strconv.Itoa(i)
		args = append(args,
			"-drive", "id="+id+",file="+l+",format=raw,if=none,readonly=on",
			"-device", "virtio-blk"+bus+",drive="+id+",serial="+id)
	}
	return args, nil
}

// track registers c as the edge's connection to sandbox id's agent.
func (r *Runtime) track(id string, c net.Conn) *vmConn {
	v := newVMConn(c, func(v *vmConn) {
		r.mu.Lock()
		if r.conns[id] == v {
			delete(r.conns, id)
		}
		r.mu.Unlock()
	})
	r.mu.Lock()
	r.conns[id] = v
	r.mu.Unlock()
	return v
}

// conn is the edge's connection to sandbox id's agent, nil when none.
func (r *Runtime) conn(id string) *vmConn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conns[id]
}

// pidOf is the pid of h's QEMU: h.Pid while it runs, else (a VM restored
// from a memory snapshot runs in a new process) the one named for h; 0
// when none runs.
func (r *Runtime) pidOf(h runtime.Handle) int {
	if r.alive(h) {
		return h.Pid
	}
	found, err := r.findQEMUs()
	if err != nil {
		return 0
	}
	for _, q := range found {
		if q.id == h.ID && h.Socket != "" && runsAsRecorded(filepath.Dir(h.Socket), q.pid) {
			return q.pid
		}
	}
	return 0
}

func syscall9(pid int) error { return syscall.Kill(pid, syscall.SIGKILL) }

// reap waits for a QEMU this process started.
func (r *Runtime) reap(cmd *exec.Cmd) {
	done := make(chan struct{})
	r.mu.Lock()
	r.children[cmd.Process.Pid] = done
	r.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		if f, ok := cmd.Stdout.(*os.File); ok {
			f.Close()
		}
		r.mu.Lock()
		delete(r.children, cmd.Process.Pid)
		r.mu.Unlock()
		close(done)
	}()
}

// dial connects to the agent's socket, waiting until QEMU made it.
func (r *Runtime) dial(ctx context.Context, h runtime.Handle) (net.Conn, error) {
	for {
		c, err := net.Dial("unix", h.Socket)
		if err == nil {
			return c, nil
		}
		if r.pidOf(h) == 0 {
			return nil, fmt.Errorf("microvm: qemu exited (log: %s): %w", filepath.Join(filepath.Dir(h.Socket), LogName), runtime.ErrGone)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("microvm: connect to the agent: %w", ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// alive reports whether h's QEMU still runs.
func (r *Runtime) alive(h runtime.Handle) bool {
	if h.Pid <= 0 {
		return false
	}
	st, err := pidStart(h.Pid)
	return err == nil && st == h.PidStart && !isZombie(h.Pid)
}

// Attach reconnects to a VM that outlived a restart of the edge. QEMU's
// socket serves one connection at a time: this one is accepted when the
// previous one closes.
func (r *Runtime) Attach(ctx context.Context, h runtime.Handle) (*runtime.Instance, error) {
	if r.pidOf(h) == 0 {
		return nil, runtime.ErrGone
	}
	c, err := net.Dial("unix", h.Socket)
	if err != nil {
		if r.pidOf(h) == 0 {
			return nil, runtime.ErrGone
		}
		return nil, fmt.Errorf("microvm: attach: %w", err)
	}
	if h.Net != nil && r.cfg.Net != nil {
		if err := r.cfg.Net.Adopt(h.ID); err != nil {
			c.Close()
			return nil, fmt.Errorf("microvm: attach: %w", err)
		}
	}
	return &runtime.Instance{Handle: h, Agent: agentproto.NewClient(r.track(h.ID, c))}, nil
}

// Destroy kills the VM's QEMU, waits for it and frees its disk, sockets
// and cgroup. A handle without a pid (a start that failed early) finds the
// QEMU by its name.
func (r *Runtime) Destroy(ctx context.Context, h runtime.Handle) error {
	if h.ID == "" {
		return errors.New("microvm: destroy: no id")
	}
	pids := map[int]bool{}
	if r.alive(h) {
		pids[h.Pid] = true
	}
	found, err := r.findQEMUs()
	if err != nil {
		return err
	}
	for _, q := range found {
		if q.id == h.ID {
			pids[q.pid] = true
		}
	}
	for pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	for pid := range pids {
		if err := r.waitGone(ctx, pid); err != nil {
			return err
		}
	}
	// Before the cgroup: a crash in between leaves the cgroup, through
	// which reconcile finds the network again.
	if err := r.detachNetwork(h); err != nil {
		return err
	}
	if err := r.cg.remove(r.cgroupPath(h.ID)); err != nil {
		return err
	}

	if h.Socket != "" {
		dir := filepath.Dir(h.Socket)
		if target, err := os.Readlink(filepath.Join(dir, DiskLink)); err == nil {
			for _, p := range []string{target, filepath.Join(filepath.Dir(target), MemoryName)} {
				if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
					return fmt.Errorf("microvm: remove disk: %w", err)
				}
			}
		}
		for _, n := range []string{DiskLink, SocketName, QMPName, PausedName, ArgsName, uidName} {
			if err := os.Remove(filepath.Join(dir, n)); err != nil && !os.IsNotExist(err) {
				return fmt.Errorf("microvm: destroy: %w", err)
			}
		}
	}
	return nil
}

// waitGone waits until pid has exited (and, if ours, was reaped).
func (r *Runtime) waitGone(ctx context.Context, pid int) error {
	r.mu.Lock()
	done := r.children[pid]
	r.mu.Unlock()
	deadline := time.After(10 * time.Second)
	if done != nil {
		select {
		case <-done:
			return nil
		case <-deadline:
			return fmt.Errorf("microvm: qemu %d still runs 10 s after SIGKILL", pid)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil || isZombie(pid) {
			return nil
		}
		select {
		case <-deadline:
			return fmt.Errorf("microvm: qemu %d still runs 10 s after SIGKILL", pid)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Leftovers lists the VMs of this tier running on the host (QEMUs named
// by it, whatever started them) and the cgroups of VMs whose QEMU is gone.
func (r *Runtime) Leftovers(ctx context.Context) ([]runtime.Handle, error) {
	found, err := r.findQEMUs()
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	seen := map[string]bool{}
	for id := range r.building {
		seen[id] = true
	}
	r.mu.Unlock()
	var hs []runtime.Handle
	for _, q := range found {
		if seen[q.id] {
			continue
		}
		st, err := pidStart(q.pid)
		if err != nil {
			continue
		}
		seen[q.id] = true
		hs = append(hs, runtime.Handle{ID: q.id, Tier: r.Name(), Pid: q.pid, PidStart: st, Socket: q.socket, Cgroup: r.cgroupPath(q.id)})
	}
	for _, id := range r.cg.list(r.cfg.CgroupParent) {
		if !seen[id] {
			hs = append(hs, runtime.Handle{ID: id, Tier: r.Name(), Cgroup: r.cgroupPath(id)})
		}
	}
	for i := range hs {
		if r.cfg.Net != nil && r.cfg.Net.Attached(hs[i].ID) {
			hs[i].Net = &runtime.NetHandle{}
		}
	}
	return hs, nil
}

// Freeze stops the VM's CPUs (QMP stop); Thaw continues them.
func (r *Runtime) Freeze(ctx context.Context, h runtime.Handle) error {
	return r.qmp(h, func(m *raw.Monitor) error { return m.Stop() })
}

// Thaw continues a frozen VM.
func (r *Runtime) Thaw(ctx context.Context, h runtime.Handle) error {
	return r.qmp(h, func(m *raw.Monitor) error { return m.Cont() })
}

// QMP runs fn on a QMP connection to h's QEMU (the vm tier's screen).
func (r *Runtime) QMP(h runtime.Handle, fn func(*raw.Monitor) error) error { return r.qmp(h, fn) }

// qmp runs fn on a QMP connection to h's QEMU.
func (r *Runtime) qmp(h runtime.Handle, fn func(*raw.Monitor) error) error {
	return r.qmpSocket(h, func(_ *qmp.SocketMonitor, m *raw.Monitor) error { return fn(m) })
}

// qmpSocket is qmp with the socket too (to pass a descriptor).
func (r *Runtime) qmpSocket(h runtime.Handle, fn func(*qmp.SocketMonitor, *raw.Monitor) error) error {
	if r.pidOf(h) == 0 {
		return runtime.ErrGone
	}
	mon, err := qmp.NewSocketMonitor("unix", filepath.Join(filepath.Dir(h.Socket), QMPName), 5*time.Second)
	if err != nil {
		return fmt.Errorf("microvm: qmp: %w", err)
	}
	if err := mon.Connect(); err != nil {
		return fmt.Errorf("microvm: qmp: %w", err)
	}
	defer mon.Disconnect()
	if err := fn(mon, raw.NewMonitor(mon)); err != nil {
		return fmt.Errorf("microvm: qmp: %w", err)
	}
	return nil
}

// qemuProc is a QEMU of this tier found in /proc.
type qemuProc struct {
	pid    int
	id     string
	socket string
}

// qemuName is the -name of sandbox id's QEMU.
func (r *Runtime) qemuName(id string) string { return namePrefix + r.cfg.CgroupParent + "/" + id }

// findQEMUs scans /proc for QEMUs whose -name marks them as this
// runtime's.
func (r *Runtime) findQEMUs() ([]qemuProc, error) {
	prefix := r.qemuName("")
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []qemuProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(b, []byte(namePrefix)) {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		q := qemuProc{pid: pid}
		for i := 0; i+1 < len(args); i++ {
			switch args[i] {
			case "-name":
				if id, ok := strings.CutPrefix(args[i+1], prefix); ok {
					q.id = id
				}
			case "-chardev":
				for _, kv := range strings.Split(args[i+1], ",") {
					if p, ok := strings.CutPrefix(kv, "path="); ok && strings.HasSuffix(p, "/"+SocketName) {
						q.socket = p
					}
				}
			}
		}
		if q.id != "" && !isZombie(pid) {
			out = append(out, q)
		}
	}
	return out, nil
}

// ProbeKVM reports whether KVM can run guests here: /dev/kvm opens and the
// CPU has hardware virtualisation (on some hosts /dev/kvm exists without
// it, and a guest never runs).
func ProbeKVM() bool {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "flags") {
			for _, f := range strings.Fields(line) {
				if f == "vmx" || f == "svm" {
					return true
				}
			}
			return false
		}
	}
	return false
}
