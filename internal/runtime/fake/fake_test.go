package fake_test

import (
	"path/filepath"
	"testing"

	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/runtime/fake"
	"github.com/warrenhq/warren/internal/runtime/runtimetest"
)

// TestConformance: the fake tier passes the suite every tier runs, so what
// the edge's unit tests learn with it holds for a real tier.
func TestConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtimetest.Tier {
		rt := fake.New()
		t.Cleanup(func() {
			if ids := rt.IDs(); len(ids) > 0 {
				t.Errorf("sandboxes left: %v", ids)
			}
		})
		dir := t.TempDir()
		return runtimetest.Tier{Runtime: rt, Spec: func(t *testing.T, id string) *runtime.Spec {
			return &runtime.Spec{ID: id, StateDir: filepath.Join(dir, id, "state"), RootDir: filepath.Join(dir, id, "root")}
		}}
	})
}
