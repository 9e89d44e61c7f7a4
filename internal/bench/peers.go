package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// runcCycle prepares an OCI bundle over rootfs (read-only) and returns a
// cycle that runs `true` in a fresh container with `runc run`.
func runcCycle(rootfs string) (func(context.Context) error, func(), error) {
	runc, err := exec.LookPath("runc")
	if err != nil {
		return nil, nil, fmt.Errorf("runc not installed")
	}
	dir, err := os.MkdirTemp("", "warren-bench-runc-")
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	spec := exec.Command(runc, "spec", "--bundle", dir)
	if b, err := spec.CombinedOutput(); err != nil {
		cleanup()
		return nil, nil, fmt.Errorf("runc spec: %v: %s", err, b)
	}
	p := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(p)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	var cfg map[string]any
	if err := json.Unmarshal(raw, &cfg); err != nil {
		cleanup()
		return nil, nil, err
	}
	cfg["root"] = map[string]any{"path": rootfs, "readonly": true}
	proc := cfg["process"].(map[string]any)
	proc["terminal"] = false
	proc["args"] = []string{"/bin/true"}
	raw, _ = json.Marshal(cfg)
	if err := os.WriteFile(p, raw, 0o644); err != nil {
		cleanup()
		return nil, nil, err
	}
	root := filepath.Join(dir, "state")
	cycle := func(ctx context.Context) error {
		var b [8]byte
		_, _ = rand.Read(b[:])
		id := "wb-" + hex.EncodeToString(b[:])
		cmd := exec.CommandContext(ctx, runc, "--root", root, "run", "--bundle", dir, id)
		if out, err := cmd.CombinedOutput(); err != nil {
			_ = exec.Command(runc, "--root", root, "delete", "-f", id).Run()
			return fmt.Errorf("runc run: %v: %s", err, out)
		}
		return nil
	}
	return cycle, cleanup, nil
}

// bwrapCycle runs `true` under bubblewrap with every namespace unshared.
func bwrapCycle(rootfs string) (func(context.Context) error, func(), error) {
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		return nil, nil, fmt.Errorf("bwrap not installed")
	}
	cycle := func(ctx context.Context) error {
		cmd := exec.CommandContext(ctx, bwrap, "--ro-bind", rootfs, "/", "--proc", "/proc", "--dev", "/dev",
			"--tmpfs", "/tmp", "--unshare-all", "--die-with-parent", "/bin/true")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("bwrap: %v: %s", err, out)
		}
		return nil
	}
	return cycle, func() {}, nil
}
