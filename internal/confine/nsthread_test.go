package confine

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func nsIno(t *testing.T, p string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

// TestNamespaceThreads: jobs run in the target's namespaces, and every
// thread of the process is back in its own ones afterwards, failed jobs
// included; the pool stays small.
func TestNamespaceThreads(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("SKIP: unshare(1) not installed")
	}
	cmd := exec.Command("unshare", "--mount", "--ipc", "sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pid := strconv.Itoa(cmd.Process.Pid)
	var theirMnt uint64
	deadline := time.Now().Add(5 * time.Second)
	own := nsIno(t, "/proc/self/ns/mnt")
	for theirMnt = nsIno(t, "/proc/"+pid+"/ns/mnt"); theirMnt == own; theirMnt = nsIno(t, "/proc/"+pid+"/ns/mnt") {
		if time.Now().After(deadline) {
			t.Fatal("unshare did not enter a new mount namespace")
		}
		time.Sleep(10 * time.Millisecond)
	}
	theirIPC := nsIno(t, "/proc/"+pid+"/ns/ipc")
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)

	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := 0; i < 40; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			boom := errors.New("boom")
			err := inNamespaces(pidfd, unix.CLONE_NEWNS|unix.CLONE_NEWIPC, func() error {
				var st unix.Stat_t
				if err := unix.Stat("/proc/thread-self/ns/mnt", &st); err != nil || st.Ino != theirMnt {
					return errors.New("not in the target's mount namespace")
				}
				if err := unix.Stat("/proc/thread-self/ns/ipc", &st); err != nil || st.Ino != theirIPC {
					return errors.New("not in the target's IPC namespace")
				}
				_ = unix.Chdir("/proc")
				if i%3 == 0 {
					return boom
				}
				return nil
			})
			if i%3 == 0 && !errors.Is(err, boom) || i%3 != 0 && err != nil {
				errs <- err
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("job: %v", err)
	}
	tasks, _ := filepath.Glob("/proc/self/task/*")
	for _, task := range tasks {
		if ino := nsIno(t, task+"/ns/mnt"); ino != own {
			t.Errorf("thread %s left in mount namespace %d", filepath.Base(task), ino)
		}
	}
	nsPool.mu.Lock()
	total := nsPool.total
	nsPool.mu.Unlock()
	if total > maxNSThreads || total == 0 {
		t.Errorf("%d namespace threads", total)
	}
	if wd, _ := os.Getwd(); wd == "/proc" {
		t.Error("a job's chdir reached the process")
	}
}
