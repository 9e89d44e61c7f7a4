package agent

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/agentproto"
)

// The random driver's ioctls (x86 and arm): RNDADDENTROPY is
// _IOW('R', 0x03, int[2]), RNDRESEEDCRNG _IO('R', 0x07).
const (
	rndAddEntropy = 0x40085203
	rndReseedCRNG = 0x5207
)

// maxEntropy bounds an identity's entropy (the pool is 256 bytes).
const maxEntropy = 4096

// identity gives a VM restored from another's memory an identity of its
// own (OpIdentity). Only the agent of a VM (PID 1 of its own kernel) does
// it: a container's agent shares the host's kernel pool and the hostname
// is its create's.
func (a *Agent) identity(r *agentproto.IdentityRequest) error {
	if r.Hostname == "" || len(r.Hostname) > 64 {
		return errf(agentproto.ErrInvalid, "identity: hostname must be 1-64 bytes")
	}
	if b, err := hex.DecodeString(r.MachineID); err != nil || len(b) != 16 {
		return errf(agentproto.ErrInvalid, "identity: machine id must be 32 hex digits")
	}
	if len(r.Entropy) < 32 || len(r.Entropy) > maxEntropy {
		return errf(agentproto.ErrInvalid, "identity: entropy must be 32-%d bytes", maxEntropy)
	}
	if os.Getpid() != 1 {
		return errf(agentproto.ErrInvalid, "identity: only the agent of a VM sets an identity")
	}
	if err := reseed(r.Entropy); err != nil {
		return errf(agentproto.ErrInternal, "identity: reseed: %v", err)
	}
	if r.UnixNano > 0 {
		if err := setClock(r.UnixNano); err != nil {
			return err
		}
	}
	if r.NoPageReporting {
		if err := unbindBalloon(); err != nil {
			return errf(agentproto.ErrInternal, "identity: %v", err)
		}
	}
	if err := unix.Sethostname([]byte(r.Hostname)); err != nil {
		return errf(agentproto.ErrInternal, "identity: sethostname: %v", err)
	}
	if r.KernelOnly {
		return nil
	}
	for name, content := range map[string]string{"hostname": r.Hostname, "machine-id": r.MachineID} {
		if err := replaceFile(filepath.Join("/etc", name), content+"\n"); err != nil {
			return errf(agentproto.ErrInternal, "identity: %v", err)
		}
	}
	return nil
}

// balloonDriver is the sysfs directory of the guest's balloon driver.
const balloonDriver = "/sys/bus/virtio/drivers/virtio_balloon"

// unbindBalloon unbinds the balloon's driver from its devices, which ends
// free page reporting (the device stays, driverless).
func unbindBalloon() error {
	ents, err := os.ReadDir(balloonDriver)
	if errors.Is(err, os.ErrNotExist) {
		return nil // not loaded
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "virtio") {
			continue // bind, unbind, module, uevent, …
		}
		if err := os.WriteFile(filepath.Join(balloonDriver, "unbind"), []byte(e.Name()), 0o200); err != nil {
			return fmt.Errorf("unbind the balloon %s: %w", e.Name(), err)
		}
	}
	return nil
}

// reportFreePages turns the guest's free page reporting (back) on, once
// its RAM is its own (a VM restored from its own memory snapshot): the
// balloon's driver, unbound by OpIdentity, is bound again, or, in a VM of
// a memory template, which never loaded it, loaded from the bytes the
// template kept.
func reportFreePages() error {
	if _, err := os.Stat(balloonDriver); errors.Is(err, os.ErrNotExist) {
		if vmTemplate.balloon == nil {
			return nil // a kernel with the balloon built in, or none
		}
		if err := unix.InitModule(vmTemplate.balloon, ""); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load %s: %w", VMBalloonModule, err)
		}
		finePageReporting(slog.Default())
		return nil
	}
	devs, err := os.ReadDir("/sys/bus/virtio/devices")
	if err != nil {
		return err
	}
	for _, d := range devs {
		id, err := os.ReadFile(filepath.Join("/sys/bus/virtio/devices", d.Name(), "device"))
		if err != nil || strings.TrimSpace(string(id)) != virtioIDBalloon {
			continue
		}
		if _, err := os.Stat(filepath.Join("/sys/bus/virtio/devices", d.Name(), "driver")); err == nil {
			continue // bound
		}
		if err := os.WriteFile(filepath.Join(balloonDriver, "bind"), []byte(d.Name()), 0o200); err != nil {
			return fmt.Errorf("bind the balloon %s: %w", d.Name(), err)
		}
	}
	return nil
}

// virtioIDBalloon is the balloon's virtio device id, as sysfs shows it.
const virtioIDBalloon = "0x0005"

// setClock sets the (VM's) clock to unixNano.
func setClock(unixNano int64) error {
	if unixNano <= 0 {
		return errf(agentproto.ErrInvalid, "clock: no time given")
	}
	tv := unix.NsecToTimeval(unixNano)
	if err := unix.Settimeofday(&tv); err != nil {
		return errf(agentproto.ErrInternal, "set the clock: %v", err)
	}
	return nil
}

// reseed mixes b into the kernel's pool and credits it (RNDADDENTROPY: the
// host's bytes are the only ones a sibling has not seen), so that the
// guest's random numbers part from its siblings' from now on.
func reseed(b []byte) error {
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(b)+3)
	binary.NativeEndian.PutUint32(info[0:], uint32(len(b)*8))
	binary.NativeEndian.PutUint32(info[4:], uint32(len(b)))
	copy(info[8:], b)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndAddEntropy, uintptr(unsafe.Pointer(&info[0]))); e != 0 {
		// Without the ioctl (no CAP_SYS_ADMIN), a write still mixes the
		// bytes in, uncredited.
		if _, err := f.Write(b); err != nil {
			return err
		}
	}
	// The generator itself reseeds from the pool now, not at its next
	// scheduled reseed (up to a minute later): until then every sibling
	// would draw the same numbers.
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), rndReseedCRNG, 0); e != 0 {
		return fmt.Errorf("RNDRESEEDCRNG: %w", e)
	}
	return nil
}

// replaceFile writes p whole (renamed into place), creating its directory.
func replaceFile(p, content string) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	tmp := p + ".warren-tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o444); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}
