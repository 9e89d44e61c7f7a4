package edge

import (
	"testing"

	"github.com/warrenhq/warren/api"
)

// TestPoolKeyDisplay: a create that asks for a screen is never served by
// a pool (a pool's sandboxes have none).
func TestPoolKeyDisplay(t *testing.T) {
	req := api.CreateSandboxRequest{Tier: api.TierVM, Image: "busybox", Hostname: "sandbox"}
	if _, ok := poolKey(&req); !ok {
		t.Fatal("a plain vm create is not poolable")
	}
	req.Display = true
	if k, ok := poolKey(&req); ok {
		t.Errorf("a create with display: true matches pool key %q", k)
	}
}
