package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// HistoryOptions size the snapshot, fork and trajectory figures (issue 4).
type HistoryOptions struct {
	Steps      int // fast-forward: cached steps re-issued; default 1000
	SnapshotMB int // snapshot: data in the writable layer; default 100
	Files      int // snapshot: number of files holding it; default 2000
	Fork       int // fork: sandboxes per fork; default 8
}

func (h *HistoryOptions) defaults() {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&h.Steps, 1000)
	def(&h.SnapshotMB, 100)
	def(&h.Files, 2000)
	def(&h.Fork, 8)
}

// runHistory measures the wanted history figures (fast-forward, snapshot,
// fork) in that order; the sandboxes they keep are deleted when all are
// done, the last created first.
func runHistory(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	o.History.defaults()
	b := &historyBench{o: o, h: o.History, c: c, rep: rep}
	defer b.deleteKept(ctx)
	for _, f := range []struct {
		name string
		fn   func(context.Context) error
	}{{"fast-forward", b.fastForward}, {"snapshot", b.snapshot}, {"fork", b.fork}} {
		if !o.want(f.name) {
			continue
		}
		if err := f.fn(ctx); err != nil {
			return err
		}
	}
	return nil
}

// historyBench is the shared state of the history figures: their options,
// client and report, and the sandboxes they keep until all are done.
type historyBench struct {
	o    Options
	h    HistoryOptions
	c    *warren.Client
	rep  *Report
	kept []string
}

// logf prints one line of progress to o.Out.
func (b *historyBench) logf(format string, a ...any) { fmt.Fprintf(b.o.Out, format+"\n", a...) }

// create creates a sandbox of req and keeps it: runHistory deletes it
// when every history figure is done.
func (b *historyBench) create(ctx context.Context, req api.CreateSandboxRequest) (*api.Sandbox, error) {
	sb, err := b.c.Create(ctx, req)
	if err != nil {
		return nil, err
	}
	b.kept = append(b.kept, sb.ID)
	return sb, nil
}

// deleteKept deletes the kept sandboxes, the last created first.
func (b *historyBench) deleteKept(ctx context.Context) {
	for i := len(b.kept) - 1; i >= 0; i-- {
		_, _ = b.c.Delete(context.WithoutCancel(ctx), b.kept[i])
	}
}

// ffStep is the i-th step of the fast-forward figure's trajectory.
func ffStep(i int) api.ExecRequest { return api.ExecRequest{Cmd: fmt.Sprintf("echo %d >> /log", i)} }

// fastForward records h.Steps steps of a trajectory live, resumes it, and
// times re-issuing every step (each must come back replayed) served by the
// API server and, as the peer, by the edge.
func (b *historyBench) fastForward(ctx context.Context) error {
	b.logf("fast-forward: recording %d steps", b.h.Steps)
	name := fmt.Sprintf("bench/ff-%d", time.Now().UnixNano())
	sb, err := b.create(ctx, api.CreateSandboxRequest{Image: "busybox", Trajectory: name})
	if err != nil {
		return err
	}
	t0 := time.Now()
	for i := 0; i < b.h.Steps; i++ {
		if _, err := b.c.Exec(ctx, sb.ID, ffStep(i)); err != nil {
			return err
		}
	}
	live := time.Since(t0)
	t0 = time.Now()
	if _, err := b.c.ResumeTrajectory(ctx, name, false); err != nil {
		return err
	}
	resume := time.Since(t0)
	ff, err := b.replayAll(ctx, sb.ID, "fast-forward")
	if err != nil {
		return err
	}
	// Peer in the same run: the same fast-forward served by the edge
	// (a resume with branch: true is not delegated to the API server).
	if _, err := b.c.ResumeTrajectory(ctx, name, true); err != nil {
		return err
	}
	viaEdge, err := b.replayAll(ctx, sb.ID, "fast-forward (edge)")
	if err != nil {
		return err
	}
	b.rep.add(fmt.Sprintf("fast-forward through %d cached steps (one client, sequential HTTP calls)", b.h.Steps), ms(ff), "ms",
		fmt.Sprintf("target ≤ 100 ms; resume (reading the log) %.1f ms; recording them live took %.0f ms; the same served by the edge (branch: true) %.0f ms: ratio %.2f×",
			ms(resume), ms(live), ms(viaEdge), ms(ff)/ms(viaEdge)))
	b.rep.add("fast-forward, per cached step", ms(ff)/float64(b.h.Steps), "ms", "")
	return nil
}

// replayAll re-issues every logged step in sandbox id, each of which must
// come back replayed (what names the pass in the error), and returns the
// time all took.
func (b *historyBench) replayAll(ctx context.Context, id, what string) (time.Duration, error) {
	t0 := time.Now()
	for i := 0; i < b.h.Steps; i++ {
		r, err := b.c.Exec(ctx, id, ffStep(i))
		if err != nil {
			return 0, err
		}
		if !r.Replayed {
			return 0, fmt.Errorf("%s: step %d was not replayed", what, i+1)
		}
	}
	return time.Since(t0), nil
}

