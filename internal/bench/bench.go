// Package bench measures warren against peers (runc, bubblewrap) in the same
// run on the same root filesystem, so figures are ratios that survive noisy
// machines. `warren bench` drives it and writes docs/BENCHMARKS.md.
package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/serve"
	warren "github.com/warrenhq/warren/sdk/go"
)

// BenchCPUOvercommit and BenchMemoryOvercommit are the private server's
// overcommit factors. CPU requests are cfs quotas (hard caps), so idle
// sandboxes that each may burst to a quarter core need a high factor to
// be packed by the thousand; memory requests are limits, and 4× lets
// 5,000 sandboxes of the 16 MiB minimum be admitted on a 24 GiB node;
// disk requests (1 GiB by default) are quotas that idle sandboxes barely
// touch, so thousands need a high factor too. The
// measured guards (MemAvailable reserve, memory PSI) stay as they are:
// they, not the requests, are what stops an overcommitted node.
const (
	BenchCPUOvercommit    = 1000
	BenchMemoryOvercommit = 4
	BenchDiskOvercommit   = 1000
)

// Options configure a run.
type Options struct {
	Duration    time.Duration // per throughput measurement; default 20s
	Concurrency int           // clients; default 16
	// Recycle is the private server's --recycle (negative: 0, no
	// recycling); 0 = serve.DefaultRecycle.
	Recycle int
	// HostRoot runs the private server's container sandboxes as host
	// root instead of in user namespaces (--host-root: the figures
	// without user namespaces).
	HostRoot    bool
	ExecSamples int // exec round trips; default 2000
	AgentPath   string
	Out         io.Writer // progress
	// Figures selects what to measure (comma-separated): core (exec round
	// trip, create throughput against runc and bwrap), the layer figures
	// create-size, lazy, burst, upgrade ("layers" for all four), and the
	// elasticity figures density, pool-burst, fncall, pause, interference
	// ("elastic" for all five). "all" is everything. Default: core.
	Figures string
	Layers  LayerOptions
	// DensityMax stops the density figure at this many live sandboxes
	// (earlier when admission refuses); default 500.
	DensityMax int
	// BurstCount creates with BurstClients concurrent clients, once
	// without a pool and once with a pool of BurstPool; defaults 1000, 64, 200.
	BurstCount, BurstClients, BurstPool int
	// PauseCount sandboxes holding PauseHoldMB each are paused; defaults 100, 64.
	PauseCount, PauseHoldMB int
	// InterferenceIdle waiting sandboxes, each with a busy background
	// process, run next to the interference figure's latency sandbox, with
	// the CPU gate and without it (always_on); default 200, 0 = skip.
	InterferenceIdle int
	// BestEffortCap is the private server's --best-effort-cap (0 = its
	// default, -1 = off): the interference figure with and without it.
	BestEffortCap float64
	// DebianTar is a root filesystem tarball of scripts/build-debian-image.sh,
	// imported as debian:12 into the private server for the fncall python3
	// figure (skipped when empty or missing).
	DebianTar string

	// NetworkIdle is how many idle sandboxes the network figure creates
	// without and then with a network; default 1000.
	NetworkIdle int
	// NetworkParts limits the network figure to some of create,
	// throughput, rule, idle ("": all).
	NetworkParts string

	// TransferMB is the size of the transfer figure's file; default 1024.
	TransferMB int
	// TransferRounds is how many times each transfer leg runs (the legs
	// alternating); default 3.
	TransferRounds int
	// E2BSDKDir holds the official e2b npm package for the e2b figure
	// (default test/e2b-sdk, where scripts/install-deps.sh installs it).
	E2BSDKDir string

	cgroupParent string // the private server's sandboxes' cgroup (set by Run)
	dataDir      string // the private server's data dir (set by Run)
	// apiURL and apiToken reach the private server (set by Run).
	apiURL, apiToken string
	e2bURL           string // the private server's E2B front (set by Run for the e2b figure)
	History          HistoryOptions
	// VMKernel is the private server's --vm-kernel (the microvm tier's
	// guest kernel); VM sizes the vm figures.
	VMKernel string
	// NoVMTemplates: the private server boots every microVM from its
	// kernel (serve.Options.NoVMTemplates).
	NoVMTemplates bool
	VM            VMOptions
}

