package microvm

// How a QEMU process is started: every QEMU of both VM tiers (a boot, a
// restore from a memory snapshot, a fork's template and children) goes
// through Runtime.spawn, which confines it.
//
//   - QEMU runs as a uid and gid of its own, picked per process from
//     [UIDBase, UIDBase+UIDCount) among the ids no process on the host
//     has (above the container tier's user-namespace ranges). QEMU starts
//     as root, opens what its command line names (kernel, initramfs,
//     sockets, console, RAM file, KVM) and, before the guest runs its
//     first instruction, "-chroot"s into an empty root-owned directory and
//     drops to that uid ("-runas uid:gid": setgid, setgroups to the gid
//     alone, setuid; the kernel clears every capability, ambient included,
//     and QEMU checks that setuid(0) then fails). An escaped QEMU is an
//     unprivileged user that sees an empty filesystem, owns no file, and
//     shares its uid with no other VM (it cannot signal, ptrace or read
//     another QEMU's memory).
//   - Disks are opened by the edge, as root, and handed to QEMU as fd sets
//     ("-add-fd", "file=/dev/fdset/N"): a disk that QEMU reopens later
//     (the block layer does when a restored VM's migration completes) is
//     found in its set, not by a path the chroot hides. A read-only disk
//     (a shared layer) is in its set read-only only: QEMU cannot get it
//     writable. Image locking is off for these files (lockingKey says
//     why): each VM has a writable disk of its own. The memory snapshot is passed as a descriptor too (QMP
//     getfd), and a restore reads it after the drop ("-incoming defer"),
//     so a tampered snapshot is parsed by the unprivileged process only.
//   - The command line is recorded in the state directory (ArgsName, root
//     only) and read from there for a pause or a fork: never from
//     /proc/<pid>/cmdline, which an escaped QEMU can rewrite to make the
//     edge open other files. The uid is recorded there too (uidName): a
//     QEMU found in /proc by the -name in its command line counts as its
//     sandbox's only if it runs as that uid (pidOf), so a QEMU that
//     renames itself cannot pass for another sandbox's.
//
// The state directory stays root's (0700): QEMU's sockets and console are
// made there before the drop, and the edge (root) uses them; no VM's uid
// can reach another's (nor its own, once chrooted).
//
// What a new QEMU argument must respect: a file QEMU opens while starting
// needs nothing; a disk goes in a -drive or -blockdev whose "file=" or
// "filename=" (or "*.filename=", e.g. a qcow2 backing) is an absolute
// path, which spawn turns into an fd set ("readonly=on" or a "backing."
// key: read-only); a file QEMU would open after the start (e.g. a QMP
// screendump) must be passed to it as a descriptor (QMP add-fd or getfd).
//
// Lock order: uidMu only, never held with another lock.

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/warrenhq/warren/internal/sandboxnet"
	"syscall"

	"github.com/digitalocean/go-qemu/qmp"
	"github.com/digitalocean/go-qemu/qmp/raw"

	"github.com/warrenhq/warren/internal/runtime"
)

// The uids (and gids) of QEMU processes: 2^24 ids just below 2^31,
// clear of the container tier's user-namespace ranges (2^20 .. 2^20+2^30).
const (
	UIDBase  = 1<<31 - 1<<24
	UIDCount = 1 << 24
)

// ArgsName is the file in a state directory that holds its QEMU's
// command line (as spawn got it: paths, not descriptors).
const ArgsName = "qemu-args.json"

// uidName is the file in a state directory that holds the uid its QEMU
// runs as (spawn writes it; pidOf checks a QEMU found by name against it).
const uidName = "qemu.uid"

// chrootName is the empty directory under CacheDir that QEMU chroots into.
const chrootName = "qemu-root"

var (
	uidMu       sync.Mutex
	uidReserved = map[uint32]bool{} // picked, the QEMU not started yet
)

// pickUID reserves a uid in the range that no process on the host has;
// release it once the QEMU runs (from then on /proc shows it).
func pickUID() (uint32, error) {
	used, err := hostUIDs()
	if err != nil {
		return 0, err
	}
	uidMu.Lock()
	defer uidMu.Unlock()
	var b [4]byte
	for range 64 {
		if _, err := rand.Read(b[:]); err != nil {
			return 0, err
		}
		uid := UIDBase + binary.LittleEndian.Uint32(b[:])%UIDCount
		if !used[uid] && !uidReserved[uid] {
			uidReserved[uid] = true
			return uid, nil
		}
	}
	return 0, errors.New("microvm: no free uid for qemu")
}

func releaseUID(uid uint32) {
	uidMu.Lock()
	delete(uidReserved, uid)
	uidMu.Unlock()
}

// hostUIDs is the set of uids of the host's processes (any of real,
// effective, saved, fs) within the range.
func hostUIDs() (map[uint32]bool, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	used := map[uint32]bool{}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			v, ok := strings.CutPrefix(line, "Uid:")
			if !ok {
				continue
			}
			for _, f := range strings.Fields(v) {
				if n, err := strconv.ParseUint(f, 10, 32); err == nil && n >= UIDBase && n < UIDBase+UIDCount {
					used[uint32(n)] = true
				}
			}
			break
		}
	}
	return used, nil
}

