package bench

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/hoststat"
	"github.com/warrenhq/warren/internal/hoststat/swaptest"
	warren "github.com/warrenhq/warren/sdk/go"
)

// The density and elasticity figures of issue 5.

func memAvailable() int64 {
	m, err := hoststat.ReadMemory()
	if err != nil {
		return 0
	}
	return m.Available
}

// settle waits for the page cache and the kernel's accounting to settle.
func settle() { time.Sleep(2 * time.Second) }

// parallel runs fn(i) for i in [0,n) from k workers and returns the
// per-call latencies and the first error.
func parallel(ctx context.Context, n, k int, fn func(ctx context.Context, i int) error) ([]time.Duration, error) {
	var next atomic.Int64
	var mu sync.Mutex
	var lats []time.Duration
	var firstErr error
	var wg sync.WaitGroup
	for w := 0; w < k; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				err := fn(ctx, i)
				d := time.Since(t0)
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil {
					lats = append(lats, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return lats, firstErr
}

func deleteAll(ctx context.Context, c *warren.Client, ids []string) {
	_, _ = parallel(context.WithoutCancel(ctx), len(ids), 16, func(ctx context.Context, i int) error {
		_, err := c.Delete(ctx, ids[i])
		return err
	})
}

// densityMemoryMB is what each density sandbox requests: the minimum, as an
// idle agent sandbox that mostly waits for its model would ask.
const densityMemoryMB = 16

// selfRSS is this process's resident memory (the bench runs its private
// warren serve in-process, so this is the edge's own memory plus the
// client's).
func selfRSS() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	var size, rss int64
	fmt.Sscan(string(b), &size, &rss)
	return rss * int64(os.Getpagesize())
}

// pidMaxFile is the host's pid limit; every thread of every sandbox takes a pid.
const pidMaxFile = "/proc/sys/kernel/pid_max"

// raisePidMax lifts kernel.pid_max to at least want (systemd's default on
// 64-bit hosts is 4,194,304; the kernel's own is 32,768, which a few
// thousand sandboxes of several threads each exhaust) and returns the
// value it found and a function that puts it back.
func raisePidMax(want int64) (int64, func()) {
	b, err := os.ReadFile(pidMaxFile)
	if err != nil {
		return 0, func() {}
	}
	var old int64
	fmt.Sscan(string(b), &old)
	if old >= want || os.WriteFile(pidMaxFile, []byte(fmt.Sprint(want)), 0o644) != nil {
		return old, func() {}
	}
	return old, func() { _ = os.WriteFile(pidMaxFile, []byte(fmt.Sprint(old)), 0o644) }
}

// density creates idle busybox sandboxes (each with a shell session used
// once) until admission refuses or DensityMax are live.
func density(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	fmt.Fprintf(o.Out, "density: up to %d idle sandboxes...\n", o.DensityMax)
	oldPidMax, restore := raisePidMax(4 << 20)
	defer restore()
	runtime.GC()
	settle()
	before, rssBefore := memAvailable(), selfRSS()
	t0 := time.Now()
	ids, reason := densityFill(ctx, o, c)
	took := time.Since(t0)
	defer densityCleanup(ctx, o, c, rep, ids)
	runtime.GC()
	settle()
	after, rssAfter := memAvailable(), selfRSS()
	n := len(ids)
	if n == 0 {
		return fmt.Errorf("no sandbox created: %s", reason)
	}
	var lats []time.Duration
	for i := 0; i < 300; i++ {
		id := ids[rand.IntN(n)]
		t := time.Now()
		if _, err := c.Exec(ctx, id, api.ExecRequest{Cmd: "true", Session: "s"}); err != nil {
			return err
		}
		lats = append(lats, time.Since(t))
	}
	p := percentiles(lats)
	note := fmt.Sprintf("busybox, cpu 0.25, %d MiB limit (bench server overcommit CPU %d×, memory %d×), one session each; kernel.pid_max %d raised to %d for the run; created in %.1f s",
		densityMemoryMB, BenchCPUOvercommit, BenchMemoryOvercommit, oldPidMax, 4<<20, took.Seconds())
	if reason != "" {
		note += "; stopped by: " + reason
	} else {
		note += fmt.Sprintf("; stopped at --density-max %d (target ≥ 5,000)", o.DensityMax)
	}
	rep.add("density: live idle sandboxes", float64(n), "sandboxes", note)
	rep.add("density: host memory per sandbox", float64(before-after)/float64(n)/(1<<20), "MiB", "MemAvailable delta / count (kernel, agents, shells and warren itself); target ≤ 4 MiB")
	rep.add("density: warren's own memory per sandbox", float64(rssAfter-rssBefore)/float64(n)/(1<<10), "KiB", "RSS growth of the bench process (in-process warren serve: apiserver, NATS, edge) / count; part of the figure above")
	rep.add("density: exec p99 on a random live sandbox", ms(p.p99), "ms", fmt.Sprintf("p50 %.2f ms, 300 samples", ms(p.p50)))
	return nil
}

// densityFill creates up to o.DensityMax density sandboxes from 8 clients,
// each with its shell session "s" started by one exec, until the first
// create or session fails: the sandboxes created, and that failure ("" if
// none).
func densityFill(ctx context.Context, o Options, c *warren.Client) (ids []string, reason string) {
	var mu sync.Mutex
	var refused atomic.Bool
	_, _ = parallel(ctx, o.DensityMax, 8, func(ctx context.Context, i int) error {
		if refused.Load() {
			return nil
		}
		sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.25, MemoryMB: densityMemoryMB, Labels: map[string]string{"bench": "density"}})
		if err != nil {
			if refused.CompareAndSwap(false, true) {
				mu.Lock()
				reason = err.Error()
				mu.Unlock()
			}
			return err
		}
		mu.Lock()
		ids = append(ids, sb.ID)
		if len(ids)%500 == 0 {
			fmt.Fprintf(o.Out, "density: %d live, %.0f MiB available\n", len(ids), float64(memAvailable())/(1<<20))
		}
		mu.Unlock()
		if _, err = c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "cd /tmp", Session: "s"}); err != nil && refused.CompareAndSwap(false, true) {
			mu.Lock()
			reason = "session: " + err.Error()
			mu.Unlock()
		}
		return err
	})
	return ids, reason
}

