// Package vm implements the "vm" tier: a full QEMU virtual machine (the
// q35 machine, PCI, a BIOS; KVM when usable, else TCG) that boots the same
// guest kernel and initramfs as the microvm tier, so that the agent (PID
// 1), the layers (read-only virtio-blk disks stacked by overlayfs over a
// per-VM ext4 disk), the agent port (virtio-serial) and therefore the whole
// sandbox API are identical. It is the microvm runtime
// (internal/runtime/microvm) configured with microvm.MachineQ35: this
// package adds the name, its own cgroup parent and QEMU -name (so that the
// two tiers never see each other's VMs) and the screen.
//
// # Screen (issue 17, item 9)
//
// A sandbox created with display: true gets a standard VGA card (-vga
// std, the kernel console on it as well as on the serial port), a USB
// tablet for absolute pointer positions and a VNC server on the Unix
// socket StateDir/vnc.sock. Screenshot is QMP screendump (QEMU 7.2 writes
// PPM only; it is converted to PNG here), SendInput QMP send-key and
// input-send-event, DialDisplay a connection to the VNC socket (RFB; the
// API server carries it as WebSocket binary frames, which noVNC speaks).
//
// # Disk images (issue 17, item 8)
//
// A spec with Disk set (an image imported with `warren image import
// --disk`, internal/image/disk.go) boots that disk instead: a per-sandbox
// qcow2 overlay over the stored, read-only image, no -kernel/-initrd, so
// SeaBIOS runs the image's own bootloader, kernel and init (systemd in the
// Debian 12 test disk scripts/vm-disk.sh builds), whose warren-agent service
// (`warren-agent --vm-service warren.agent`) answers on the same port.
// The mechanics live beside the layered boot, in
// internal/runtime/microvm/diskboot.go; e2e:TestVMDiskImage boots the test disk.
package vm
