package serve

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/runtime/microvm"
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

// openMicroVM makes the microvm tier when the node can run it: a guest
// kernel and QEMU. Otherwise it says why not.
func openMicroVM(o EdgeOptions, images *image.LocalStore) (*microvm.Runtime, string) {
	dir := VMKernelDir(o.DataDir, o.VMKernel)
	if dir == "" {
		return nil, "--vm-kernel off"
	}
	if _, err := os.Stat(filepath.Join(dir, "vmlinux")); err != nil {
		return nil, fmt.Sprintf("no guest kernel in %s (make vm-kernel)", dir)
	}
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return nil, "qemu-system-x86_64 is not installed"
	}
	k, err := microvm.OpenKernel(dir)
	if err != nil {
		return nil, err.Error()
	}
	rt, err := microvm.New(microvm.Config{
		Kernel: k, AgentPath: o.AgentPath, CacheDir: filepath.Join(o.DataDir, "cache", "microvm"),
		CgroupParent: CgroupParent(o.DataDir) + "-vm", Logger: o.Logger,
		LayerFile: func(dir string) (string, error) {
			p := images.BlobPath(filepath.Base(dir))
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("layer image of %s: %w", dir, err)
			}
			return p, nil
		},
	})
	if err != nil {
		return nil, err.Error()
	}
	return rt, ""
}
