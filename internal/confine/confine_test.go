package confine

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/elastic/go-seccomp-bpf/arch"

	"github.com/warrenhq/warren/internal/agentproto"
	"github.com/warrenhq/warren/internal/confine/confinetest"
)

// The tests re-execute the test binary as a sandbox's PID 1: TestMain sees
// childEnv, calls Enter with the config read from stdin, runs the probes in
// probes_test.go from inside and prints their results as JSON.
const childEnv = "WARREN_CONFINE_TEST_CHILD"

// childInput is what the test passes to the re-executed child.
type childInput struct {
	Setup      agentproto.SetupConfig
	HostMarker string // a host file that must not be reachable
}

// probeResult is one check made from inside the sandbox.
type probeResult struct {
	Name   string
	OK     bool
	Detail string
}

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(childMain())
	}
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	buildDir  string
	childBin  string
	buildErr  error
)

// childBinary is this test binary when it was built without cgo, else a
// copy built with CGO_ENABLED=0 (Enter needs AllThreadsSyscall).
func childBinary() (string, error) {
	if !confinetest.CgoLinked() {
		return os.Args[0], nil
	}
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "confine-test-")
		if buildErr != nil {
			return
		}
		childBin = filepath.Join(buildDir, "confine.test")
		buildErr = confinetest.GoStatic(".", "test", "-c", "-o", childBin, ".")
	})
	return childBin, buildErr
}

func childMain() int {
	var in childInput
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "child: decode input:", err)
		return 2
	}
	var steps []string
	Trace = func(step string, took time.Duration) { steps = append(steps, fmt.Sprintf("%s=%s", step, took)) }
	t0 := time.Now()
	if err := Enter(&in.Setup); err != nil {
		fmt.Fprintln(os.Stderr, "child: Enter:", err)
		return 3
	}
	took := time.Since(t0)
	results := append(runProbes(&in), probeResult{Name: "enter-duration", OK: true, Detail: took.String() + " " + strings.Join(steps, " ")})
	if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
		fmt.Fprintln(os.Stderr, "child: encode:", err)
		return 4
	}
	return 0
}

func TestEnterConfinesSandbox(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root")
	}
	base := t.TempDir()
	layout, err := confinetest.NewLayout(base)
	if err == confinetest.ErrNoBusybox {
		t.Skip("SKIP: " + err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(base, "host-marker")
	if err := os.WriteFile(marker, []byte("host"), 0o600); err != nil {
		t.Fatal(err)
	}
	hostName, _ := os.Hostname()

	in := childInput{
		Setup: agentproto.SetupConfig{
			RootDir:  layout.Root,
			Lowers:   []string{layout.Lower},
			Upper:    layout.Upper,
			Work:     layout.Work,
			Hostname: "sandbox-test",
			ShmMB:    16,
		},
		HostMarker: marker,
	}
	full, err := os.Stat("/dev/full")
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		// A sandbox that could change its device nodes changed the host's.
		now, err := os.Stat("/dev/full")
		if err != nil {
			t.Fatal(err)
		}
		st, st0 := now.Sys().(*syscall.Stat_t), full.Sys().(*syscall.Stat_t)
		if now.Mode() != full.Mode() || st.Uid != st0.Uid || st.Gid != st0.Gid || !now.ModTime().Equal(full.ModTime()) {
			os.Chmod("/dev/full", full.Mode().Perm())
			os.Chown("/dev/full", int(st0.Uid), int(st0.Gid))
			os.Chtimes("/dev/full", full.ModTime(), full.ModTime())
			t.Errorf("the sandbox changed the host's /dev/full: %v %d:%d %v", now.Mode(), st.Uid, st.Gid, now.ModTime())
		}
	}()
	results, stderr, err := runChild(t, &in)
	if err != nil {
		t.Fatalf("child: %v\nstderr:\n%s", err, stderr)
	}

	want := []string{
		"exec", "mount-syscall", "mount-command", "kcore", "kpagecgroup", "proc-sys-readonly",
		"dev-entries", "dev-nodes-readonly", "dev-null-works", "shm", "ioctl-ficlone", "ioctl-ficlonerange",
		"ioctl-dedupe-sign-extended", "ioctl-high-bits", "ioctl-swapext", "ioctl-move-ext",
		"ioctl-tiocsti", "ioctl-benign", "bpf", "perf_event_open", "userfaultfd", "keyctl",
		"add_key", "unshare-newns", "unshare-newuser", "unshare-nothing", "setns",
		"clone-newns", "clone3", "ptrace", "process_vm_readv", "open_by_handle_at",
		"reboot", "swapon", "init_module", "kexec_load", "open_tree", "fsopen",
		"socket-vsock", "socket-inet", "caps-all-threads", "caps-child", "dumpable",
		"host-marker", "root-dotdot", "mountinfo", "hostname", "loopback", "mknod-nodev",
		"upper-write", "shm-past-size", "signals-to-pid1", "forged-signals-to-pid1",
		"proc-mem-fd-pid1", "proc-mem-fd-sealed",
	}
	got := map[string]probeResult{}
	for _, r := range results {
		if r.Name == "enter-duration" {
			t.Logf("Enter took %s", r.Detail)
		}
		got[r.Name] = r
		if !r.OK {
			t.Errorf("probe %s failed: %s", r.Name, r.Detail)
		}
	}
	for _, n := range want {
		if _, ok := got[n]; !ok {
			t.Errorf("probe %s did not run", n)
		}
	}

	// Writes landed in the private upper layer, missing mount points were
	// created there, and the host saw none of the sandbox's mounts.
	if b, err := os.ReadFile(filepath.Join(layout.Upper, "tmp", "written")); err != nil || string(b) != "inside" {
		t.Errorf("upper layer: got %q, %v", b, err)
	}
	for _, d := range []string{"dev", "sys"} {
		if fi, err := os.Stat(filepath.Join(layout.Upper, d)); err != nil || !fi.IsDir() {
			t.Errorf("mount point %s not created in upper: %v", d, err)
		}
	}
	assertNoHostMounts(t, base)
	if h, _ := os.Hostname(); h != hostName {
		t.Errorf("host hostname changed to %q", h)
	}
}

