package microvm

// Shared guest RAM (a fork's children, a memory template's VMs) is a
// sealed memfd that each QEMU maps privately. Sealed, because nothing may
// change it while VMs map it: a change would show in every VM's pages that
// it has not written yet, other tenants' VMs included for a template. Two
// things would change a plain file: QEMU 7.2 discards guest RAM that the
// balloon reports free with a hole punched in the RAM block's file, also
// when the mapping is private (one VM's free page is another's kernel
// data), and a QEMU escape holds the file open for writing. With
// F_SEAL_WRITE the kernel refuses both (EPERM) and still allows private
// writable mappings; the VMs that map one also run without free page
// reporting (the agent's template boot and OpIdentity), so QEMU does not
// try.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// ramFDPath stands for the shared RAM's descriptor in a QEMU command line
// (withRAMFile); spawn replaces it with /proc/self/fd/N of the descriptor
// it passes.
const ramFDPath = "/proc/self/fd/warren-ram"

// Names of the memfds (they show in /proc/<qemu>/maps as "/memfd:NAME").
const (
	templateRAMName = "warren-template-ram"
	forkRAMName     = "warren-fork-ram"
)

// sealedCopy copies the file at p into a new memfd called name (its holes
// stay holes) and seals it against every change.
func sealedCopy(p, name string) (_ *os.File, err error) {
	src, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return nil, err
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	mf := os.NewFile(uintptr(fd), "memfd:"+name)
	defer func() {
		if err != nil {
			mf.Close()
		}
	}()
	size := st.Size()
	if err := mf.Truncate(size); err != nil {
		return nil, err
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // the rest is a hole
		}
		if err != nil {
			return nil, fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("seek hole: %w", err)
		}
		if _, err := io.Copy(io.NewOffsetWriter(mf, data), io.NewSectionReader(src, data, hole-data)); err != nil {
			return nil, err
		}
		off = hole
	}
	const seals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(mf.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		return nil, fmt.Errorf("seal: %w", err)
	}
	return mf, nil
}

// withRAMDescriptor replaces ramFDPath in args by the path of descriptor
// fd (in the new process).
func withRAMDescriptor(args []string, fd int) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = strings.ReplaceAll(a, "mem-path="+ramFDPath+",", fmt.Sprintf("mem-path=/proc/self/fd/%d,", fd))
	}
	return out
}
