package container

import (
	"testing"

	"github.com/warrenhq/warren/internal/runtime"
	"github.com/warrenhq/warren/internal/runtime/runtimetest"
)

// TestConformance: the container tier passes the suite every tier runs
// (internal/runtime/runtimetest), as root with busybox.
func TestConformance(t *testing.T) {
	runtimetest.Run(t, func(t *testing.T) runtimetest.Tier {
		f := newFixture(t)
		return runtimetest.Tier{Runtime: f.rt, Spec: func(t *testing.T, id string) *runtime.Spec { return f.spec(t, id) }}
	})
}
