package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/serve"
	warren "github.com/warrenhq/warren/sdk/go"
)

// auditRounds is how many times the audit figure alternates a server
// with telemetry and one without.
const auditRounds = 3

// auditFigures is the "audit" figure: what the node's kernel telemetry
// (issue 20) costs, measured on private servers started alternately with
// it (the defaults: execs, signals, TCP connects) and without
// (--no-telemetry), auditRounds times each, each on a fresh data dir:
// exec `/bin/true` p50, an exec-heavy task (200 execs plus find | xargs
// stat over the root) and create→exec→stop throughput. The report gives
// each side's median over the rounds and their ratio.
func auditFigures(ctx context.Context, o Options, _ *warren.Client, rep *Report) error {
	type sample struct{ execP50, task, rate float64 }
	var off, on []sample
	for round := 0; round < auditRounds; round++ {
		for _, telemetry := range []bool{false, true} {
			fmt.Fprintf(o.Out, "audit figure: round %d, telemetry %v...\n", round+1, telemetry)
			var s sample
			err := withPrivateServer(ctx, o, func(so *serve.Options) { so.NoTelemetry = !telemetry }, func(c *warren.Client) error {
				var err error
				s, err = auditSample(ctx, o, c)
				return err
			})
			if err != nil {
				return err
			}
			if telemetry {
				on = append(on, s)
			} else {
				off = append(off, s)
			}
		}
	}
	med := func(xs []sample, f func(sample) float64) float64 {
		v := make([]float64, len(xs))
		for i, x := range xs {
			v[i] = f(x)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	for _, m := range []struct {
		name, unit string
		f          func(sample) float64
		higher     bool // a higher value is better
	}{
		{"audit: exec `/bin/true` p50", "ms", func(s sample) float64 { return s.execP50 }, false},
		{"audit: exec-heavy task (200 execs, find piped to xargs stat)", "ms", func(s sample) float64 { return s.task }, false},
		{"audit: create→exec→stop", "sandboxes/s", func(s sample) float64 { return s.rate }, true},
	} {
		a, b := med(off, m.f), med(on, m.f)
		cost := (b/a - 1) * 100
		if m.higher {
			cost = (a/b - 1) * 100
		}
		rep.add(m.name, b, m.unit, fmt.Sprintf("with telemetry; without %.3g (median of %d rounds each): %+.1f%% (goal ≤ 3%%)", a, auditRounds, cost))
	}
	return nil
}

// auditSample measures one server.
func auditSample(ctx context.Context, o Options, c *warren.Client) (s struct{ execP50, task, rate float64 }, err error) {
	sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", AlwaysOn: true})
	if err != nil {
		return s, err
	}
	defer c.Delete(context.WithoutCancel(ctx), sb.ID)
	var ds []time.Duration
	for i := 0; i < 330; i++ {
		t0 := time.Now()
		r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"/bin/true"}})
		if err != nil || r.ExitCode != 0 {
			return s, fmt.Errorf("exec /bin/true: %v %+v", err, r)
		}
		if i >= 30 {
			ds = append(ds, time.Since(t0))
		}
	}
	s.execP50 = ms(percentiles(ds).p50)
	t0 := time.Now()
	r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: "for i in $(seq 200); do /bin/true; done; find / -xdev | xargs stat >/dev/null 2>&1; true", Timeout: 300})
	if err != nil || r.ExitCode != 0 {
		return s, fmt.Errorf("exec-heavy task: %v %+v", err, r)
	}
	s.task = float64(time.Since(t0).Microseconds()) / 1000
	short := o
	short.Duration = min(o.Duration, 10*time.Second)
	short.Concurrency = min(o.Concurrency, 4)
	s.rate, _, err = throughput(ctx, short, func(ctx context.Context) error { return warrenCycle(ctx, c) })
	return s, err
}

// withPrivateServer runs fn against a `warren serve` of its own, on a
// fresh data dir, with the bench's options changed by tweak.
func withPrivateServer(ctx context.Context, o Options, tweak func(*serve.Options), fn func(*warren.Client) error) error {
	dataDir, err := os.MkdirTemp("", "warren-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dataDir)
	addr, err := freeAddr()
	if err != nil {
		return err
	}
	so := serve.Options{
		DataDir: dataDir, Listen: addr, Node: "bench-audit", AgentPath: o.AgentPath,
		CPUOvercommit: BenchCPUOvercommit, MemoryOvercommit: BenchMemoryOvercommit, DiskOvercommit: BenchDiskOvercommit,
		Recycle: recycleOption(o.Recycle), Userns: serve.UsernsOptions{HostRoot: o.HostRoot},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	tweak(&so)
	url, token, stop, err := startServe(ctx, so)
	if err != nil {
		return err
	}
	err = fn(warren.New(url, token))
	stop()
	return err
}