// FigureSets are the names Figures accepts (besides all, layers, elastic, history).
var FigureSets = []string{"core", "exec", "create", "create-size", "lazy", "burst", "upgrade", "density", "pool-burst", "fncall", "pause", "interference", "fast-forward", "snapshot", "fork", "transfer", "slow-read", "audit", "ports", "network", "e2b", "vm"}

var coreFigures = []string{"exec", "create"}

var layerFigures = []string{"create-size", "lazy", "burst", "upgrade"}

var historySets = []string{"fast-forward", "snapshot", "fork"}

func (o *Options) want(f string) bool {
	for _, w := range strings.Split(o.Figures, ",") {
		w = strings.TrimSpace(w)
		if w == "network" && f == "ports" {
			return true // the port proxy's figures are network figures too
		}
		if w == f || w == "all" || w == "core" && slices.Contains(coreFigures, f) || w == "layers" && slices.Contains(layerFigures, f) ||
			w == "history" && slices.Contains(historySets, f) ||
			w == "elastic" && f != "core" && f != "transfer" && f != "slow-read" && f != "audit" && f != "ports" && f != "network" && f != "e2b" && f != "vm" && !slices.Contains(coreFigures, f) && !slices.Contains(layerFigures, f) && !slices.Contains(historySets, f) {
			return true
		}
	}
	return false
}

// Result is one measured figure.
type Result struct {
	Name  string
	Value float64
	Unit  string
	Note  string
}

// Report is everything one run measured.
type Report struct {
	Started time.Time
	Results []Result
}

