// Package confinetest builds small sandbox roots for tests.
package confinetest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// BusyboxPath is the static busybox the layers are built from
// (Debian's busybox-static).
const BusyboxPath = "/bin/busybox"

// ErrNoBusybox means BusyboxPath is missing; tests skip on it.
var ErrNoBusybox = errors.New("confinetest: " + BusyboxPath + " not installed (apt-get install busybox-static)")

// BusyboxLayer fills dir with a minimal root: bin/busybox, a relative
// symlink per applet, and the directories tmp (1777), proc, mnt and root.
// It leaves out dev, sys and etc so callers see them created on demand.
func BusyboxLayer(dir string) error {
	if _, err := os.Stat(BusyboxPath); err != nil {
		return ErrNoBusybox
	}
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	data, err := os.ReadFile(BusyboxPath)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(bin, "busybox"), data, 0o755); err != nil {
		return err
	}
	out, err := exec.Command(BusyboxPath, "--list").Output()
	if err != nil {
		return fmt.Errorf("confinetest: busybox --list: %w", err)
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet == "busybox" || strings.Contains(applet, "/") {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(bin, applet)); err != nil {
			return err
		}
	}
	for _, d := range []string{"proc", "mnt", "root"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return err
	}
	return os.Chmod(tmp, 0o1777)
}

// Layout is a sandbox root's host directories.
type Layout struct {
	Lower, Upper, Work, Root string
}

// NewLayout creates base/{lower,upper,work,root} with a busybox lower layer.
func NewLayout(base string) (*Layout, error) {
	l := &Layout{
		Lower: filepath.Join(base, "lower"),
		Upper: filepath.Join(base, "upper"),
		Work:  filepath.Join(base, "work"),
		Root:  filepath.Join(base, "root"),
	}
	for _, d := range []string{l.Lower, l.Upper, l.Work, l.Root} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	if err := BusyboxLayer(l.Lower); err != nil {
		return nil, err
	}
	return l, nil
}
