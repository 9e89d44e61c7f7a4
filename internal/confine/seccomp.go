package confine

import (
	"encoding/binary"
	"fmt"
	"unsafe"

	"github.com/elastic/go-seccomp-bpf/arch"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The filter is assembled here rather than with go-seccomp-bpf's Policy:
// that assembler leaves an argument in the accumulator when a conditional
// rule does not match and then compares it with the next syscall numbers,
// so a crafted argument could select another syscall's rule. Each
// conditional syscall here gets its own block that always returns.
// go-seccomp-bpf still provides the syscall tables and audit arch ids.

const (
	retAllow  = unix.SECCOMP_RET_ALLOW
	retEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)

	offNr   = 0
	offArch = 4
	offArgs = 16
	x32Bit  = 0x40000000
)

// argLo and argHi are the offsets of the low and high halves of argument i
// in struct seccomp_data.
func argLo(i uint32) uint32 {
	if nativeBigEndian {
		return offArgs + 8*i + 4
	}
	return offArgs + 8*i
}

func argHi(i uint32) uint32 {
	if nativeBigEndian {
		return offArgs + 8*i
	}
	return offArgs + 8*i + 4
}

var nativeBigEndian = binary.NativeEndian.Uint16([]byte{0, 1}) == 1

// block is the code for one conditional syscall: it always ends in a return.
type block struct {
	name string
	code []bpf.Instruction
}

func conditionalBlocks() []block {
	return []block{
		{"ioctl", ioctlBlock()},
		{"clone", flagsBlock(0, namespaceFlags)},
		{"unshare", flagsBlock(0, unshareNamespaceFlags)},
		{"socket", valuesBlock(0, allowedSocketFamilies)},
		{"personality", valuesBlock(0, allowedPersonalities)},
		{"rt_sigqueueinfo", deniedValuesBlock(1, syncSignals)},
		{"rt_tgsigqueueinfo", deniedValuesBlock(2, syncSignals)},
		{"pidfd_send_signal", deniedValuesBlock(1, syncSignals)},
		{"fcntl", fcntlBlock()},
	}
}

// syncSignals are the signals that the Go runtime (the agent, PID 1) takes
// for a fault of its own, and crashes on, unless their si_code says kill
// or tgkill. A process of the sandbox may send them only by kill and
// tgkill: never with a siginfo of its choice (rt_sigqueueinfo,
// rt_tgsigqueueinfo, pidfd_send_signal), nor as the signal of an fd's
// owner (F_SETSIG), whose si_code is positive like a fault's.
var syncSignals = []uint32{
	uint32(unix.SIGILL), uint32(unix.SIGTRAP), uint32(unix.SIGBUS), uint32(unix.SIGFPE),
	uint32(unix.SIGSEGV), uint32(unix.SIGSTKFLT), uint32(unix.SIGSYS),
}

// deniedValuesBlock refuses the syscall when the low half of argument arg
// (an int in the kernel) is one of values.
func deniedValuesBlock(arg uint32, values []uint32) []bpf.Instruction {
	code := []bpf.Instruction{bpf.LoadAbsolute{Off: argLo(arg), Size: 4}}
	for i, v := range values {
		code = append(code, bpf.JumpIf{Cond: bpf.JumpEqual, Val: v, SkipTrue: uint8(len(values) - i)})
	}
	return append(code, bpf.RetConstant{Val: retAllow}, bpf.RetConstant{Val: retEPERM})
}

// fcntlBlock refuses F_SETSIG to one of syncSignals (the command is an
// int: its low half).
func fcntlBlock() []bpf.Instruction {
	return append([]bpf.Instruction{
		bpf.LoadAbsolute{Off: argLo(1), Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.F_SETSIG, SkipTrue: 1},
		bpf.RetConstant{Val: retAllow},
	}, deniedValuesBlock(2, syncSignals)...)
}

