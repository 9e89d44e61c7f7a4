package confine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDialLoopback: a connection made to a port on another network
// namespace's loopback (a process that has nothing but loopback) works,
// nothing listening is ECONNREFUSED, and every thread of the process is
// back in its own network namespace afterwards.
func TestDialLoopback(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root")
	}
	for _, tool := range []string{"unshare", "ip", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("SKIP: %s not installed", tool)
		}
	}
	cmd := exec.Command("unshare", "--net", "sh", "-c", "ip link set lo up && exec python3 -m http.server --bind 127.0.0.1 8123")
	cmd.Dir = t.TempDir()
	if err := os.WriteFile(filepath.Join(cmd.Dir, "hello"), []byte("from the other namespace"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	own := nsIno(t, "/proc/self/ns/net")
	get := func() (string, error) {
		hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return DialLoopback(ctx, pidfd, 8123) }}}
		resp, err := hc.Get("http://sandbox/hello")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := get(); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("the server in the other namespace never answered: %v", err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 30)
	for i := 0; i < 30; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if b, err := get(); err != nil || b != "from the other namespace" {
				errs <- fmt.Errorf("%q %v", b, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if _, err := DialLoopback(context.Background(), pidfd, 8124); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a port nobody listens on: %v, want ECONNREFUSED", err)
	}
	tasks, _ := filepath.Glob("/proc/self/task/*/ns/net")
	for _, p := range tasks {
		if ino := nsIno(t, p); ino != own {
			t.Errorf("%s is still in another network namespace", p)
		}
	}
	if len(tasks) == 0 {
		t.Fatal("no threads listed")
	}
}
