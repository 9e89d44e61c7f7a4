package confinetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
)

// CgoLinked reports whether the running binary links the cgo runtime, in
// which case syscall.AllThreadsSyscall (and so confine.Enter) cannot work.
func CgoLinked() bool {
	const prGetKeepCaps = 7
	_, _, e := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, prGetKeepCaps, 0, 0)
	return e == syscall.ENOTSUP
}

// GoTool is the go command that built this binary.
func GoTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// GoStatic runs the go tool with args in dir with CGO_ENABLED=0, e.g.
// GoStatic(".", "build", "-o", out, "./cmd/x") or
// GoStatic(".", "test", "-c", "-o", out, ".").
func GoStatic(dir string, args ...string) error {
	cmd := exec.Command(GoTool(), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("confinetest: go %v: %w\n%s", args, err, out)
	}
	return nil
}