// densityCleanup deletes the density sandboxes ids and reports as a
// result any sandbox labelled for density still live after that.
func densityCleanup(ctx context.Context, o Options, c *warren.Client, rep *Report, ids []string) {
	fmt.Fprintf(o.Out, "density: deleting %d...\n", len(ids))
	deleteAll(ctx, c, ids)
	if left, err := c.List(context.WithoutCancel(ctx), warren.ListOptions{Labels: map[string]string{"bench": "density"}}); err == nil {
		live := 0
		for _, sb := range left {
			if sb.State != api.StateStopped && sb.State != api.StateFailed {
				live++
			}
		}
		if live > 0 {
			rep.add("density: cleanup", float64(live), "sandboxes", "still live after deleting")
		}
	}
}

// burst creates BurstCount sandboxes with BurstClients clients, without and
// with a warm pool of BurstPool.
func burst(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	spec := api.CreateSandboxRequest{Image: "busybox", CPU: 0.25, MemoryMB: 16}
	fmt.Fprintf(o.Out, "burst: %d creates, %d clients, no pool...\n", o.BurstCount, o.BurstClients)
	all, lat, _, err := burstCreates(ctx, o, c, spec)
	if err != nil {
		return err
	}
	rep.add("burst without pool: all ready", all.Seconds(), "s", fmt.Sprintf("%d creates, %d clients; create p50 %.1f ms, p99 %.1f ms", o.BurstCount, o.BurstClients, ms(lat.p50), ms(lat.p99)))

	fmt.Fprintf(o.Out, "burst: filling a pool of %d...\n", o.BurstPool)
	pr := api.PoolRequest{Name: "bench-burst", Image: spec.Image, CPU: spec.CPU, MemoryMB: spec.MemoryMB, Size: o.BurstPool}
	if _, err := c.CreatePool(ctx, pr); err != nil {
		return err
	}
	defer c.DeletePool(context.WithoutCancel(ctx), pr.Name)
	fill, err := waitPoolFilled(ctx, c, pr.Name, o.BurstPool)
	if err != nil {
		return err
	}
	settle()
	fmt.Fprintf(o.Out, "burst: %d creates, %d clients, pool of %d...\n", o.BurstCount, o.BurstClients, o.BurstPool)
	all2, lat2, fromPool, err := burstCreates(ctx, o, c, spec)
	if err != nil {
		return err
	}
	rep.add("burst with pool: all ready", all2.Seconds(), "s", fmt.Sprintf("pool %d (filled in %.1f s), %d served from it; create p50 %.1f ms, p99 %.1f ms", o.BurstPool, fill.Seconds(), fromPool, ms(lat2.p50), ms(lat2.p99)))
	warmPoolClaims(ctx, c, rep, pr, spec)
	return nil
}

// burstCreates creates o.BurstCount sandboxes of spec from o.BurstClients
// clients and deletes them: the time until all were created, the creates'
// latencies, how many came from a pool, and the first create's error.
func burstCreates(ctx context.Context, o Options, c *warren.Client, spec api.CreateSandboxRequest) (time.Duration, latencies, int, error) {
	ids := make([]string, o.BurstCount)
	var fromPool atomic.Int64
	t0 := time.Now()
	lats, err := parallel(ctx, o.BurstCount, o.BurstClients, func(ctx context.Context, i int) error {
		sb, err := c.Create(ctx, spec)
		if err != nil {
			return err
		}
		ids[i] = sb.ID
		if sb.Pool != "" {
			fromPool.Add(1)
		}
		return nil
	})
	all := time.Since(t0)
	deleteAll(ctx, c, nonEmpty(ids))
	return all, percentiles(lats), int(fromPool.Load()), err
}