func TestEnterRejectsBadConfig(t *testing.T) {
	if err := Enter(&agentproto.SetupConfig{}); err == nil {
		t.Fatal("Enter accepted an empty config")
	}
	if err := Enter(nil); err == nil {
		t.Fatal("Enter accepted nil")
	}
}

func TestFilterAssembles(t *testing.T) {
	prog, err := buildFilter()
	if err != nil {
		t.Fatal(err)
	}
	if len(prog) < 100 || len(prog) > 4096 {
		t.Fatalf("filter has %d instructions", len(prog))
	}
	// Every allowed name exists on amd64 (catches typos).
	for _, g := range allowedSyscalls {
		for _, n := range g {
			if _, ok := syscallNames()[n]; !ok {
				t.Errorf("unknown syscall %q in profile", n)
			}
		}
	}
	if xfsIocSwapext != 0xc0c0586d || ext4IocMoveExt != 0xc028660f {
		t.Errorf("ioctl numbers: swapext %#x move_ext %#x", xfsIocSwapext, ext4IocMoveExt)
	}
}

// runChild runs the test binary as PID 1 of fresh namespaces.
func runChild(t *testing.T, in *childInput) ([]probeResult, string, error) {
	t.Helper()
	input, err := json.Marshal(in)
	if err != nil {
		return nil, "", err
	}
	bin, err := childBinary()
	if err != nil {
		return nil, "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "-test.run=^$")
	cmd.Env = []string{childEnv + "=1", "PATH=/bin"}
	cmd.Stdin = bytes.NewReader(input)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS |
			syscall.CLONE_NEWIPC | syscall.CLONE_NEWNET | syscall.CLONE_NEWCGROUP,
		Pdeathsig: syscall.SIGKILL,
	}
	if err := cmd.Run(); err != nil {
		return nil, stderr.String(), err
	}
	var results []probeResult
	if err := json.Unmarshal(stdout.Bytes(), &results); err != nil {
		return nil, stderr.String(), fmt.Errorf("decode %q: %w", stdout.String(), err)
	}
	return results, stderr.String(), nil
}

func assertNoHostMounts(t *testing.T, base string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, base) {
			t.Errorf("host mount left behind: %s", line)
		}
	}
}

func syscallNames() map[string]int {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil
	}
	return info.SyscallNames
}
