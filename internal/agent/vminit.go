package agent

// The agent as PID 1 of a microVM (internal/runtime/microvm): the kernel
// runs it as /init from the initramfs. It loads the modules the tier's
// kernel keeps modular, assembles the root from the VM's disks (EROFS
// layers read-only, an overlay over them whose upper directory is on the
// sandbox's writable ext4 disk), switches into it and serves the agent
// protocol on a virtio-serial port that the host backs with a Unix socket.
// The port is opened exclusively (virtio_console refuses a second open with
// EBUSY) and its device node is removed, so no process of the guest can
// read or forge the agent's messages.

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
)

// VM kernel command-line parameters the host sets (internal/runtime/microvm).
const (
	// VMParamLayers is how many read-only layer disks the VM has, top-most
	// first: their virtio-blk serials are "layer0", "layer1", …
	VMParamLayers = "warren.layers"
	// VMParamPort is the name of the agent's virtio-serial port.
	VMParamPort = "warren.port"
	// VMParamHostname is the guest's hostname.
	VMParamHostname = "warren.hostname"
	// VMParamTemplate=1 boots a memory template (the runtime's
	// template.go): the agent opens its port without the disk driver and
	// without a root, and the VMs restored from the template's memory
	// attach their own disks at setup (SetupConfig.VMLayers).
	VMParamTemplate = "warren.template"
	// VMDiskModule and VMNetModule are the drivers a template loads only
	// at setup: until then the guest knows none of the template's disks
	// or interfaces, so each restored VM's kernel probes its own (and its
	// interface negotiates with its own tap).
	VMDiskModule = "virtio_blk.ko"
	VMNetModule  = "virtio_net.ko"
	// VMBalloonModule is never loaded by a template or its VMs: their
	// RAM is shared, and the host must discard none of it (free page
	// reporting would; internal/runtime/microvm/ramfile.go).
	VMBalloonModule = "virtio_balloon.ko"
	// VMDiskRW is the serial of the writable disk (ext4, made by the host).
	VMDiskRW = "rw"
	// VMBindPrefix starts the serials of the disks of layers attached at
	// paths (bind0, bind1, …); setup's Binds name them as their Source.
	VMBindPrefix = "bind"
	// VMModulesDir holds the modules of the initramfs, loaded in the order
	// of VMModulesDir/modules.order.
	VMModulesDir = "/modules"
)

// IsVMInit reports whether this process is the init of a microVM: PID 1,
// started by the kernel as /init.
func IsVMInit() bool {
	return os.Getpid() == 1 && len(os.Args) > 0 && os.Args[0] == "/init"
}

// VMMain boots the guest and serves the agent protocol on its port. It
// never returns: if anything fails, PID 1 exits and the kernel panics,
// which (panic=-1, -no-reboot) ends QEMU.
func VMMain() {
	goruntime.GOMAXPROCS(min(2, goruntime.NumCPU()))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	slog.SetDefault(log)
	port, err := vmBoot(log)
	if err != nil {
		log.Error("agent: vm boot failed", "err", err)
		_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
		os.Exit(1)
	}
	a := New(log)
	a.vm = true
	if err := a.Serve(port); err != nil {
		log.Error("agent: serve", "err", err)
	}
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	os.Exit(1)
}

// vmBoot prepares the guest: pseudo file systems, modules, root, port.
func vmBoot(log *slog.Logger) (*portListener, error) {
	t0 := time.Now()
	for _, m := range []struct{ src, dir, fs string }{
		{"devtmpfs", "/dev", "devtmpfs"}, {"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"},
	} {
		_ = os.MkdirAll(m.dir, 0o755)
		if err := unix.Mount(m.src, m.dir, m.fs, unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("mount %s: %w", m.dir, err)
		}
	}
	params, err := kernelParams()
	if err != nil {
		return nil, err
	}
	name := params[VMParamPort]
	if name == "" {
		return nil, fmt.Errorf("kernel parameter %s missing", VMParamPort)
	}
	template := params[VMParamTemplate] == "1"
	var skip []string
	if template {
		skip = []string{VMDiskModule, VMNetModule, VMBalloonModule}
	}
	if err := loadModules(VMModulesDir, skip); err != nil {
		return nil, err
	}
	finePageReporting(log)
	if template {
		if b, err := os.ReadFile(filepath.Join(VMModulesDir, VMBalloonModule)); err == nil {
			vmTemplate.balloon = b
		}
		port, err := openPort(name)
		if err != nil {
			return nil, err
		}
		vmTemplate.pending = true
		log.Info("agent: vm template booted", "took", time.Since(t0))
		return port, nil
	}
	nLayers, err := strconv.Atoi(params[VMParamLayers])
	if err != nil || nLayers < 1 {
		return nil, fmt.Errorf("kernel parameter %s=%q: want a count ≥ 1", VMParamLayers, params[VMParamLayers])
	}
	if err := vmRoot(nLayers); err != nil {
		return nil, err
	}
	if h := params[VMParamHostname]; h != "" {
		_ = unix.Sethostname([]byte(h))
	}

	port, err := openPort(name)
	if err != nil {
		return nil, err
	}
	log.Info("agent: vm booted", "layers", nLayers, "took", time.Since(t0))
	return port, nil
}