// nonEmpty is the ids of ids that are not empty, in order (a new slice).
func nonEmpty(ids []string) []string {
	var live []string
	for _, id := range ids {
		if id != "" {
			live = append(live, id)
		}
	}
	return live
}

// waitPoolFilled polls pool name every 200 ms until size of its sandboxes
// are ready, and returns how long that took; an error after 10 minutes.
func waitPoolFilled(ctx context.Context, c *warren.Client, name string, size int) (time.Duration, error) {
	tf := time.Now()
	for {
		p, err := c.Pool(ctx, name)
		if err != nil {
			return 0, err
		}
		if p.Ready >= size {
			return time.Since(tf), nil
		}
		if time.Since(tf) > 10*time.Minute {
			return 0, fmt.Errorf("pool never filled: %+v", p)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// warmPoolClaims is the pool's own latency with little contention: pool
// pr resized to 20, then 20 sequential creates of spec claiming from it.
// It measures nothing when the resize fails.
func warmPoolClaims(ctx context.Context, c *warren.Client, rep *Report, pr api.PoolRequest, spec api.CreateSandboxRequest) {
	if _, err := c.CreatePool(ctx, api.PoolRequest{Name: pr.Name, Image: pr.Image, CPU: pr.CPU, MemoryMB: pr.MemoryMB, Size: 20}); err != nil {
		return
	}
	for t := time.Now(); time.Since(t) < time.Minute; time.Sleep(100 * time.Millisecond) {
		if p, err := c.Pool(ctx, pr.Name); err == nil && p.Ready >= 20 {
			break
		}
	}
	settle()
	var lats []time.Duration
	var ids []string
	for i := 0; i < 20; i++ {
		t := time.Now()
		sb, err := c.Create(ctx, spec)
		if err != nil {
			break
		}
		if sb.Pool != "" {
			lats = append(lats, time.Since(t))
		}
		ids = append(ids, sb.ID)
	}
	deleteAll(ctx, c, ids)
	p := percentiles(lats)
	rep.add("warm-pool create p50 (sequential)", ms(p.p50), "ms", fmt.Sprintf("p99 %.1f ms over %d claims; target ≤ 5 ms", ms(p.p99), len(lats)))
}

// selfCPU is the CPU time this process used so far.
func selfCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sandboxCPU is the CPU time every sandbox under the cgroup parent used so
// far (cgroup v1 cpuacct; 0 where unreadable).
func sandboxCPU(parent string) time.Duration {
	for _, p := range []string{"/sys/fs/cgroup/cpuacct/" + parent + "/cpuacct.usage", "/sys/fs/cgroup/cpu,cpuacct/" + parent + "/cpuacct.usage"} {
		if b, err := os.ReadFile(p); err == nil {
			var ns int64
			fmt.Sscan(string(b), &ns)
			return time.Duration(ns)
		}
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/" + parent + "/cpu.stat"); err == nil {
		var us int64
		fmt.Sscanf(string(b), "usage_usec %d", &us)
		return time.Duration(us) * time.Microsecond
	}
	return 0
}

// classCPU is the CPU time of the best-effort sandboxes ids: their class's
// parent cgroup where the node has one (the cpu controller on cgroup v2),
// else the sum of their own cgroups under parent (cgroup v1: the layout
// is flat, and a class path read there would say 0).
func classCPU(parent string, ids []string) time.Duration {
	class := parent + "/besteffort"
	for _, dir := range []string{"/sys/fs/cgroup/cpuacct/", "/sys/fs/cgroup/cpu,cpuacct/", "/sys/fs/cgroup/"} {
		if _, err := os.Stat(dir + class); err == nil {
			return sandboxCPU(class)
		}
	}
	var d time.Duration
	for _, id := range ids {
		d += sandboxCPU(parent + "/" + id)
	}
	return d
}

// fncallFigures measures the FnCall tier.
func fncallFigures(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	cases := []struct {
		name, target string
		req          api.FnCallRequest
	}{
		{"fncall `echo`", "; target ≥ 1,000/s, p50 ≤ 3 ms", api.FnCallRequest{Image: "busybox", Cmd: "echo hi"}},
		{"fncall `python3 -c 'print(1)'` on debian:12", "", api.FnCallRequest{Image: "debian:12", Argv: []string{"python3", "-c", "print(1)"}}},
	}
	for _, tc := range cases {
		// Warm up (the first call makes the workers).
		if _, err := c.FnCall(ctx, tc.req); err != nil {
			rep.add(tc.name, 0, "tasks/s", "not measured: "+err.Error())
			continue
		}
		fmt.Fprintf(o.Out, "%s, %d clients, %v...\n", tc.name, o.Concurrency, o.Duration)
		var tasks atomic.Int64
		task := func(ctx context.Context) error {
			r, err := c.FnCall(ctx, tc.req)
			if err == nil && r.ExitCode != 0 {
				err = fmt.Errorf("exit %d: %s", r.ExitCode, r.Stderr)
			}
			tasks.Add(1)
			return err
		}
		// Steady state: the shape's workers are started on demand as the
		// clients arrive (each a sandbox create); let that happen first.
		warm := o
		warm.Duration = min(o.Duration/4, 3*time.Second)
		if _, _, err := throughput(ctx, warm, task); err != nil {
			rep.add(tc.name, 0, "tasks/s", "failed: "+err.Error())
			continue
		}
		tasks.Store(0)
		self0, sb0 := selfCPU(), sandboxCPU(o.cgroupParent)
		rate, lat, err := throughput(ctx, o, task)
		self1, sb1 := selfCPU(), sandboxCPU(o.cgroupParent)
		if err != nil {
			rep.add(tc.name, 0, "tasks/s", "failed: "+err.Error())
			continue
		}
		n := float64(max(tasks.Load(), 1))
		rep.add(tc.name, rate, "tasks/s", fmt.Sprintf("%d clients, after a warm-up at the same load; p50 %.1f ms, p99 %.1f ms; CPU per task %.2f ms in the bench process (client, HTTP, apiserver, NATS, edge) + %.2f ms in the sandboxes (agent, shell, task, reset)%s",
			o.Concurrency, ms(lat.p50), ms(lat.p99), ms(self1-self0)/n, ms(sb1-sb0)/n, tc.target))
		var lats []time.Duration
		for i := 0; i < 200; i++ {
			t := time.Now()
			if _, err := c.FnCall(ctx, tc.req); err != nil {
				break
			}
			lats = append(lats, time.Since(t))
		}
		p := percentiles(lats)
		rep.add(tc.name+" one client", ms(p.p50), "ms p50", fmt.Sprintf("p99 %.1f ms, sequential", ms(p.p99)))
	}
	return nil
}

// pauseFigures pauses PauseCount sandboxes that each hold PauseHoldMB of
// anonymous memory (job-level pause) and measures the memory returned and
// resume-to-first-exec.
func pauseFigures(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	swapNote, swapOff := pauseSwapOn(o)
	defer swapOff()
	fmt.Fprintf(o.Out, "pause: %d sandboxes holding %d MiB each...\n", o.PauseCount, o.PauseHoldMB)
	ids, err := pauseHolders(ctx, o, c)
	defer func() { deleteAll(ctx, c, nonEmpty(ids)) }()
	if err != nil {
		return err
	}
	settle()
	before := memAvailable()
	t0 := time.Now()
	res, err := c.PauseMatching(ctx, map[string]string{"job": "bench-pause"})
	if err != nil {
		return err
	}
	took := time.Since(t0)
	settle()
	after := memAvailable()
	rep.add("pause: host memory returned", float64(after-before)/(1<<20), "MiB",
		fmt.Sprintf("%d sandboxes × %d MiB held, job-level pause of %d in %.1f s; %s", o.PauseCount, o.PauseHoldMB, len(res.Sandboxes), took.Seconds(), swapNote))
	resumed, err := pauseResumes(ctx, o, c, ids)
	if err != nil {
		return err
	}
	reportPauseResumes(o, rep, resumed[0], resumed[1])
	return nil
}

// pauseSwapOn turns swap on for the pause figure (scripts/swap.sh, sized
// for the memory the holders keep): the note that says whether it is on,
// and a function that turns it off again (nothing to do when it is not on).
func pauseSwapOn(o Options) (note string, off func()) {
	off = func() {}
	script, err := swaptest.Script()
	if err == nil {
		size := o.PauseCount*o.PauseHoldMB*5/4 + 1024
		if out, err2 := exec.Command(script, "up", fmt.Sprint(size)).CombinedOutput(); err2 != nil {
			err = fmt.Errorf("%v: %s", err2, strings.TrimSpace(string(out)))
		} else {
			down := exec.Command(script, "down")
			off = func() { _ = down.Run() }
		}
	}
	if err != nil {
		return "no swap (" + err.Error() + "): only page cache can be returned", off
	}
	return "swap on (scripts/swap.sh)", off
}

// pauseHolders creates o.PauseCount sandboxes of the job "bench-pause"
// from 4 clients, each with a background shell holding o.PauseHoldMB of
// memory, and waits until every holder is ready. The ids are indexed by
// sandbox ("" where a create failed), with the first error.
func pauseHolders(ctx context.Context, o Options, c *warren.Client) ([]string, error) {
	ids := make([]string, o.PauseCount)
	// The holder keeps the string in its shell's heap; on a line in /tmp/go
	// it measures it (reading every page) and writes the length to /tmp/len.
	hold := fmt.Sprintf(`x=$(head -c %d /dev/zero | tr '\0' a); mkfifo /tmp/go; echo ready >/tmp/ready; read l </tmp/go; echo ${#x} >/tmp/len.t; mv /tmp/len.t /tmp/len; sleep 100000`, o.PauseHoldMB<<20)
	_, err := parallel(ctx, o.PauseCount, 4, func(ctx context.Context, i int) error {
		sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: int64(o.PauseHoldMB*2 + 32), Labels: map[string]string{"job": "bench-pause"}})
		if err != nil {
			return err
		}
		ids[i] = sb.ID
		if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: hold, Background: true}); err != nil {
			return err
		}
		for t := time.Now(); time.Since(t) < time.Minute; time.Sleep(50 * time.Millisecond) {
			r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "cat /tmp/ready 2>/dev/null"})
			if err != nil {
				return err
			}
			if r.Stdout == "ready\n" {
				return nil
			}
		}
		return fmt.Errorf("memory holder in %s not ready", sb.ID)
	})
	return ids, err
}

