package edgeproto

import "testing"

func TestSandboxIDRoundTrip(t *testing.T) {
	for _, node := range []string{"n1", "edge-a", "a"} {
		id := NewSandboxID(node)
		if got := NodeOf(id); got != node {
			t.Errorf("NodeOf(%q) = %q, want %q", id, got, node)
		}
	}
	for _, bad := range []string{"", "sb-", "sb-n1", "sb-n1-", "sb--abc", "sb-N1-abc", "sb-n1-ab_c", "xx-n1-abc"} {
		if got := NodeOf(bad); got != "" {
			t.Errorf("NodeOf(%q) = %q, want \"\"", bad, got)
		}
	}
}

func TestTrajKeyPerProject(t *testing.T) {
	if TrajKey("", "run") != "run" || TrajKey("p1", "run") == TrajKey("p2", "run") {
		t.Fatalf("TrajKey does not keep projects apart: %q %q %q", TrajKey("", "run"), TrajKey("p1", "run"), TrajKey("p2", "run"))
	}
}