// snapshot times a snapshot of a writable layer holding h.SnapshotMB in
// h.Files files against packing the same layer with from_sandbox, then a
// chained snapshot of a sandbox restored from it after a one-file change.
func (b *historyBench) snapshot(ctx context.Context) error {
	b.logf("snapshot: %d MiB in %d files", b.h.SnapshotMB, b.h.Files)
	sb, err := b.create(ctx, api.CreateSandboxRequest{Image: "busybox", DiskMB: int64(b.h.SnapshotMB*3 + 256)})
	if err != nil {
		return err
	}
	per := b.h.SnapshotMB * mib / b.h.Files
	fill := fmt.Sprintf("mkdir -p /data && head -c %d /dev/urandom > /seed && i=0; while [ $i -lt %d ]; do cp /seed /data/f$i; echo $i >> /data/f$i; i=$((i+1)); done; rm /seed",
		per, b.h.Files)
	if r, err := b.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: fill, Timeout: 600}); err != nil || r.ExitCode != 0 {
		return fmt.Errorf("snapshot: fill: %v %+v", err, r)
	}
	t0 := time.Now()
	snap, err := b.c.Snapshot(ctx, sb.ID, api.CreateSnapshotRequest{})
	if err != nil {
		return err
	}
	d := time.Since(t0)
	// Peer in the same run: the same writable layer packed as a named
	// layer (from_sandbox: tar, unpack, EROFS, no clone).
	t0 = time.Now()
	lname := fmt.Sprintf("bench/snap-peer-%d", time.Now().UnixNano())
	if _, err := b.c.CreateLayerFromSandbox(ctx, sb.ID, lname, 0); err != nil {
		return err
	}
	peer := time.Since(t0)
	_, _ = b.c.DeleteLayer(context.WithoutCancel(ctx), lname)
	b.rep.add(fmt.Sprintf("snapshot of a writable layer with %d MiB in %d files", b.h.SnapshotMB, b.h.Files), ms(d), "ms",
		fmt.Sprintf("target ≤ 1 s; frozen %.0f ms; diff %d MiB; the same layer packed by from_sandbox (tar, unpack, EROFS) %.0f ms: ratio %.2f×",
			snap.FrozenMs, snap.Size/mib, ms(peer), ms(d)/ms(peer)))
	// A second snapshot after a small change packs only that change.
	if _, err := b.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo more > /data/new"}); err != nil {
		return err
	}
	r1, err := b.create(ctx, api.CreateSandboxRequest{Snapshot: snap.ID})
	if err != nil {
		return err
	}
	if _, err := b.c.Exec(ctx, r1.ID, api.ExecRequest{Cmd: "echo more > /data/new"}); err != nil {
		return err
	}
	t0 = time.Now()
	if _, err := b.c.Snapshot(ctx, r1.ID, api.CreateSnapshotRequest{}); err != nil {
		return err
	}
	b.rep.add("chained snapshot of a restored sandbox after a one-file change", ms(time.Since(t0)), "ms", "packs only what changed since the restore")
	return nil
}

// fork times, best of 3, a fork of h.Fork sandboxes until every child
// answered an exec; the children are deleted after each round.
func (b *historyBench) fork(ctx context.Context) error {
	b.logf("fork: %d", b.h.Fork)
	sb, err := b.create(ctx, api.CreateSandboxRequest{Image: "busybox"})
	if err != nil {
		return err
	}
	if _, err := b.c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "mkdir -p /w && seq 1000 > /w/state"}); err != nil {
		return err
	}
	var best time.Duration
	for round := 0; round < 3; round++ {
		d, err := b.forkRound(ctx, sb.ID)
		if err != nil {
			return err
		}
		if best == 0 || d < best {
			best = d
		}
	}
	b.rep.add(fmt.Sprintf("fork of %d until all %d accept exec (best of 3)", b.h.Fork, b.h.Fork), ms(best), "ms", "target ≤ 150 ms; the source keeps running")
	return nil
}

// forkRound forks h.Fork children of sandbox id, runs `true` in each at
// once, and returns the time until all answered; then it deletes them.
func (b *historyBench) forkRound(ctx context.Context, id string) (time.Duration, error) {
	t0 := time.Now()
	fr, err := b.c.Fork(ctx, id, b.h.Fork)
	if err != nil {
		return 0, err
	}
	var wg sync.WaitGroup
	errs := make([]error, len(fr.Sandboxes))
	for i, k := range fr.Sandboxes {
		wg.Add(1)
		go func(i int, id string) {
			defer wg.Done()
			_, errs[i] = b.c.Exec(ctx, id, api.ExecRequest{Cmd: "true"})
		}(i, k.ID)
	}
	wg.Wait()
	d := time.Since(t0)
	for i, k := range fr.Sandboxes {
		_, _ = b.c.Delete(context.WithoutCancel(ctx), k.ID)
		if errs[i] != nil {
			return 0, errs[i]
		}
	}
	return d, nil
}