// resumeSamples are the pause figure's timings of one kind of resume: the
// explicit resume, the first exec after it, and the step that touches all
// the held memory.
type resumeSamples struct{ resume, first, touch []time.Duration }

// pauseResumes resumes the paused sandboxes ids one after another, every
// other one without prefetch (the same-run baseline), then runs the first
// exec, then a step that touches all the held memory (the holder measures
// its string: every page is read). Index 0 holds the samples with
// prefetch, 1 those without.
func pauseResumes(ctx context.Context, o Options, c *warren.Client, ids []string) ([2]resumeSamples, error) {
	var res [2]resumeSamples
	noPrefetch := false
	for i, id := range ids {
		k := i % 2 // 0: prefetch, 1: none
		opts := api.ResumeRequest{}
		if k == 1 {
			opts.Prefetch = &noPrefetch
		}
		t := time.Now()
		if _, err := c.ResumeWith(ctx, id, opts); err != nil {
			return res, err
		}
		res[k].resume = append(res[k].resume, time.Since(t))
		t = time.Now()
		if _, err := c.Exec(ctx, id, api.ExecRequest{Cmd: "true"}); err != nil {
			return res, err
		}
		res[k].first = append(res[k].first, time.Since(t))
		t = time.Now()
		r, err := c.Exec(ctx, id, api.ExecRequest{Cmd: `echo >/tmp/go; until [ -s /tmp/len ]; do usleep 500; done; cat /tmp/len`})
		if err != nil {
			return res, err
		}
		if strings.TrimSpace(r.Stdout) != fmt.Sprint(o.PauseHoldMB<<20) {
			return res, fmt.Errorf("touch step in %s: exit %d, signal %q, %q %q", id, r.ExitCode, r.Signal, r.Stdout, r.Stderr)
		}
		res[k].touch = append(res[k].touch, time.Since(t))
	}
	return res, nil
}

