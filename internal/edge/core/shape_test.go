package core

import (
	"testing"

	"github.com/warrenhq/warren/api"
)

// TestShapeKeyDisplay: a create that asks for a screen is never served by
// a pool (a pool's sandboxes have none).
func TestShapeKeyDisplay(t *testing.T) {
	req := api.CreateSandboxRequest{Tier: api.TierVM, Image: "busybox", Hostname: "sandbox"}
	if _, ok := ShapeKey(&req); !ok {
		t.Fatal("a plain vm create has no shape")
	}
	req.Display = true
	if k, ok := ShapeKey(&req); ok {
		t.Errorf("a create with display: true has the shape %q", k)
	}
}
