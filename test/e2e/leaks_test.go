package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warrenhq/warren/internal/hoststat"
	"github.com/warrenhq/warren/internal/sandboxnet"
	"github.com/warrenhq/warren/internal/serve"
)

// assertNoLeaks fails when a cgroup, agent process or mount of the given
// (stopped) servers remains; with no servers given, of every server this
// process started.
func assertNoLeaks(t *testing.T, servers ...*server) {
	t.Helper()
	dataDirs := startedDirs()
	agentCheck := true
	if len(servers) == 0 && len(sharedStops) > 0 {
		// The shared server runs until TestZZSharedServerStopsClean: every
		// other server of this process must be clean, not it.
		if shared != nil {
			delete(dataDirs, shared.dataDir)
		}
		agentCheck = false
	}
	if len(servers) > 0 {
		dataDirs = map[string]bool{}
		for _, s := range servers {
			dataDirs[s.dataDir] = true
		}
		// Other servers of this process may still run their agents.
		agentCheck = len(sharedStops) == 0
	}
	// So may the servers of the other tests of the parallel phase.
	agentCheck = agentCheck && !othersRunning()
	if leaks := waitNoLeaks(dataDirs, agentCheck); len(leaks) > 0 {
		for _, s := range servers {
			t.Logf("server log (%s):\n%s", s.dataDir, tail(s.logs.String(), 60))
		}
		t.Fatalf("leaks after the servers stopped:\n%s", strings.Join(leaks, "\n"))
	}
}

// waitNoLeaks gives the servers of dataDirs 5 s to have left nothing
// behind and returns what remains: cgroups (and so their processes), qemu
// processes, mounts, networks and, with agentCheck, any agent process on
// the host.
func waitNoLeaks(dataDirs map[string]bool, agentCheck bool) []string {
	deadline := time.Now().Add(5 * time.Second)
	for {
		var leaks []string
		for dataDir := range dataDirs {
			dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + serve.CgroupParent(dataDir))
			vmDirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + serve.CgroupParent(dataDir) + "-vm")
			q35Dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + serve.CgroupParent(dataDir) + "-q35")
			vmDirs = append(vmDirs, q35Dirs...)
			dirs = append(dirs, vmDirs...)
			if q := qemusOf(dataDir); q != "" {
				leaks = append(leaks, "qemu processes "+q)
			}
			for _, d := range dirs {
				if st, err := os.Stat(d); err == nil && st.IsDir() {
					leaks = append(leaks, "cgroup "+d)
				}
			}
			leaks = append(leaks, netLeaks(dataDir)...)
		}
		if out, _ := exec.Command("pgrep", "-f", bins.agent).Output(); agentCheck && len(strings.TrimSpace(string(out))) > 0 {
			leaks = append(leaks, "agent processes "+strings.TrimSpace(string(out)))
		}
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		for _, l := range strings.Split(string(mi), "\n") {
			for dataDir := range dataDirs {
				if strings.Contains(l, dataDir) {
					leaks = append(leaks, "mount "+l)
				}
			}
		}
		if len(leaks) == 0 || time.Now().After(deadline) {
			return leaks
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// netLeaks lists the veths and nftables tables that the server of
// dataDir made for networked sandboxes and left.
func netLeaks(dataDir string) []string {
	l, err := sandboxnet.Owned(serve.CgroupParent(dataDir))
	if err != nil {
		return []string{"network: " + err.Error()}
	}
	return l
}

// assertNoLeaksOf is assertNoLeaks for the one server s (other servers of
// this process may still run): its cgroups, and so its processes, and its
// mounts are gone.
func assertNoLeaksOf(t *testing.T, s *server) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var leaks []string
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + serve.CgroupParent(s.dataDir))
		for _, d := range dirs {
			if st, err := os.Stat(d); err == nil && st.IsDir() {
				leaks = append(leaks, "cgroup "+d)
			}
		}
		leaks = append(leaks, netLeaks(s.dataDir)...)
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		for _, l := range strings.Split(string(mi), "\n") {
			if strings.Contains(l, s.dataDir) {
				leaks = append(leaks, "mount "+l)
			}
		}
		if len(leaks) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("leaks after the server stopped:\n%s", strings.Join(leaks, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestSharedLimitsRaised: the edge raised the inotify limits that every
// sandbox shares with the host's root (docs/operations.md).
func TestSharedLimitsRaised(t *testing.T) {
	sharedServer(t)
	for name, want := range hoststat.SharedLimits {
		b, err := os.ReadFile("/proc/sys/" + name)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err != nil || n < want {
			t.Errorf("%s is %q, want at least %d", name, b, want)
		}
	}
}