// reportPauseResumes adds the resume figures: resume-to-first-exec and
// the touch of all held memory, with prefetch (p) and without (q).
func reportPauseResumes(o Options, rep *Report, p, q resumeSamples) {
	sum := func(a, b []time.Duration) latencies {
		out := make([]time.Duration, len(a))
		for i := range a {
			out[i] = a[i] + b[i]
		}
		return percentiles(out)
	}
	fp, fq := sum(p.resume, p.first), sum(q.resume, q.first)
	rep.add("pause: resume-to-first-exec p50, with prefetch", ms(fp.p50), "ms",
		fmt.Sprintf("explicit resume (p50 %.1f ms) then `true` (p50 %.1f ms); p99 %.0f ms", ms(percentiles(p.resume).p50), ms(percentiles(p.first).p50), ms(fp.p99)))
	rep.add("pause: resume-to-first-exec p50, without prefetch", ms(fq.p50), "ms",
		fmt.Sprintf("same-run baseline: resume p50 %.1f ms, `true` p50 %.1f ms; p99 %.0f ms", ms(percentiles(q.resume).p50), ms(percentiles(q.first).p50), ms(fq.p99)))
	tp, tq := percentiles(p.touch), percentiles(q.touch)
	rep.add("pause: touch all held memory after resume, with prefetch", ms(tp.p50), "ms p50",
		fmt.Sprintf("%d MiB read by the holder right after the first exec; p99 %.0f ms; %d sandboxes", o.PauseHoldMB, ms(tp.p99), len(p.touch)))
	rep.add("pause: touch all held memory after resume, without prefetch", ms(tq.p50), "ms p50",
		fmt.Sprintf("same-run baseline (resume with prefetch: false); p99 %.0f ms; %d sandboxes; ratio with/without %.2f", ms(tq.p99), len(q.touch), float64(tp.p50)/float64(tq.p50)))
}