// ioctlBlock refuses deniedIoctls. The kernel reads the request as a 32-bit
// value, so the low half is compared; the high half must be zero or all
// ones (a sign-extended int, as musl passes it), anything else is refused.
func ioctlBlock() []bpf.Instruction {
	n := len(deniedIoctls)
	// layout: ldHi, jeq0, jeqFF, ldLo, n×jeq, retAllow, retEPERM
	code := []bpf.Instruction{
		bpf.LoadAbsolute{Off: argHi(1), Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0, SkipTrue: 1},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: 0xffffffff, SkipFalse: uint8(n + 2)},
		bpf.LoadAbsolute{Off: argLo(1), Size: 4},
	}
	for i, req := range deniedIoctls {
		code = append(code, bpf.JumpIf{Cond: bpf.JumpEqual, Val: req, SkipTrue: uint8(n - i)})
	}
	return append(code, bpf.RetConstant{Val: retAllow}, bpf.RetConstant{Val: retEPERM})
}

// flagsBlock refuses the syscall when any of flags is set in the low half
// of argument arg (the only half clone and unshare look at).
func flagsBlock(arg, flags uint32) []bpf.Instruction {
	return []bpf.Instruction{
		bpf.LoadAbsolute{Off: argLo(arg), Size: 4},
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: flags, SkipFalse: 1},
		bpf.RetConstant{Val: retEPERM},
		bpf.RetConstant{Val: retAllow},
	}
}

// valuesBlock allows the syscall only when the low half of argument arg
// (an int in the kernel) is one of values.
func valuesBlock(arg uint32, values []uint32) []bpf.Instruction {
	code := []bpf.Instruction{bpf.LoadAbsolute{Off: argLo(arg), Size: 4}}
	for i, v := range values {
		code = append(code, bpf.JumpIf{Cond: bpf.JumpEqual, Val: v, SkipTrue: uint8(len(values) - i)})
	}
	return append(code, bpf.RetConstant{Val: retEPERM}, bpf.RetConstant{Val: retAllow})
}

// buildFilter assembles the profile for the native architecture.
func buildFilter() ([]bpf.Instruction, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("confine: seccomp arch: %w", err)
	}
	nr := func(name string) (uint32, bool) {
		n, ok := info.SyscallNames[name]
		return uint32(n), ok
	}
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: 1},
		bpf.RetConstant{Val: retEPERM}, // foreign architecture
		bpf.LoadAbsolute{Off: offNr, Size: 4},
	}
	if info.ID == arch.X86_64.ID {
		prog = append(prog,
			bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: x32Bit, SkipFalse: 1},
			bpf.RetConstant{Val: retEPERM}, // x32 ABI
		)
	}
	// Dispatch to the conditional blocks, which follow the final return.
	blocks := conditionalBlocks()
	type fixup struct{ at, block int }
	var fixups []fixup
	for i, b := range blocks {
		n, ok := nr(b.name)
		if !ok {
			return nil, fmt.Errorf("confine: seccomp: no syscall %q on %s", b.name, info.Name)
		}
		prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: n, SkipFalse: 1})
		fixups = append(fixups, fixup{len(prog), i})
		prog = append(prog, bpf.Jump{})
	}
	for _, name := range enosysSyscalls {
		if n, ok := nr(name); ok {
			prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: n, SkipFalse: 1}, bpf.RetConstant{Val: retENOSYS})
		}
	}
	for _, group := range allowedSyscalls {
		for _, name := range group {
			if n, ok := nr(name); ok { // names of other architectures are skipped
				prog = append(prog, bpf.JumpIf{Cond: bpf.JumpEqual, Val: n, SkipFalse: 1}, bpf.RetConstant{Val: retAllow})
			}
		}
	}
	prog = append(prog, bpf.RetConstant{Val: retEPERM})
	starts := make([]int, len(blocks))
	for i, b := range blocks {
		starts[i] = len(prog)
		prog = append(prog, b.code...)
	}
	for _, f := range fixups {
		prog[f.at] = bpf.Jump{Skip: uint32(starts[f.block] - f.at - 1)}
	}
	if len(prog) > 4096 {
		return nil, fmt.Errorf("confine: seccomp filter has %d instructions (max 4096)", len(prog))
	}
	return prog, nil
}

// installSeccomp loads the filter on every thread of the process (TSYNC).
// no_new_privs must already be set.
func installSeccomp() error {
	prog, err := buildFilter()
	if err != nil {
		return err
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return fmt.Errorf("confine: assemble seccomp filter: %w", err)
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		filter[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	r, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	if e != 0 {
		return fmt.Errorf("confine: load seccomp filter: %w", e)
	}
	if r != 0 {
		return fmt.Errorf("confine: load seccomp filter: thread %d cannot be synchronised", r)
	}
	return nil
}
