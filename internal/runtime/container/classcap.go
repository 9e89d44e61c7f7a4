package container

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/internal/runtime"
)

// The best-effort class's cap on cgroup v1 (runtime.go, ClassBestEffort).
// A v1 kernel refuses a CFS quota on a cgroup below the quota of any of its
// descendants (tg_cfs_schedulable_down: EINVAL; v2 takes the minimum), and
// a best-effort sandbox has a quota of its own: its cpu while an operation
// runs (or always), its idle_cpu between operations. So the runtime keeps
// each best-effort sandbox's wanted quota (v1Class.want) and, while the
// class is capped, writes no more than the cap to it:
//   - cap: every member whose wanted quota is above the cap (unlimited
//     included) is clamped to it, then the class's parent gets the cap;
//   - release: the parent's quota goes first, then the clamped members get
//     their wanted quota back;
//   - a member's own write (its CPU gate, its start) while capped writes
//     min(wanted, cap) and remembers the wanted quota.
//
// Members at or below the cap (waiting sandboxes at their idle_cpu, with
// the defaults 0.05 under the 0.1 cap) cost nothing: a cap is one write
// plus one per best-effort sandbox running above it.
//
// v1Class.mu is a leaf. It is taken inside CPUGate.Set, which the edge
// calls under a sandbox's lock (a member's gate) or its class lock (the
// class's gate); nothing is locked under it.

// v1Class is the best-effort class's quota book on cgroup v1.
type v1Class struct {
	mu      sync.Mutex
	cpuDir  string           // the class's directory in the cpu hierarchy
	capQ    int64            // the cap's quota while capped, 0 when not
	want    map[string]int64 // member cpu directory → its wanted quota (-1 = none)
	clamped map[string]bool  // members written below their wanted quota
}

func newV1Class(cpuDir string) *v1Class {
	return &v1Class{cpuDir: cpuDir, want: map[string]int64{}, clamped: map[string]bool{}}
}

// member reports whether the cpu directory dir is one of the class's
// sandboxes.
func (c *v1Class) member(dir string) bool {
	return c != nil && filepath.Dir(dir) == c.cpuDir
}

// above says whether quota q is more than the cap quota capQ.
func above(q, capQ int64) bool { return q < 0 || q > capQ }

// write sets member dir's quota to q (or the cap while capped); f is its
// quota file when open (else the path is used).
func (c *v1Class) write(dir string, f *os.File, q int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.want[dir] = q
	v := q
	if c.capQ > 0 && above(q, c.capQ) {
		v = c.capQ
		c.clamped[dir] = true
	} else {
		delete(c.clamped, dir)
	}
	err := writeQuota(dir, f, v)
	if errors.Is(err, os.ErrNotExist) {
		delete(c.want, dir)
		delete(c.clamped, dir)
	}
	return err
}

// forget drops member dir (its sandbox is gone).
func (c *v1Class) forget(dir string) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.want, dir)
	delete(c.clamped, dir)
}

// capTo clamps the members above capQ, then caps the parent (parent is its
// open quota file, or nil). A parent write refused because of a member the
// book does not know (one started by an earlier edge process and not
// gated since) reads the class's members from the hierarchy and retries.
func (c *v1Class) capTo(parent *os.File, capQ int64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.capQ = capQ
	for try := 0; ; try++ {
		for dir, q := range c.want {
			if !above(q, capQ) || c.clamped[dir] {
				continue
			}
			if err := writeQuota(dir, nil, capQ); err != nil {
				if errors.Is(err, os.ErrNotExist) {
					delete(c.want, dir)
					continue
				}
				return err
			}
			c.clamped[dir] = true
		}
		err := writeQuota(c.cpuDir, parent, capQ)
		if !errors.Is(err, unix.EINVAL) || try > 0 {
			return err
		}
		c.learnLocked()
	}
}

