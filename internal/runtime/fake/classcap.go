package fake

import (
	"fmt"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime"
)

var _ runtime.ClassCapper = (*Runtime)(nil)

// ClassCap implements runtime.ClassCapper: a gate that counts its writes
// (ClassWrites); runtime.ErrGone until a best-effort sandbox was started.
func (r *Runtime) ClassCap(cores float64) (runtime.CPUGate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	be := false
	for _, a := range r.boxes {
		if a.priority == api.PriorityBestEffort {
			be = true
		}
	}
	if !be {
		return nil, fmt.Errorf("%w: no best-effort sandbox", runtime.ErrGone)
	}
	return &classGate{r: r}, nil
}

// ClassWrites are the writes to the best-effort class's cap so far:
// caps applied and released, and whether it is capped now.
func (r *Runtime) ClassWrites() (caps, releases int, capped bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.classCaps, r.classReleases, r.classCapped
}

type classGate struct{ r *Runtime }

func (g *classGate) Set(full bool) error {
	g.r.mu.Lock()
	defer g.r.mu.Unlock()
	if full {
		g.r.classReleases++
	} else {
		g.r.classCaps++
	}
	g.r.classCapped = !full
	return nil
}

func (g *classGate) Sample() (int64, int64, error) { return 0, 0, nil }
func (g *classGate) Close() error                  { return nil }
