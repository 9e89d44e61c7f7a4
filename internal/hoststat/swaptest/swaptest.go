// Package swaptest makes sure swap is on for a test, with scripts/swap.sh,
// and turns it off again when the test ends (if it was the last user).
package swaptest

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/warrenhq/warren/internal/hoststat"
)

// Script finds scripts/swap.sh by walking up from the working directory to
// the module root.
func Script() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "scripts", "swap.sh"), nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("swaptest: module root not found")
		}
		dir = up
	}
}

// Ensure turns on the test swap file (sizeMB) unless swap is already on,
// and skips the test (SKIP: reason) only when swap cannot be set up.
func Ensure(t testing.TB, sizeMB int) {
	t.Helper()
	script, err := Script()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(script, "up", itoa(sizeMB)).CombinedOutput()
	if err != nil {
		if m, merr := hoststat.ReadMemory(); merr == nil && m.SwapTotal > 0 {
			t.Logf("swap script failed (%v: %s), but swap is on; going on", err, out)
			return
		}
		t.Skipf("SKIP: swap cannot be set up on this host: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command(script, "down").CombinedOutput(); err != nil {
			t.Errorf("swap down: %v: %s", err, out)
		}
	})
}

func itoa(n int) string {
	if n <= 0 {
		n = 1024
	}
	return strconv.Itoa(n)
}