// makeChroot makes dir, QEMU's empty root: root's, not writable by others.
func makeChroot(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("microvm: qemu root: %w", err)
	}
	if err := os.Chown(dir, 0, 0); err != nil {
		return fmt.Errorf("microvm: qemu root: %w", err)
	}
	if err := os.Chmod(dir, 0o555); err != nil {
		return fmt.Errorf("microvm: qemu root: %w", err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("microvm: qemu root: %w", err)
	}
	if len(ents) > 0 {
		return fmt.Errorf("microvm: qemu root %s is not empty", dir)
	}
	return nil
}

// spawn starts QEMU with args (paths, as recorded in ArgsName) for the VM
// whose state directory is stateDir, in cgroup, confined as the file
// comment says, and reaps it when it ends. ram, when set, is the shared RAM
// that args name as ramFDPath (ramfile.go).
func (r *Runtime) spawn(stateDir, cgroup string, args []string, ram *os.File) (*exec.Cmd, error) {
	if err := os.Chmod(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("microvm: state dir: %w", err)
	}
	b, err := json.Marshal(args)
	if err != nil {
		return nil, err
	}
	if err := writeAtomic(filepath.Join(stateDir, ArgsName), b); err != nil {
		return nil, fmt.Errorf("microvm: %w", err)
	}
	qargs, files, err := withFDSets(args)
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	if err != nil {
		return nil, err
	}
	uid, err := pickUID()
	if err != nil {
		return nil, err
	}
	defer releaseUID(uid)
	id := strconv.FormatUint(uint64(uid), 10)
	qargs = append(qargs, "-runas", id+":"+id, "-chroot", r.chroot)
	if err := writeAtomic(filepath.Join(stateDir, uidName), []byte(id)); err != nil {
		return nil, fmt.Errorf("microvm: %w", err)
	}
	logf, err := os.OpenFile(filepath.Join(stateDir, LogName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("microvm: qemu log: %w", err)
	}
	extra := files
	if ram != nil {
		extra = append(append([]*os.File(nil), files...), ram)
		qargs = withRAMDescriptor(qargs, 2+len(extra))
	} else if strings.Contains(strings.Join(qargs, " "), ramFDPath) {
		logf.Close()
		return nil, errors.New("microvm: the command line names a shared RAM descriptor, and none was given")
	}
	cmd := exec.Command(r.cfg.QEMU, qargs...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = []string{}
	cmd.ExtraFiles = extra
	// VMs outlive the edge (a restarted edge adopts them).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := r.cg.startIn(cgroup, cmd); err != nil {
		logf.Close()
		return nil, fmt.Errorf("microvm: start qemu: %w", err)
	}
	r.reap(cmd)
	return cmd, nil
}

// runsAsRecorded reports whether the process pid runs as the uid that
// spawn recorded in stateDir (when none is recorded: as root, a QEMU of
// an earlier edge). A QEMU found by the name in its command line is its
// sandbox's only then: an escaped QEMU can rewrite its command line to
// name another sandbox, not its uid.
func runsAsRecorded(stateDir string, pid int) bool {
	want := "0"
	if b, err := os.ReadFile(filepath.Join(stateDir, uidName)); err == nil {
		want = strings.TrimSpace(string(b))
	} else if !errors.Is(err, os.ErrNotExist) {
		return false
	}
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(st), "\n") {
		if v, ok := strings.CutPrefix(line, "Uid:"); ok {
			f := strings.Fields(v)
			return len(f) == 4 && f[0] == want && f[1] == want && f[2] == want && f[3] == want
		}
	}
	return false
}