// interference runs a fixed CPU-bound step in a latency sandbox on an idle
// node, then with best-effort neighbours saturating every core, and
// reports the slowdown; a best-effort prober under the same load is the
// contrast.
func interference(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	capNote := "best-effort class cap off"
	if o.BestEffortCap >= 0 {
		capNote = fmt.Sprintf("best-effort class cap %g core", cmp.Or(o.BestEffortCap, 0.1))
	}
	var ids []string
	defer func() { deleteAll(ctx, c, ids) }()
	lat, err := interferenceSandbox(ctx, c, api.PriorityLatency, nil)
	if err != nil {
		return err
	}
	ids = append(ids, lat)
	be, err := interferenceSandbox(ctx, c, api.PriorityBestEffort, nil)
	if err != nil {
		return err
	}
	ids = append(ids, be)
	fmt.Fprintln(o.Out, "interference: idle baseline...")
	idle, err := interferenceMedian(ctx, c, lat)
	if err != nil {
		return err
	}
	idleBE, err := interferenceMedian(ctx, c, be)
	if err != nil {
		return err
	}
	fmt.Fprintln(o.Out, "interference: with best-effort neighbours saturating the CPU...")
	noise, err := interferenceNoise(ctx, c)
	ids = append(ids, noise...)
	if err != nil {
		return err
	}
	time.Sleep(time.Second)
	c0, t0 := classCPU(o.cgroupParent, noise), time.Now()
	loaded, err := interferenceMedian(ctx, c, lat)
	if err != nil {
		return err
	}
	beUsed := (classCPU(o.cgroupParent, noise) - c0).Seconds() / time.Since(t0).Seconds()
	loadedBE, err := interferenceMedian(ctx, c, be)
	if err != nil {
		return err
	}
	slow := (float64(loaded.d)/float64(idle.d) - 1) * 100
	slowBE := (float64(loadedBE.d)/float64(idleBE.d) - 1) * 100
	rep.add("interference: latency sandbox slowdown", slow, "%", fmt.Sprintf("step %.0f ms idle, %.0f ms next to 4 best-effort sandboxes × 2 spinning processes; the step's own CPU %.0f / %.0f ms, run-queue wait %.0f / %.0f ms (medians, /proc/self/schedstat); the best-effort class used %.3f cores meanwhile; %s; DSec 17.3 %%, target ≤ 10 %%; load average %s",
		ms(idle.d), ms(loaded.d), ms(idle.cpu), ms(loaded.cpu), ms(idle.wait), ms(loaded.wait), beUsed, capNote, loadAvg()))
	rep.add("interference: best-effort sandbox slowdown (contrast)", slowBE, "%", fmt.Sprintf("the same step in a best-effort sandbox: %.0f ms → %.0f ms", ms(idleBE.d), ms(loadedBE.d)))
	// The same, paired: the neighbours' spinners are stopped (SIGSTOP)
	// and continued around alternate steps, so that both halves see the
	// same host (the figures above take the baseline first; on a host
	// shared with other jobs the load moves between them by more than
	// the effect).
	if err := interferencePaired(ctx, o, c, rep, lat, noise, capNote); err != nil {
		return err
	}
	deleteAll(ctx, c, ids[2:])
	ids = ids[:2]
	if o.InterferenceIdle <= 0 {
		return nil
	}
	return interferenceWaiting(ctx, o, c, rep, lat, idle.d)
}

// interferenceStepCmd is the interference figure's fixed CPU-bound step.
// It reads its shell's /proc/self/schedstat before and after the loop
// and prints its own CPU time and its run-queue wait (time runnable but
// not running), in ns.
const interferenceStepCmd = `read c0 w0 x < /proc/self/schedstat; i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; read c1 w1 x < /proc/self/schedstat; echo $((c1-c0)) $((w1-w0))`

// interferenceSandbox creates a sandbox of the interference figure with
// priority prio and labels, and returns its id. Every sandbox here is
// always_on: the neighbours must stay busy between operations (the CPU
// gate's own figure follows).
func interferenceSandbox(ctx context.Context, c *warren.Client, prio string, labels map[string]string) (string, error) {
	sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 1, MemoryMB: 64, Priority: prio, Labels: labels, AlwaysOn: true})
	if err != nil {
		return "", err
	}
	return sb.ID, nil
}

// interferenceNoise creates the 4 best-effort neighbours, each running two
// spinning processes in the background: the ids created, also those
// created before an error.
func interferenceNoise(ctx context.Context, c *warren.Client) ([]string, error) {
	var noise []string
	for i := 0; i < 4; i++ {
		id, err := interferenceSandbox(ctx, c, api.PriorityBestEffort, map[string]string{"bench": "noise"})
		if err != nil {
			return noise, err
		}
		noise = append(noise, id)
		// The spinners' pids go to /tmp/spin (the paired figure stops
		// and continues them).
		if _, err := c.Exec(ctx, id, api.ExecRequest{Cmd: "echo $$ > /tmp/spin; while :; do :; done & echo $! >> /tmp/spin; while :; do :; done", Background: true}); err != nil {
			return noise, err
		}
	}
	return noise, nil
}

