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

func runHistory(ctx context.Context, o Options, c *warren.Client, rep *Report) error {
	o.History.defaults()
	h := o.History
	logf := func(format string, a ...any) { fmt.Fprintf(o.Out, format+"\n", a...) }
	if o.want("fast-forward") {
		logf("fast-forward: recording %d steps", h.Steps)
		name := fmt.Sprintf("bench/ff-%d", time.Now().UnixNano())
		sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", Trajectory: name})
		if err != nil {
			return err
		}
		defer c.Delete(context.WithoutCancel(ctx), sb.ID)
		op := func(i int) api.ExecRequest { return api.ExecRequest{Cmd: fmt.Sprintf("echo %d >> /log", i)} }
		t0 := time.Now()
		for i := 0; i < h.Steps; i++ {
			if _, err := c.Exec(ctx, sb.ID, op(i)); err != nil {
				return err
			}
		}
		live := time.Since(t0)
		t0 = time.Now()
		if _, err := c.ResumeTrajectory(ctx, name, false); err != nil {
			return err
		}
		resume := time.Since(t0)
		// replayAll re-issues every logged step, each of which must come
		// back replayed.
		replayAll := func(what string) (time.Duration, error) {
			t0 := time.Now()
			for i := 0; i < h.Steps; i++ {
				r, err := c.Exec(ctx, sb.ID, op(i))
				if err != nil {
					return 0, err
				}
				if !r.Replayed {
					return 0, fmt.Errorf("%s: step %d was not replayed", what, i+1)
				}
			}
			return time.Since(t0), nil
		}
		ff, err := replayAll("fast-forward")
		if err != nil {
			return err
		}
		// Peer in the same run: the same fast-forward served by the edge
		// (a resume with branch: true is not delegated to the API server).
		if _, err := c.ResumeTrajectory(ctx, name, true); err != nil {
			return err
		}
		viaEdge, err := replayAll("fast-forward (edge)")
		if err != nil {
			return err
		}
		rep.add(fmt.Sprintf("fast-forward through %d cached steps (one client, sequential HTTP calls)", h.Steps), ms(ff), "ms",
			fmt.Sprintf("target ≤ 100 ms; resume (reading the log) %.1f ms; recording them live took %.0f ms; the same served by the edge (branch: true) %.0f ms: ratio %.2f×",
				ms(resume), ms(live), ms(viaEdge), ms(ff)/ms(viaEdge)))
		rep.add("fast-forward, per cached step", ms(ff)/float64(h.Steps), "ms", "")
	}
	if o.want("snapshot") {
		logf("snapshot: %d MiB in %d files", h.SnapshotMB, h.Files)
		sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", DiskMB: int64(h.SnapshotMB*3 + 256)})
		if err != nil {
			return err
		}
		defer c.Delete(context.WithoutCancel(ctx), sb.ID)
		per := h.SnapshotMB * mib / h.Files
		fill := fmt.Sprintf("mkdir -p /data && head -c %d /dev/urandom > /seed && i=0; while [ $i -lt %d ]; do cp /seed /data/f$i; echo $i >> /data/f$i; i=$((i+1)); done; rm /seed",
			per, h.Files)
		if r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: fill, Timeout: 600}); err != nil || r.ExitCode != 0 {
			return fmt.Errorf("snapshot: fill: %v %+v", err, r)
		}
		t0 := time.Now()
		snap, err := c.Snapshot(ctx, sb.ID, api.CreateSnapshotRequest{})
		if err != nil {
			return err
		}
		d := time.Since(t0)
		// Peer in the same run: the same writable layer packed as a named
		// layer (from_sandbox: tar, unpack, EROFS, no clone).
		t0 = time.Now()
		lname := fmt.Sprintf("bench/snap-peer-%d", time.Now().UnixNano())
		if _, err := c.CreateLayerFromSandbox(ctx, sb.ID, lname, 0); err != nil {
			return err
		}
		peer := time.Since(t0)
		_, _ = c.DeleteLayer(context.WithoutCancel(ctx), lname)
		rep.add(fmt.Sprintf("snapshot of a writable layer with %d MiB in %d files", h.SnapshotMB, h.Files), ms(d), "ms",
			fmt.Sprintf("target ≤ 1 s; frozen %.0f ms; diff %d MiB; the same layer packed by from_sandbox (tar, unpack, EROFS) %.0f ms: ratio %.2f×",
				snap.FrozenMs, snap.Size/mib, ms(peer), ms(d)/ms(peer)))
		// A second snapshot after a small change packs only that change.
		if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "echo more > /data/new"}); err != nil {
			return err
		}
		r1, err := c.Create(ctx, api.CreateSandboxRequest{Snapshot: snap.ID})
		if err != nil {
			return err
		}
		defer c.Delete(context.WithoutCancel(ctx), r1.ID)
		if _, err := c.Exec(ctx, r1.ID, api.ExecRequest{Cmd: "echo more > /data/new"}); err != nil {
			return err
		}
		t0 = time.Now()
		if _, err := c.Snapshot(ctx, r1.ID, api.CreateSnapshotRequest{}); err != nil {
			return err
		}
		rep.add("chained snapshot of a restored sandbox after a one-file change", ms(time.Since(t0)), "ms", "packs only what changed since the restore")
	}
	if o.want("fork") {
		logf("fork: %d", h.Fork)
		sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox"})
		if err != nil {
			return err
		}
		defer c.Delete(context.WithoutCancel(ctx), sb.ID)
		if _, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "mkdir -p /w && seq 1000 > /w/state"}); err != nil {
			return err
		}
		var best time.Duration
		for round := 0; round < 3; round++ {
			t0 := time.Now()
			fr, err := c.Fork(ctx, sb.ID, h.Fork)
			if err != nil {
				return err
			}
			var wg sync.WaitGroup
			errs := make([]error, len(fr.Sandboxes))
			for i, k := range fr.Sandboxes {
				wg.Add(1)
				go func(i int, id string) {
					defer wg.Done()
					_, errs[i] = c.Exec(ctx, id, api.ExecRequest{Cmd: "true"})
				}(i, k.ID)
			}
			wg.Wait()
			d := time.Since(t0)
			for i, k := range fr.Sandboxes {
				_, _ = c.Delete(context.WithoutCancel(ctx), k.ID)
				if errs[i] != nil {
					return errs[i]
				}
			}
			if best == 0 || d < best {
				best = d
			}
		}
		rep.add(fmt.Sprintf("fork of %d until all %d accept exec (best of 3)", h.Fork, h.Fork), ms(best), "ms", "target ≤ 150 ms; the source keeps running")
	}
	return nil
}