// withFDSets replaces each disk path of args's -drive and -blockdev
// options by an fd set holding the file opened here (fd 3+i of the new
// process is files[i]): read-write and read-only for a writable disk,
// read-only alone for one marked read-only.
func withFDSets(args []string) (out []string, files []*os.File, err error) {
	out = make([]string, 0, len(args))
	var adds []string
	nset := 0
	for i := 0; i < len(args); i++ {
		out = append(out, args[i])
		if args[i] == "-netdev" && i+1 < len(args) && tapOf(args[i+1]) != "" {
			// A tap (network.go): opened here, by name, as root; QEMU
			// gets its queue's descriptor.
			i++
			id, _, _ := strings.Cut(strings.TrimPrefix(args[i], "tap,"), ",")
			f, err := sandboxnet.OpenTap(tapOf(args[i]))
			if err != nil {
				return nil, files, fmt.Errorf("microvm: network: %w", err)
			}
			files = append(files, f)
			out = append(out, fmt.Sprintf("tap,%s,fd=%d", id, 2+len(files)))
			continue
		}
		if (args[i] != "-drive" && args[i] != "-blockdev") || i+1 == len(args) {
			continue
		}
		i++
		kvs := strings.Split(args[i], ",")
		var locks []string
		ro := false
		for _, kv := range kvs {
			if kv == "readonly=on" || kv == "read-only=on" {
				ro = true
			}
		}
		for j, kv := range kvs {
			k, p, ok := strings.Cut(kv, "=")
			if !ok || !filepath.IsAbs(p) || strings.HasPrefix(p, "/dev/fdset/") ||
				(k != "file" && k != "filename" && !strings.HasSuffix(k, ".filename")) {
				continue
			}
			nset++
			set := nset
			readOnly := ro || strings.HasPrefix(k, "backing.")
			modes := []int{os.O_RDWR, os.O_RDONLY}
			if readOnly {
				modes = modes[1:]
			}
			for _, mode := range modes {
				f, err := os.OpenFile(p, mode, 0)
				if err != nil {
					return nil, files, fmt.Errorf("microvm: disk: %w", err)
				}
				files = append(files, f)
				adds = append(adds, "-add-fd", fmt.Sprintf("fd=%d,set=%d,opaque=%s", 2+len(files), set, p))
			}
			kvs[j] = k + "=/dev/fdset/" + strconv.Itoa(set)
			locks = append(locks, lockingKey(k)+"=off")
		}
		out = append(out, strings.Join(append(kvs, locks...), ","))
	}
	return append(adds, out...), files, nil
}

// lockingKey is the option that turns image locking off for the file
// named by key. QEMU's locks are OFD locks, released when the last
// descriptor of a file description closes; a descriptor in an fd set never
// closes, so the locks QEMU takes through one of the set's descriptors
// would outlive their use and, when the block layer switches descriptors
// (a VM continuing after its memory snapshot), refuse the write lock to
// QEMU itself. The runtime gives each VM its own writable disk instead.
func lockingKey(key string) string {
	switch key {
	case "file":
		return "file.locking"
	case "filename":
		return "locking"
	}
	return strings.TrimSuffix(key, "filename") + "locking"
}

// qemuArgs is the command line (without -incoming) that the VM whose
// state directory is stateDir was last started with. A VM started by an
// earlier edge, which ran QEMU as root and recorded nothing, is read from
// its process pid (legacyArgs).
func qemuArgs(stateDir string, pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join(stateDir, ArgsName))
	if errors.Is(err, os.ErrNotExist) && pid > 0 {
		return legacyArgs(pid)
	}
	if err != nil {
		return nil, fmt.Errorf("microvm: qemu's command line: %w", err)
	}
	var args []string
	if err := json.Unmarshal(b, &args); err != nil || len(args) == 0 {
		return nil, fmt.Errorf("microvm: malformed %s: %v", ArgsName, err)
	}
	return withoutIncoming(args), nil
}

// withoutIncoming is args without the -incoming of a restored VM: who
// starts it again says where from.
func withoutIncoming(args []string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if args[i] == "-incoming" && i+1 < len(args) {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// legacyArgs is the command line of a QEMU that an earlier edge started
// as root, from /proc (trusted only because it runs as root: an
// unprivileged QEMU could have rewritten it), made fit for spawn: its
// seccomp filter no longer denies set*id, which -runas needs.
func legacyArgs(pid int) ([]string, error) {
	st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil || !strings.Contains(string(st), "\nUid:\t0\t0\t0\t0\n") {
		return nil, fmt.Errorf("microvm: qemu %d: no %s and not a root QEMU of an earlier edge", pid, ArgsName)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return nil, err
	}
	args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	if len(args) < 2 {
		return nil, fmt.Errorf("microvm: qemu %d: empty command line", pid)
	}
	args = withoutIncoming(args[1:])
	for i := 1; i < len(args); i++ {
		if args[i-1] == "-sandbox" {
			args[i] = strings.ReplaceAll(args[i], ",elevateprivileges=deny", "")
		}
	}
	return args, nil
}

// QMPFile runs fn on a QMP connection to h's QEMU with f handed to QEMU
// as an fd set: fn gets the set's path ("/dev/fdset/N"), which QEMU opens
// where it takes a file name (e.g. screendump; QEMU, chrooted, reaches no
// path of the host). The set is removed afterwards.
func (r *Runtime) QMPFile(h runtime.Handle, f *os.File, fn func(m *raw.Monitor, path string) error) error {
	return r.qmpSocket(h, func(mon *qmp.SocketMonitor, m *raw.Monitor) error {
		out, err := mon.RunWithFile([]byte(`{"execute":"add-fd"}`), f)
		if err != nil {
			return fmt.Errorf("add-fd: %w", err)
		}
		var res struct {
			Return struct {
				FdsetID int `json:"fdset-id"`
			} `json:"return"`
		}
		if err := json.Unmarshal(out, &res); err != nil {
			return fmt.Errorf("add-fd: %w", err)
		}
		defer mon.Run([]byte(fmt.Sprintf(`{"execute":"remove-fd","arguments":{"fdset-id":%d}}`, res.Return.FdsetID)))
		return fn(m, "/dev/fdset/"+strconv.Itoa(res.Return.FdsetID))
	})
}
