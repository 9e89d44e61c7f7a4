package e2e

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/warrenhq/warren/api"
)

// layerMounts lists the erofs mounts of server s (mount point -> source).
func layerMounts(t *testing.T, s *server) map[string]string {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range strings.Split(string(mi), "\n") {
		f := strings.Fields(l)
		for i := range f {
			if f[i] == "-" && i+2 < len(f) && f[i+1] == "erofs" && strings.HasPrefix(f[4], s.dataDir+"/") {
				out[f[4]] = f[i+2]
			}
		}
	}
	return out
}

func loopDevices(t *testing.T) int {
	out, _ := exec.Command("losetup", "-a").Output()
	return len(strings.Fields(string(out)))
}

// TestLayerMountsShared: every sandbox of an image uses the one file-backed
// mount of each layer; the mounts go with the last sandbox, and a kill -9
// of the server leaks none of them.
func TestLayerMountsShared(t *testing.T) {
	s := startServer(t)
	ctx := context.Background()
	loops := loopDevices(t)
	var ids []string
	for i := 0; i < 3; i++ {
		ids = append(ids, s.create(t, api.CreateSandboxRequest{}).ID)
	}
	m := layerMounts(t, s)
	if len(m) != 1 {
		t.Fatalf("busybox has one layer; want one shared mount, got %v", m)
	}
	for p, src := range m {
		if !strings.HasSuffix(src, ".erofs") {
			t.Fatalf("%s mounted from %s, not file-backed", p, src)
		}
	}
	if n := loopDevices(t); n != loops {
		t.Fatalf("loop devices %d -> %d", loops, n)
	}
	for _, id := range ids {
		if r := s.sh(t, id, "echo hi > /tmp/x && cat /tmp/x && ls /bin/busybox"); r.ExitCode != 0 || !strings.HasPrefix(r.Stdout, "hi\n") {
			t.Fatalf("exec: %+v", r)
		}
	}
	// The sandbox cannot write to the layer: its changes go to its own upper dir.
	if r := s.sh(t, ids[0], "rm /bin/ls && ls /bin/ls"); r.ExitCode == 0 {
		t.Fatalf("rm in sandbox 0: %+v", r)
	}
	if r := s.sh(t, ids[1], "ls /bin/ls"); r.ExitCode != 0 {
		t.Fatalf("another sandbox lost /bin/ls: %+v", r)
	}
	if _, err := s.C.Delete(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if len(layerMounts(t, s)) != 1 {
		t.Fatal("layer unmounted while in use")
	}
	// kill -9: the mount stays behind, the restart adopts the two live
	// sandboxes and keeps exactly their mount.
	s.kill9()
	s.start()
	if m := layerMounts(t, s); len(m) != 1 {
		t.Fatalf("after restart: %v", m)
	}
	if r := s.sh(t, ids[2], "cat /tmp/x"); r.Stdout != "hi\n" {
		t.Fatalf("adopted sandbox: %+v", r)
	}
	for _, id := range ids[1:] {
		if _, err := s.C.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if m := layerMounts(t, s); len(m) != 0 {
		t.Fatalf("mounts after the last sandbox: %v", m)
	}
	s.stop()
	assertNoLeaks(t)
}