func (o *Options) defaults() {
	if o.Duration == 0 {
		o.Duration = 20 * time.Second
	}
	if o.Concurrency == 0 {
		o.Concurrency = 16
	}
	if o.ExecSamples == 0 {
		o.ExecSamples = 2000
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Figures == "" {
		o.Figures = "core"
	}
	if o.DensityMax == 0 {
		o.DensityMax = 500
	}
	if o.BurstCount == 0 {
		o.BurstCount = 1000
	}
	if o.BurstClients == 0 {
		o.BurstClients = 64
	}
	if o.BurstPool == 0 {
		o.BurstPool = 200
	}
	if o.PauseCount == 0 {
		o.PauseCount = 100
	}
	if o.PauseHoldMB == 0 {
		o.PauseHoldMB = 64
	}
	if o.NetworkIdle == 0 {
		o.NetworkIdle = 1000
	}
	if o.TransferRounds <= 0 {
		o.TransferRounds = 3
	}
	if o.TransferMB == 0 {
		o.TransferMB = 1024
	}
}

// Run starts a private `warren serve`, measures, and stops it.
func Run(ctx context.Context, o Options) (*Report, error) {
	o.defaults()
	if err := checkFigures(o.Figures); err != nil {
		return nil, err
	}
	dataDir, err := os.MkdirTemp("", "warren-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dataDir)
	if err := importDebian(ctx, o, dataDir); err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	e2bListen := ""
	if o.want("e2b") {
		if e2bListen, err = freeAddr(); err != nil {
			return nil, err
		}
	}
	url, token, stop, err := startServe(ctx, serve.Options{
		DataDir: dataDir, Listen: addr, Node: "bench", AgentPath: o.AgentPath,
		CPUOvercommit: BenchCPUOvercommit, MemoryOvercommit: BenchMemoryOvercommit,
		DiskOvercommit: BenchDiskOvercommit,
		BestEffortCap:  o.BestEffortCap,
		Recycle:        recycleOption(o.Recycle),
		Userns:         serve.UsernsOptions{HostRoot: o.HostRoot},
		VMKernel:       o.VMKernel,
		NoVMTemplates:  o.NoVMTemplates,
		Logger:         slog.New(slog.NewTextHandler(io.Discard, nil)),
		E2BListen:      e2bListen,
	})
	if err != nil {
		return nil, err
	}
	defer stop()

	c := warren.New(url, token)
	rep := &Report{Started: time.Now().UTC()}
	o.cgroupParent = serve.CgroupParent(dataDir)
	o.apiURL, o.apiToken = url, token
	o.dataDir = dataDir
	if e2bListen != "" {
		o.e2bURL = "http://" + e2bListen
	}
	if err := runFigures(ctx, o, c, dataDir, rep); err != nil {
		return nil, err
	}
	return rep, nil
}

// checkFigures returns an error naming the first figure set of the
// comma-separated list figures that Run does not know.
func checkFigures(figures string) error {
	for _, w := range strings.Split(figures, ",") {
		w = strings.TrimSpace(w)
		if w != "" && w != "all" && w != "layers" && w != "elastic" && w != "history" && !slices.Contains(FigureSets, w) {
			return fmt.Errorf("bench: unknown figure set %q (known: all, layers, elastic, history, %s)", w, strings.Join(FigureSets, ", "))
		}
	}
	return nil
}

// importDebian imports o.DebianTar as debian:12 into the image store of
// dataDir when the fncall figure is wanted and the tarball exists.
func importDebian(ctx context.Context, o Options, dataDir string) error {
	if !o.want("fncall") || o.DebianTar == "" {
		return nil
	}
	if _, err := os.Stat(o.DebianTar); err != nil {
		return nil
	}
	fmt.Fprintf(o.Out, "importing %s as debian:12...\n", o.DebianTar)
	store, err := image.Open(filepath.Join(dataDir, "images"))
	if err != nil {
		return err
	}
	if _, err := store.Import(ctx, o.DebianTar, "debian:12"); err != nil {
		return fmt.Errorf("bench: import %s: %w", o.DebianTar, err)
	}
	return nil
}

// startServe runs `warren serve` with so (its Ready callback set here) in
// a goroutine and waits until it is ready: its URL and token, and a
// function that stops it and waits for it to end. An error is serve's own
// when it ends before it is ready.
func startServe(ctx context.Context, so serve.Options) (url, token string, stop func(), err error) {
	sctx, cancel := context.WithCancel(ctx)
	ready := make(chan [2]string, 1)
	done := make(chan error, 1)
	so.Ready = func(url, token string) { ready <- [2]string{url, token} }
	go func() { done <- serve.Run(sctx, so) }()
	select {
	case r := <-ready:
		return r[0], r[1], func() { cancel(); <-done }, nil
	case err := <-done:
		cancel()
		return "", "", nil, fmt.Errorf("bench: warren serve: %w", err)
	}
}

// runFigures measures every wanted figure against the private server of
// c (dataDir its data dir) into rep. The core, layer and history figures
// end the run on an error; every other figure records its error as a
// failed result and the run goes on.
func runFigures(ctx context.Context, o Options, c *warren.Client, dataDir string, rep *Report) error {
	if o.want("exec") || o.want("create") {
		if err := runCore(ctx, o, c, dataDir, rep); err != nil {
			return err
		}
	}
	if err := runLayers(ctx, o, c, dataDir, rep); err != nil {
		return err
	}
	if err := runHistory(ctx, o, c, rep); err != nil {
		return fmt.Errorf("bench history: %w", err)
	}
	for _, f := range []struct {
		name string
		fn   func(context.Context, Options, *warren.Client, *Report) error
	}{{"interference", interference}, {"fncall", fncallFigures}, {"pool-burst", burst}, {"pause", pauseFigures}, {"density", density}, {"transfer", transfer}, {"slow-read", slowRead}, {"audit", auditFigures}, {"ports", portsFigures}, {"network", networkFigures}, {"e2b", e2bFigures}, {"vm", vmFigures}} {
		if !o.want(f.name) {
			continue
		}
		if err := f.fn(ctx, o, c, rep); err != nil {
			rep.add(f.name, 0, "", "failed: "+err.Error())
		}
	}
	return nil
}

func runCore(ctx context.Context, o Options, c *warren.Client, dataDir string, rep *Report) error {
	rootfs, release, err := busyboxRoot(dataDir)
	if err != nil {
		return err
	}
	defer release()
	return core(ctx, o, c, rep, rootfs)
}

// core is the exec round trip and create throughput against the peers.
func core(ctx context.Context, o Options, c *warren.Client, rep *Report, rootfs string) error {
	if o.want("exec") {
		fmt.Fprintf(o.Out, "exec round trip (%d samples)...\n", o.ExecSamples)
		gated, on, err := execRoundTrip(ctx, c, o.ExecSamples)
		if err != nil {
			return err
		}
		rep.add("exec round trip `true` p50", ms(gated.p50), "ms", "target ≤ 1 ms")
		rep.add("exec round trip `true` p99", ms(gated.p99), "ms", "target ≤ 5 ms")
		rep.add("exec round trip `true` p50, always_on", ms(on.p50), "ms",
			fmt.Sprintf("same loop, no CPU switch: the gate adds %.3f ms (goal ≤ 0.05)", ms(gated.p50)-ms(on.p50)))
	}
	if !o.want("create") {
		return nil
	}

	fmt.Fprintf(o.Out, "warren create→exec→stop, %d clients, %v...\n", o.Concurrency, o.Duration)
	before := nodeRecycling(ctx, c)
	var cycles atomic.Int64
	wRate, wLat, err := throughput(ctx, o, func(ctx context.Context) error {
		cycles.Add(1)
		return warrenCycle(ctx, c)
	})
	if err != nil {
		return err
	}
	time.Sleep(1500 * time.Millisecond) // the node view comes with the next heartbeat
	after := nodeRecycling(ctx, c)
	rep.add("warren create→exec→stop", wRate, "sandboxes/s", fmt.Sprintf("p50 %.1f ms, p99 %.1f ms; %d of %d in a recycled container",
		ms(wLat.p50), ms(wLat.p99), after.Reused-before.Reused, cycles.Load()))

	peers := []struct {
		name string
		mk   func(string) (func(context.Context) error, func(), error)
	}{{"runc", runcCycle}, {"bwrap", bwrapCycle}}
	for _, p := range peers {
		fmt.Fprintf(o.Out, "%s, %d clients, %v...\n", p.name, o.Concurrency, o.Duration)
		cycle, cleanup, err := p.mk(rootfs)
		if err != nil {
			rep.add(p.name+" run `true`", 0, "runs/s", "not measured: "+err.Error())
			continue
		}
		rate, lat, err := throughput(ctx, o, cycle)
		cleanup()
		if err != nil {
			rep.add(p.name+" run `true`", 0, "runs/s", "failed: "+err.Error())
			continue
		}
		rep.add(p.name+" run `true`", rate, "runs/s", fmt.Sprintf("p50 %.1f ms, p99 %.1f ms", ms(lat.p50), ms(lat.p99)))
		if rate > 0 {
			note := ""
			if p.name == "runc" {
				note = "target ≥ 5×"
			}
			rep.add("ratio warren / "+p.name, wRate/rate, "×", note)
		}
	}
	return nil
}

// freeAddr is a loopback address free to listen on.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func recycleOption(n int) int {
	switch {
	case n < 0:
		return 0
	case n == 0:
		return serve.DefaultRecycle
	}
	return n
}

// nodeRecycling is the (one) node's recycling figures; zero when unknown.
func nodeRecycling(ctx context.Context, c *warren.Client) api.NodeRecycling {
	nodes, err := c.Nodes(ctx)
	if err != nil || len(nodes) != 1 {
		return api.NodeRecycling{}
	}
	return nodes[0].Recycling
}

func (r *Report) add(name string, v float64, unit, note string) {
	r.Results = append(r.Results, Result{Name: name, Value: v, Unit: unit, Note: note})
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

type latencies struct{ p50, p99 time.Duration }

func percentiles(ds []time.Duration) latencies {
	if len(ds) == 0 {
		return latencies{}
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	at := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
	return latencies{at(0.50), at(0.99)}
}

// throughput runs cycle from o.Concurrency workers for o.Duration.
func throughput(ctx context.Context, o Options, cycle func(context.Context) error) (float64, latencies, error) {
	var n atomic.Int64
	var mu sync.Mutex
	var lats []time.Duration
	var firstErr error
	deadline := time.Now().Add(o.Duration)
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < o.Concurrency; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) && ctx.Err() == nil {
				t0 := time.Now()
				if err := cycle(ctx); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				d := time.Since(t0)
				n.Add(1)
				mu.Lock()
				lats = append(lats, d)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, latencies{}, firstErr
	}
	return float64(n.Load()) / time.Since(start).Seconds(), percentiles(lats), nil
}

// cycleSpec is the sandbox of the create→exec→stop figures.
var cycleSpec = api.CreateSandboxRequest{Image: "busybox", CPU: 0.1, MemoryMB: 64}

func warrenCycle(ctx context.Context, c *warren.Client) error { return cycleOf(ctx, c, cycleSpec) }

// cycleOf creates a sandbox of s, runs `true` in it and deletes it.
func cycleOf(ctx context.Context, c *warren.Client, s api.CreateSandboxRequest) error {
	sb, err := c.Create(ctx, s)
	if err != nil {
		return err
	}
	r, err := c.Exec(ctx, sb.ID, api.ExecRequest{Argv: []string{"true"}})
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("true exited %d", r.ExitCode)
	}
	if _, derr := c.Delete(ctx, sb.ID); err == nil {
		err = derr
	}
	return err
}

// execRoundTrip times exec `true` in a sandbox with the default CPU
// policy (its quota raised for each exec and lowered after it) and, in
// the same loop, in an always_on one (no switch): the difference is what
// the CPU gate costs an operation.
func execRoundTrip(ctx context.Context, c *warren.Client, n int) (gated, on latencies, err error) {
	var ids [2]string
	for i, always := range []bool{false, true} {
		sb, err := c.Create(ctx, api.CreateSandboxRequest{Image: "busybox", AlwaysOn: always})
		if err != nil {
			return gated, on, err
		}
		defer c.Delete(context.WithoutCancel(ctx), sb.ID)
		ids[i] = sb.ID
	}
	lats := [2][]time.Duration{make([]time.Duration, 0, n), make([]time.Duration, 0, n)}
	for i := 0; i < n+50; i++ {
		for k := range 2 {
			j := (i + k) % 2 // alternate which goes first
			t0 := time.Now()
			r, err := c.Exec(ctx, ids[j], api.ExecRequest{Cmd: "true"})
			if err != nil {
				return gated, on, err
			}
			if r.ExitCode != 0 {
				return gated, on, fmt.Errorf("true exited %d", r.ExitCode)
			}
			if i >= 50 { // warm-up
				lats[j] = append(lats[j], time.Since(t0))
			}
		}
	}
	return percentiles(lats[0]), percentiles(lats[1]), nil
}

// busyboxRoot mounts the busybox layer of the bench server's store, so
// peers run the very same root filesystem; release unmounts it.
func busyboxRoot(dataDir string) (string, func(), error) {
	store, err := image.Open(filepath.Join(dataDir, "images"))
	if err != nil {
		return "", nil, err
	}
	img, _, err := store.Resolve(context.Background(), image.BusyboxImage)
	if err != nil {
		return "", nil, fmt.Errorf("bench: busybox image: %w", err)
	}
	m, err := image.NewMounter(filepath.Join(dataDir, "bench-mnt"), store)
	if err != nil {
		return "", nil, err
	}
	dirs, err := m.Acquire("bench", img.Layers)
	if err != nil {
		return "", nil, err
	}
	return dirs[0], func() { _ = m.Close() }, nil
}

// Markdown renders the report as a table.
func (r *Report) Markdown(command string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "### Run of %s\n\nCommand: `%s` on %s.\n\n| figure | value | unit | note |\n| --- | ---: | --- | --- |\n",
		r.Started.Format("2006-01-02 15:04 UTC"), command, machine())
	for _, res := range r.Results {
		fmt.Fprintf(&b, "| %s | %.2f | %s | %s |\n", res.Name, res.Value, res.Unit, res.Note)
	}
	return b.String()
}

// Rows renders the report as CSV rows: date, command, machine, figure,
// value, unit, note (docs/benchmarks-history.csv).
func (r *Report) Rows(command string) [][]string {
	date, m := r.Started.Format("2006-01-02 15:04"), machine()
	rows := make([][]string, 0, len(r.Results))
	for _, res := range r.Results {
		rows = append(rows, []string{date, command, m, res.Name, strconv.FormatFloat(res.Value, 'f', 2, 64), res.Unit, res.Note})
	}
	return rows
}

func machine() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	cpus := strings.Count(string(b), "processor\t:")
	model := ""
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "model name") {
			model = strings.TrimSpace(strings.SplitN(l, ":", 2)[1])
			break
		}
	}
	return fmt.Sprintf("%d × %s", cpus, model)
}