// learnLocked reads the quota of every child of the class that the book
// does not know.
func (c *v1Class) learnLocked() {
	ents, err := os.ReadDir(c.cpuDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		dir := filepath.Join(c.cpuDir, e.Name())
		if !e.IsDir() {
			continue
		}
		if _, ok := c.want[dir]; ok {
			continue
		}
		if q, err := readInt(filepath.Join(dir, "cpu.cfs_quota_us")); err == nil {
			c.want[dir] = q
		}
	}
}

// release lifts the parent's cap, then gives the clamped members their
// wanted quota back.
func (c *v1Class) release(parent *os.File) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.capQ = 0
	if err := writeQuota(c.cpuDir, parent, -1); err != nil {
		return err
	}
	var errs []error
	for dir := range c.clamped {
		if err := writeQuota(dir, nil, c.want[dir]); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		delete(c.clamped, dir)
	}
	return errors.Join(errs...)
}

// writeQuota writes quota q to the cpu directory dir's cpu.cfs_quota_us,
// through f when it is open.
func writeQuota(dir string, f *os.File, q int64) error {
	b := []byte(strconv.FormatInt(q, 10))
	if f == nil {
		return os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), b, 0)
	}
	_, err := unix.Pwrite(int(f.Fd()), b, 0)
	return err
}

// v1ClassGate is the class's runtime.CPUGate on cgroup v1: its levels are
// the cap (Set(false)) and none (Set(true)); its samples are the class's.
type v1ClassGate struct {
	*cpuGate
	class *v1Class
	capQ  int64
}

func (g *v1ClassGate) Set(full bool) error {
	if full {
		return g.class.release(g.quota)
	}
	return g.class.capTo(g.quota, g.capQ)
}

// createClassV1 makes the best-effort class's parent in every v1
// hierarchy: the lowest weight and cpu.idle in the cpu one, no limit.
func (d *v1Driver) createClass(p string) error {
	for _, h := range d.hierarchies {
		if err := os.MkdirAll(filepath.Join(h.mount, p), 0o755); err != nil {
			return err
		}
	}
	return setIdleClass(filepath.Join(d.mountOf("cpu"), p), "cpu.shares", strconv.Itoa(sharesBestEffort))
}

// setIdleClass gives the class's cpu directory dir the lowest weight
// (weightFile) and cpu.idle. A group already idle (made by an earlier
// process) refuses a weight (EINVAL: sched_group_set_shares) and keeps it.
func setIdleClass(dir, weightFile, weight string) error {
	if b, err := os.ReadFile(filepath.Join(dir, "cpu.idle")); err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	if err := os.WriteFile(filepath.Join(dir, weightFile), []byte(weight), 0); err != nil {
		return fmt.Errorf("set %s of %s: %w", weightFile, dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cpu.idle"), []byte("1"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("set cpu.idle of %s: %w", dir, err)
	}
	return nil
}

// classV1 is the class's quota book on cgroup v1 (nil on v2).
func (r *Runtime) classV1() *v1Class {
	d, ok := r.cg.(*v1Driver)
	if !ok {
		return nil
	}
	r.classMu.Lock()
	defer r.classMu.Unlock()
	if r.class == nil {
		r.class = newV1Class(filepath.Join(d.mountOf("cpu"), r.classPath()))
	}
	return r.class
}

// setCPULimit caps sandbox cgroup p at cores; a best-effort sandbox's
// quota goes through the class's book on cgroup v1.
func (r *Runtime) setCPULimit(p string, cores float64) error {
	c := r.classV1()
	if c == nil || path.Dir(p) != r.classPath() {
		return r.cg.setCPULimit(p, cores)
	}
	dir := filepath.Join(r.cg.(*v1Driver).mountOf("cpu"), p)
	if err := os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.Itoa(cfsPeriod)), 0); err != nil {
		return err
	}
	return c.write(dir, nil, int64(cores*cfsPeriod))
}

// levelQuota parses a v1 gate level.
func levelQuota(b []byte) int64 {
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

var _ runtime.CPUGate = (*v1ClassGate)(nil)
