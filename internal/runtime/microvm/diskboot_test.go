package microvm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenhq/warren/internal/runtime"
)

// TestBootFromDiskArgs: a disk-image VM's QEMU has no -kernel, -initrd
// or -append, and its writable drive is the qcow2 overlay, booted first;
// the rest of the command line is the layered VM's.
func TestBootFromDiskArgs(t *testing.T) {
	in := []string{"-name", "n", "-kernel", "/k/vmlinux", "-initrd", "/c/initrd", "-append", "console=ttyS0",
		"-drive", "id=rw,file=/w/vm-disk.qcow2,format=raw,if=none,cache=unsafe,discard=unmap",
		"-device", "virtio-blk-pci,drive=rw,serial=rw", "-device", "virtio-serial-pci"}
	got := strings.Join(bootFromDisk(in, "/s/disk.qcow2"), " ")
	want := "-name n -drive id=rw,file=/w/vm-disk.qcow2,format=qcow2,backing.file.filename=/s/disk.qcow2,if=none,cache=unsafe,discard=unmap " +
		"-device virtio-blk-pci,drive=rw,serial=rw,bootindex=0 -device virtio-serial-pci"
	if got != want {
		t.Errorf("bootFromDisk:\n got %s\nwant %s", got, want)
	}
}

// TestCheckDiskSpec: a disk image boots on q35 only, without layers or
// stateless directories, with a network only where the node gives VMs
// networks, from an absolute path without commas.
func TestCheckDiskSpec(t *testing.T) {
	disk := filepath.Join(t.TempDir(), "d.qcow2")
	if err := os.WriteFile(disk, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	q35 := &Runtime{cfg: Config{Machine: MachineQ35}}
	if err := q35.checkDiskSpec(&runtime.Spec{Disk: disk}); err != nil {
		t.Fatalf("a plain disk spec: %v", err)
	}
	for name, c := range map[string]struct {
		r    *Runtime
		spec runtime.Spec
		want string
	}{
		"microvm":   {&Runtime{}, runtime.Spec{Disk: disk}, "vm tier only"},
		"layers":    {q35, runtime.Spec{Disk: disk, Lowers: []string{"/l"}}, "no layers"},
		"network":   {q35, runtime.Spec{Disk: disk, Network: &runtime.NetworkSpec{}}, "no network"},
		"stateless": {q35, runtime.Spec{Disk: disk, Stateless: []string{"/tmp"}}, "stateless"},
		"relative":  {q35, runtime.Spec{Disk: "d.qcow2"}, "absolute"},
		"comma":     {q35, runtime.Spec{Disk: "/a,b.qcow2"}, "commas"},
		"missing":   {q35, runtime.Spec{Disk: disk + ".gone"}, "no such file"},
	} {
		if err := c.r.checkDiskSpec(&c.spec); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
}