// interferenceStep runs the step once in sandbox id: its time as the agent
// measured it, and its own CPU time and run-queue wait.
func interferenceStep(ctx context.Context, c *warren.Client, id string) (stepStat, error) {
	r, err := c.Exec(ctx, id, api.ExecRequest{Cmd: interferenceStepCmd})
	if err != nil {
		return stepStat{}, err
	}
	st := stepStat{d: time.Duration(r.DurationMs * float64(time.Millisecond))}
	var cpu, wait int64
	if _, err := fmt.Sscan(r.Stdout, &cpu, &wait); err != nil || r.ExitCode != 0 {
		return st, fmt.Errorf("interference: step: exit %d, output %q %q", r.ExitCode, r.Stdout, r.Stderr)
	}
	st.cpu, st.wait = time.Duration(cpu), time.Duration(wait)
	return st, nil
}

// interferenceMedian runs the step 7 times in sandbox id and returns the
// median of each of its figures.
func interferenceMedian(ctx context.Context, c *warren.Client, id string) (stepStat, error) {
	var ss []stepStat
	for i := 0; i < 7; i++ {
		st, err := interferenceStep(ctx, c, id)
		if err != nil {
			return stepStat{}, err
		}
		ss = append(ss, st)
	}
	return medianStat(ss), nil
}

// stepStat is one interference step: its time as the agent measured it,
// and its shell's own CPU time and run-queue wait.
type stepStat struct{ d, cpu, wait time.Duration }

// medianStat takes the median of each field.
func medianStat(ss []stepStat) stepStat {
	var d, c, w []time.Duration
	for _, s := range ss {
		d, c, w = append(d, s.d), append(c, s.cpu), append(w, s.wait)
	}
	return stepStat{d: percentiles(d).p50, cpu: percentiles(c).p50, wait: percentiles(w).p50}
}

// interferenceWaiting is the CPU gate's figure: many waiting sandboxes,
// each with a busy background process, next to the latency sandbox; with
// the gate (default) and without it (always_on): the latency step's
// slowdown against the empty node, exec `true` p50, and the CPU the
// waiting sandboxes took.
func interferenceWaiting(ctx context.Context, o Options, c *warren.Client, rep *Report, lat string, idle time.Duration) error {
	const execs = 200
	execP50 := func() (time.Duration, error) {
		var ds []time.Duration
		for i := 0; i < execs; i++ {
			t0 := time.Now()
			if _, err := c.Exec(ctx, lat, api.ExecRequest{Cmd: "true"}); err != nil {
				return 0, err
			}
			ds = append(ds, time.Since(t0))
		}
		return percentiles(ds).p50, nil
	}
	empty, err := execP50()
	if err != nil {
		return err
	}
	zero := 0.0
	var steps, trues [2]time.Duration
	var used [2]float64
	for k, always := range []bool{false, true} {
		fmt.Fprintf(o.Out, "interference: %d waiting sandboxes with a busy background process, always_on %v...\n", o.InterferenceIdle, always)
		noise := make([]string, o.InterferenceIdle)
		_, err := parallel(ctx, len(noise), 8, func(ctx context.Context, i int) error {
			// idle_cpu 0: 200 × the default 0.05 would be 10 cores, five
			// times this host.
			sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 16, AlwaysOn: always,
				IdleCPU: &zero, Labels: map[string]string{"bench": "waiting"}})
			if err != nil {
				return err
			}
			noise[i] = sb.ID
			_, err = c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "while :; do :; done", Background: true})
			return err
		})
		if err != nil {
			deleteAll(ctx, c, slices.DeleteFunc(noise, func(s string) bool { return s == "" }))
			return err
		}
		time.Sleep(2 * time.Second)
		u0, t0 := sandboxCPU(o.cgroupParent), time.Now()
		st, err := interferenceMedian(ctx, c, lat)
		used[k] = (sandboxCPU(o.cgroupParent) - u0).Seconds() / time.Since(t0).Seconds()
		if err == nil {
			trues[k], err = execP50()
		}
		deleteAll(ctx, c, noise)
		if err != nil {
			return err
		}
		steps[k] = st.d
		name, note := "with the CPU gate", "idle_cpu 0 each (frozen between operations)"
		if always {
			name, note = "without the CPU gate", "always_on"
		}
		rep.add(fmt.Sprintf("interference: latency step next to %d waiting busy sandboxes, %s", o.InterferenceIdle, name), (float64(st.d)/float64(idle)-1)*100, "%",
			fmt.Sprintf("step %.0f ms against %.0f ms on the idle node (run-queue wait %.0f ms); %s; all sandboxes used %.2f cores meanwhile", ms(st.d), ms(idle), ms(st.wait), note, used[k]))
		rep.add(fmt.Sprintf("interference: exec `true` p50 next to %d waiting busy sandboxes, %s", o.InterferenceIdle, name), ms(trues[k]), "ms",
			fmt.Sprintf("%d execs on the latency sandbox; %.3f ms on the empty node", execs, ms(empty)))
	}
	// The empty node again, after both: the host's other load moves the
	// baseline by more than the effect between the start and the end.
	after, err := interferenceMedian(ctx, c, lat)
	if err != nil {
		return err
	}
	trueAfter, err := execP50()
	if err != nil {
		return err
	}
	rep.add(fmt.Sprintf("interference: latency step with the CPU gate against without, %d waiting busy sandboxes", o.InterferenceIdle), (float64(steps[0])/float64(steps[1])-1)*100, "%",
		fmt.Sprintf("%.0f ms gated, %.0f ms always_on, same run; goal within 5 %% of an empty node (%.0f ms before, %.0f ms after; exec `true` %.3f / %.3f ms)", ms(steps[0]), ms(steps[1]), ms(idle), ms(after.d), ms(empty), ms(trueAfter)))
	rep.add(fmt.Sprintf("interference: exec `true` p50 with the CPU gate minus without, %d waiting busy sandboxes", o.InterferenceIdle), ms(trues[0]-trues[1]), "ms",
		fmt.Sprintf("%.3f ms gated, %.3f ms always_on, %.3f ms empty node; goal ≤ 0.05 ms", ms(trues[0]), ms(trues[1]), ms(empty)))
	rep.add(fmt.Sprintf("interference: host CPU harvested from %d waiting busy sandboxes", o.InterferenceIdle), used[1]-used[0], "cores",
		fmt.Sprintf("all sandboxes used %.2f cores always_on, %.2f gated, during the latency steps", used[1], used[0]))
	return nil
}