// vmBinds mounts each bind's layer disk (its Source is the disk's serial)
// read-only at its Target in the guest's root.
func vmBinds(binds []agentproto.Bind) error {
	if len(binds) == 0 {
		return nil
	}
	serials := make([]string, len(binds))
	for i, b := range binds {
		if !strings.HasPrefix(b.Source, VMBindPrefix) || !filepath.IsAbs(b.Target) || filepath.Clean(b.Target) != b.Target || b.Target == "/" {
			return fmt.Errorf("bind %s at %q: want a %s disk at an absolute clean path", b.Source, b.Target, VMBindPrefix)
		}
		serials[i] = b.Source
	}
	devs, err := disksBySerial(serials)
	if err != nil {
		return err
	}
	for _, b := range binds {
		if err := os.MkdirAll(b.Target, 0o755); err != nil {
			return fmt.Errorf("bind %s: %w", b.Target, err)
		}
		if err := unix.Mount(devs[b.Source], b.Target, "erofs", unix.MS_RDONLY|unix.MS_NODEV|unix.MS_NOSUID, ""); err != nil {
			return fmt.Errorf("mount the layer at %s: %w", b.Target, err)
		}
	}
	return nil
}

// vmTemplate is the state of a VM booted as a memory template.
var vmTemplate struct {
	// pending: the root is not assembled yet (vmAttach does it at setup).
	// Set before the agent serves and cleared by setup, which runs in line
	// (conn.go): no lock.
	pending bool
	// restored: this VM was restored from a template (set with pending
	// cleared): its interface has the template's MAC until setup gives it
	// its own (vmNetwork).
	restored bool
	// balloon is the balloon's module (VMBalloonModule), kept before the
	// initramfs's files go: a VM of the template loads it once its RAM is
	// its own (reportFreePages).
	balloon []byte
}

