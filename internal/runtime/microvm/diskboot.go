package microvm

// Booting a disk image (the vm tier's `tier: "vm"` sandboxes of an image
// imported with `warren image import --disk`): instead of the tier's kernel,
// initramfs and layers, QEMU's firmware boots the image's own bootloader,
// kernel and init from a per-sandbox qcow2 overlay whose read-only backing
// file is the image store's disk (no copy). The disk is the first virtio-blk
// device, serial "rw"; the agent port, QMP, balloon and serial console are
// the same as for a layered VM, and the image's warren-agent service
// (agent.VMServiceMain) answers on the port once its init started it.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/warrenhq/warren/internal/runtime"
)

// OverlayName is a disk-image VM's writable overlay (beside the overlay
// work directory, like DiskName).
const OverlayName = "vm-disk.qcow2"

// checkDiskSpec refuses what a disk-image VM cannot have.
func (r *Runtime) checkDiskSpec(spec *runtime.Spec) error {
	switch {
	case r.cfg.Machine != MachineQ35:
		return errors.New("microvm: a disk image boots on the vm tier only")
	case len(spec.Lowers) > 0 || len(spec.Binds) > 0:
		return errors.New("microvm: a disk image VM has no layers")
	case len(spec.Stateless) > 0:
		return errors.New("microvm: stateless sandboxes are not supported by this tier")
	case spec.Network != nil && r.cfg.Net == nil:
		return errors.New("microvm: this node gives VMs no network")
	case !filepath.IsAbs(spec.Disk) || strings.Contains(spec.Disk, ","):
		return fmt.Errorf("microvm: disk image path %q: absolute and without commas", spec.Disk)
	}
	if _, err := os.Stat(spec.Disk); err != nil {
		return fmt.Errorf("microvm: disk image: %w", err)
	}
	return nil
}

// makeOverlay makes the sandbox's qcow2 overlay over spec.Disk (its
// backing file, read-only, given with its format so that nothing is
// probed) and links it from the state directory as DiskLink.
func makeOverlay(spec *runtime.Spec) (string, error) {
	dir := spec.Work
	if dir == "" {
		dir = spec.StateDir
	}
	p := filepath.Join(dir, OverlayName)
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("microvm: overlay: %w", err)
	}
	link := filepath.Join(spec.StateDir, DiskLink)
	os.Remove(link)
	if err := os.Symlink(p, link); err != nil {
		return "", fmt.Errorf("microvm: disk link: %w", err)
	}
	out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", spec.Disk, p).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("microvm: qemu-img create overlay: %v: %s", err, bytes.TrimSpace(out))
	}
	return p, nil
}

// bootFromDisk turns a layered VM's QEMU arguments into a disk-image
// VM's: no -kernel, -initrd or -append (the firmware boots the disk), and
// the writable drive is the qcow2 overlay, first in the boot order, over
// the stored disk (backing) named on the command line: spawn passes both
// as descriptors (the unprivileged, chrooted QEMU could not open the path
// the overlay's header names).
func bootFromDisk(args []string, backing string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case (a == "-kernel" || a == "-initrd" || a == "-append") && i+1 < len(args):
			i++
			continue
		case strings.HasPrefix(a, "id=rw,") && i > 0 && args[i-1] == "-drive":
			a = strings.Replace(a, ",format=raw,", ",format=qcow2,backing.file.filename="+backing+",", 1)
		case strings.Contains(a, ",drive=rw,") && i > 0 && args[i-1] == "-device":
			a += ",bootindex=0"
		}
		out = append(out, a)
	}
	return out
}