// interferencePaired times the latency step with the noise sandboxes'
// spinners stopped and running, alternately (pairs), and reports the
// median of the per-pair slowdowns and the step's run-queue wait in both
// halves.
func interferencePaired(ctx context.Context, o Options, c *warren.Client, rep *Report, lat string, noise []string, capNote string) error {
	signal := func(sig string) error {
		for _, id := range noise {
			r, err := c.Exec(ctx, id, api.ExecRequest{Cmd: "kill -" + sig + " $(cat /tmp/spin)"})
			if err != nil {
				return err
			}
			if r.ExitCode != 0 {
				return fmt.Errorf("interference: kill -%s in %s: exit %d %s", sig, id, r.ExitCode, r.Stderr)
			}
		}
		return nil
	}
	const pairs = 9
	var beCPU, beWall time.Duration
	var quiet, busy []stepStat
	var ratios []float64
	for i := 0; i < pairs; i++ {
		if err := signal("STOP"); err != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
		q, err := interferenceStep(ctx, c, lat)
		if err != nil {
			return err
		}
		if err := signal("CONT"); err != nil {
			return err
		}
		time.Sleep(300 * time.Millisecond)
		c0, t0 := classCPU(o.cgroupParent, noise), time.Now()
		b, err := interferenceStep(ctx, c, lat)
		if err != nil {
			return err
		}
		beCPU, beWall = beCPU+classCPU(o.cgroupParent, noise)-c0, beWall+time.Since(t0)
		quiet, busy = append(quiet, q), append(busy, b)
		ratios = append(ratios, float64(b.d)/float64(q.d))
	}
	slices.Sort(ratios)
	mq, mb := medianStat(quiet), medianStat(busy)
	rep.add("interference: latency sandbox slowdown, paired", (ratios[pairs/2]-1)*100, "%",
		fmt.Sprintf("median of %d pairs (neighbours' spinners stopped, then running); step p50 %.0f ms quiet, %.0f ms busy; own CPU %.0f / %.0f ms, run-queue wait %.0f / %.0f ms; the best-effort class used %.3f cores during the busy steps; pair slowdowns %.0f…%.0f %%; %s; load average %s",
			pairs, ms(mq.d), ms(mb.d), ms(mq.cpu), ms(mb.cpu), ms(mq.wait), ms(mb.wait), beCPU.Seconds()/beWall.Seconds(), (ratios[0]-1)*100, (ratios[pairs-1]-1)*100, capNote, loadAvg()))
	if nodes, err := c.Nodes(ctx); err == nil && len(nodes) > 0 {
		el := nodes[0].Elastic
		rep.add("interference: best-effort class caps applied", float64(el.ClassCaps), "caps", fmt.Sprintf("%d releases; %s", el.ClassReleases, capNote))
	}
	return nil
}

// loadAvg is the host's 1, 5 and 15 minute load average.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