// vmAttach assembles a VM's root after its restore from a memory
// template: the disk driver is loaded now, so that the guest's kernel
// finds this VM's disks, and the root is stacked from nLayers layers as
// a VM booted on its own does.
func vmAttach(nLayers int) error {
	if !vmTemplate.pending {
		return errors.New("this VM assembled its root at boot")
	}
	if nLayers < 1 {
		return fmt.Errorf("a VM restored from a template needs its layer count (got %d)", nLayers)
	}
	for _, m := range []string{VMDiskModule, VMNetModule} {
		if err := loadModule(filepath.Join(VMModulesDir, m)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := vmRoot(nLayers); err != nil {
		return err
	}
	vmTemplate.pending, vmTemplate.restored = false, true
	return nil
}

// loadModule loads the kernel module in the file p.
func loadModule(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("module %s: %w", filepath.Base(p), err)
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w", filepath.Base(p), err)
	}
	return nil
}

// loadModules loads dir's modules in the order of dir/modules.order, but
// those named in skip.
func loadModules(dir string, skip []string) error {
	order, err := os.ReadFile(filepath.Join(dir, "modules.order"))
	if errors.Is(err, os.ErrNotExist) {
		return nil // a kernel with everything built in
	}
	if err != nil {
		return err
	}
	for _, name := range strings.Fields(string(order)) {
		if slices.Contains(skip, name) {
			continue
		}
		if err := loadModule(filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	return nil
}

// pageReportingOrder is where the guest kernel keeps the smallest free
// block it reports to the host through the balloon (free page reporting).
const pageReportingOrder = "/sys/module/page_reporting/parameters/page_reporting_order"

// finePageReporting makes free page reporting hand back free blocks of any
// size, not only 2 MiB ones (the kernel's default, pageblock_order: an
// idle guest's free memory is fragmented, and ~12 MiB of it stayed on the
// host). Linux 6.1's balloon driver overrides the kernel parameter when it
// registers, so this writes the parameter after the modules are loaded.
// A kernel without free page reporting has no such file: nothing to do.
func finePageReporting(log *slog.Logger) {
	if err := os.WriteFile(pageReportingOrder, []byte("0"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Warn("agent: page reporting order", "err", err)
	}
}

// kernelParams are the key=value words of /proc/cmdline.
func kernelParams() (map[string]string, error) {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, w := range strings.Fields(string(b)) {
		if k, v, ok := strings.Cut(w, "="); ok {
			m[k] = v
		}
	}
	return m, nil
}

// diskBySerial waits (bounded) until the virtio-blk disks with the given
// serials exist and returns their /dev paths.
func disksBySerial(serials []string) (map[string]string, error) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		found := map[string]string{}
		ents, _ := os.ReadDir("/sys/block")
		for _, e := range ents {
			s, err := os.ReadFile(filepath.Join("/sys/block", e.Name(), "serial"))
			if err != nil {
				continue
			}
			dev := "/dev/" + e.Name()
			if _, err := os.Stat(dev); err == nil {
				found[strings.TrimSpace(string(s))] = dev
			}
		}
		missing := ""
		for _, s := range serials {
			if found[s] == "" {
				missing = s
				break
			}
		}
		if missing == "" {
			return found, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("disk with serial %q did not appear", missing)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// vmRoot mounts the layers and the writable disk, stacks them in an
// overlay at /newroot and makes that the root (the initramfs's files are
// removed first: switch_root's job).
func vmRoot(nLayers int) error {
	serials := []string{VMDiskRW}
	for i := range nLayers {
		serials = append(serials, "layer"+strconv.Itoa(i))
	}
	devs, err := disksBySerial(serials)
	if err != nil {
		return err
	}
	lowers, err := mountLayers(devs, nLayers)
	if err != nil {
		return err
	}
	if err := os.MkdirAll("/.warren/rw", 0o755); err != nil {
		return err
	}
	if err := unix.Mount(devs[VMDiskRW], "/.warren/rw", "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount the writable disk: %w", err)
	}
	for _, d := range []string{"/.warren/rw/upper", "/.warren/rw/work", "/newroot"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	// Kept for disk snapshots (vmupper.go): no path reaches it once the
	// root is switched.
	upper, err := unix.Open("/.warren/rw/upper", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the upper directory: %w", err)
	}
	vmUpper.fd = upper
	opts := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=/.warren/rw/upper,workdir=/.warren/rw/work"
	if err := unix.Mount("overlay", "/newroot", "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount the root overlay: %w", err)
	}
	for _, d := range []string{"dev", "proc", "sys", "tmp"} {
		_ = os.MkdirAll(filepath.Join("/newroot", d), 0o755)
	}
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		if err := unix.Mount(d, "/newroot"+d, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", d, err)
		}
	}
	// The initramfs's own files: nothing needs them any more.
	_ = os.RemoveAll(VMModulesDir)
	_ = os.Remove("/init")
	if err := os.Chdir("/newroot"); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := os.Chdir("/"); err != nil {
		return err
	}
	for _, m := range []struct {
		dir, fs, opts string
		flags         uintptr
	}{
		// devpts without nodev: its nodes are the terminals (nodev made
		// opening /dev/pts/N EACCES, and no terminal could start).
		{"/dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=620", unix.MS_NOSUID | unix.MS_NOEXEC},
		{"/dev/shm", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV},
		{"/tmp", "tmpfs", "mode=1777", unix.MS_NOSUID | unix.MS_NODEV},
	} {
		_ = os.MkdirAll(m.dir, 0o755)
		if err := unix.Mount(m.fs, m.dir, m.fs, m.flags, m.opts); err != nil {
			return fmt.Errorf("mount %s: %w", m.dir, err)
		}
	}
	return nil
}

// mountLayers mounts the nLayers read-only layer disks (devs by serial:
// layer0, layer1, ...) at /.warren/layerN, in order, and returns their
// directories.
func mountLayers(devs map[string]string, nLayers int) ([]string, error) {
	lowers := make([]string, nLayers)
	for i := range nLayers {
		dir := "/.warren/layer" + strconv.Itoa(i)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		if err := unix.Mount(devs["layer"+strconv.Itoa(i)], dir, "erofs", unix.MS_RDONLY|unix.MS_NODEV, ""); err != nil {
			return nil, fmt.Errorf("mount layer %d: %w", i, err)
		}
		lowers[i] = dir
	}
	return lowers, nil
}

// openPort opens the virtio-serial port called name exclusively and
// removes its device node.
func openPort(name string) (*portListener, error) {
	deadline := time.Now().Add(20 * time.Second)
	for {
		dev, err := findPort(name)
		if err == nil {
			fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
			if err != nil {
				return nil, fmt.Errorf("open port %s: %w", dev, err)
			}
			if err := os.Remove(dev); err != nil {
				unix.Close(fd)
				return nil, fmt.Errorf("remove port node %s: %w", dev, err)
			}
			return &portListener{fd: fd}, nil
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// findPort is the device node of the virtio-serial port called name.
func findPort(name string) (string, error) {
	ents, _ := os.ReadDir("/sys/class/virtio-ports")
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join("/sys/class/virtio-ports", n, "name"))
		if err == nil && strings.TrimSpace(string(b)) == name {
			dev := "/dev/" + n
			if _, err := os.Stat(dev); err != nil {
				return "", err
			}
			return dev, nil
		}
	}
	return "", fmt.Errorf("no virtio-serial port named %q", name)
}

// portListener makes a virtio-serial port look like a listener: each time
// the host connects to the socket behind the port, Accept returns a
// connection, which ends (EOF) when the host disconnects. The port is read
// and written with blocking calls: a read waits while the host is connected
// and returns 0 once it is not.
type portListener struct {
	fd int

	mu  sync.Mutex
	cur *portConn
}

// Accept waits until the previous connection ended and the host sent
// something on a new one.
func (l *portListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	prev := l.cur
	l.mu.Unlock()
	if prev != nil {
		<-prev.done
	}
	for {
		fds := []unix.PollFd{{Fd: int32(l.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, 1000)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return nil, fmt.Errorf("poll port: %w", err)
		}
		if n > 0 && fds[0].Revents&unix.POLLIN != 0 {
			break
		}
		// POLLHUP: no host connected; poll returns at once then.
		time.Sleep(20 * time.Millisecond)
	}
	c := &portConn{fd: l.fd, done: make(chan struct{})}
	l.mu.Lock()
	l.cur = c
	l.mu.Unlock()
	return c, nil
}

func (l *portListener) Close() error   { return unix.Close(l.fd) }
func (l *portListener) Addr() net.Addr { return portAddr{} }

type portAddr struct{}

func (portAddr) Network() string { return "virtio-serial" }
func (portAddr) String() string  { return "port" }

// portConn is one connection of the host over the port.
type portConn struct {
	fd   int
	once sync.Once
	done chan struct{}
}

func (c *portConn) end() { c.once.Do(func() { close(c.done) }) }

func (c *portConn) ended() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

func (c *portConn) Read(p []byte) (int, error) {
	if c.ended() {
		return 0, net.ErrClosed
	}
	for {
		n, err := unix.Read(c.fd, p)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil {
			c.end()
			return 0, err
		}
		if n == 0 {
			c.end()
			return 0, io.EOF
		}
		return n, nil
	}
}

func (c *portConn) Write(p []byte) (int, error) {
	done := 0
	for done < len(p) {
		if c.ended() {
			return done, net.ErrClosed
		}
		n, err := unix.Write(c.fd, p[done:])
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil {
			c.end()
			return done, err
		}
		done += n
	}
	return done, nil
}

func (c *portConn) Close() error                       { c.end(); return nil }
func (c *portConn) LocalAddr() net.Addr                { return portAddr{} }
func (c *portConn) RemoteAddr() net.Addr               { return portAddr{} }
func (c *portConn) SetDeadline(t time.Time) error      { return nil }
func (c *portConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *portConn) SetWriteDeadline(t time.Time) error { return nil }
