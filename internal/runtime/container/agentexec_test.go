package container

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestConcurrentStarts starts and destroys sandboxes from several
// goroutines at once for a few seconds: every Start must succeed. (Each
// start switches its forking thread's effective uid to the sandbox's range
// while others fork and the background refill makes user namespaces.)
func TestConcurrentStarts(t *testing.T) {
	f := newFixture(t)
	const workers = 4
	deadline := time.Now().Add(3 * time.Second)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		failures []string
		starts   int
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; time.Now().Before(deadline); n++ {
				spec := f.spec(t, fmt.Sprintf("st-%d-%d", w, n))
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				inst, err := f.rt.Start(ctx, spec)
				cancel()
				mu.Lock()
				starts++
				if err != nil {
					log, _ := os.ReadFile(filepath.Join(spec.StateDir, LogName))
					failures = append(failures, fmt.Sprintf("%s: %v (agent log: %q)", spec.ID, err, log))
				}
				mu.Unlock()
				if err != nil {
					continue
				}
				inst.Agent.Close()
				if err := f.rt.Destroy(context.Background(), inst.Handle); err != nil {
					t.Errorf("Destroy %s: %v", spec.ID, err)
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("%d starts, %d failed", starts, len(failures))
	for _, s := range failures {
		t.Error(s)
	}
}

// TestAgentExecWhateverFDs: the agent is exec'd from its sealed copy
// whatever numbers the parent's descriptors have. os/exec's child moves
// its status pipe (and any passed descriptor numbered below its slot) to
// one past the highest descriptor passed, which it does not know to be
// in use: when a passed file sits right below the copy's descriptor, the
// copy's number was replaced by the pipe before the exec, and the start
// failed with "fork/exec /proc/self/fd/N: permission denied" (an edge or a
// test process with about a hundred descriptors open, now and then).
func TestAgentExecWhateverFDs(t *testing.T) {
	f := newFixture(t)
	if f.rt.ids == nil {
		t.Fatal("the runtime does not use user namespaces")
	}
	// Two free descriptor numbers n-1 and n: the agent's copy at n, a
	// passed file at n-1.
	n := 300
	for ; n < 1000; n++ {
		_, e1 := unix.FcntlInt(uintptr(n-1), unix.F_GETFD, 0)
		_, e2 := unix.FcntlInt(uintptr(n), unix.F_GETFD, 0)
		if e1 == unix.EBADF && e2 == unix.EBADF {
			break
		}
	}
	if err := unix.Dup3(int(f.rt.agentExe.Fd()), n, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	exe := os.NewFile(uintptr(n), "warren-agent")
	defer exe.Close()
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	if err := unix.Dup3(int(null.Fd()), n-1, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	passed := os.NewFile(uintptr(n-1), "passed")
	defer passed.Close()

	saved := f.rt.agentExe
	f.rt.agentExe = exe
	defer func() { f.rt.agentExe = saved }()
	base, err := f.rt.ids.alloc("sb-fds")
	if err != nil {
		t.Fatal(err)
	}
	defer f.rt.ids.free(base, "sb-fds")
	cmd := &exec.Cmd{ExtraFiles: []*os.File{passed}, SysProcAttr: &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET,
		Pdeathsig:  syscall.SIGKILL,
	}}
	f.rt.inUserns(cmd, base, nil)
	goruntime.LockOSThread()
	err, restored := startAs(cmd, base)
	if restored {
		goruntime.UnlockOSThread()
	}
	if err != nil {
		t.Fatalf("start of the agent with a passed descriptor at %d, its copy at %d: %v", n-1, n, err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()

	// A started agent keeps no descriptor of its copy (nothing inside
	// may inherit it).
	inst := f.start(t, f.spec(t, "sb-fds2"))
	dir := "/proc/" + strconv.Itoa(inst.Handle.Pid) + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if l, _ := os.Readlink(filepath.Join(dir, e.Name())); strings.Contains(l, "warren-agent") {
			t.Errorf("the agent keeps descriptor %s: %s", e.Name(), l)
		}
	}
}
