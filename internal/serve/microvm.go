package serve

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/runtime/microvm"
	"github.com/warrenhq/warren/internal/runtime/vm"
	"github.com/warrenhq/warren/internal/sandboxnet"
)

// DefaultVMKernel is where `make vm-kernel` (scripts/vm-kernel.sh) puts the
// microvm tier's guest kernel, under the data directory.
const DefaultVMKernel = "cache/vm-kernel/current"

// VMKernelDir is the guest kernel directory o names ("" when off).
func VMKernelDir(dataDir, flag string) string {
	switch flag {
	case "off":
		return ""
	case "":
		return filepath.Join(dataDir, DefaultVMKernel)
	}
	return flag
}

// vmConfig is the configuration of the microvm and vm tiers when the node
// can run them: a guest kernel and QEMU. Otherwise it says why not. Their
// sandboxes' networks are net's (the container tier's).
func vmConfig(o EdgeOptions, images *image.LocalStore, net *sandboxnet.Manager) (microvm.Config, string) {
	dir := VMKernelDir(o.DataDir, o.VMKernel)
	if dir == "" {
		return microvm.Config{}, "--vm-kernel off"
	}
	if _, err := os.Stat(filepath.Join(dir, "vmlinux")); err != nil {
		return microvm.Config{}, fmt.Sprintf("no guest kernel in %s (make vm-kernel)", dir)
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return microvm.Config{}, "qemu-system-x86_64 is not installed"
	}
	k, err := microvm.OpenKernel(dir)
	if err != nil {
		return microvm.Config{}, err.Error()
	}
	return microvm.Config{
		Kernel: k, AgentPath: o.AgentPath, CacheDir: filepath.Join(o.DataDir, "cache", "microvm"),
		CgroupParent: CgroupParent(o.DataDir) + "-vm", Logger: o.Logger, Net: net, NoTemplates: o.NoVMTemplates,
		RestoredTCGBufferMB: o.VMTCGBufferMB,
		LayerFile: func(dir string) (string, error) {
			p := images.BlobPath(filepath.Base(dir))
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("layer image of %s: %w", dir, err)
			}
			return p, nil
		},
	}, ""
}

// openVMTiers makes the microvm and vm tiers when the node can run them.
// Otherwise it says why not.
func openVMTiers(o EdgeOptions, images *image.LocalStore, net *sandboxnet.Manager) (*microvm.Runtime, *vm.Runtime, string) {
	cfg, why := vmConfig(o, images, net)
	if why != "" {
		return nil, nil, why
	}
	micro, err := microvm.New(cfg)
	if err != nil {
		return nil, nil, err.Error()
	}
	// Its own cgroup parent, hence its own QEMU -name: neither tier
	// adopts or reaps the other's VMs.
	cfg.CgroupParent = CgroupParent(o.DataDir) + "-q35"
	full, err := vm.New(cfg)
	if err != nil {
		return nil, nil, err.Error()
	}
	return micro, full, ""
}
