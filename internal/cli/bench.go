package cli

import (
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/warrenhq/warren/internal/bench"
	"github.com/warrenhq/warren/internal/serve"
)

// benchFlags are the values of `warren bench`'s flags: the measurement's
// options and where its results and profiles go.
type benchFlags struct {
	o                           bench.Options
	out, cpuProfile, memProfile string
}

// newBenchCmd is `warren bench`: it measures warren against runc and
// bubblewrap with a private server (internal/bench).
func newBenchCmd() *cobra.Command {
	b := &benchFlags{}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "measure warren against runc and bubblewrap on this machine (starts a private server)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return b.run(cmd)
		},
	}
	b.register(cmd.Flags())
	return cmd
}

// run measures with b's options (profiling the run when asked), prints the
// Markdown report and appends the results to --out.
func (b *benchFlags) run(cmd *cobra.Command) error {
	o := &b.o
	if o.AgentPath == "" {
		p, err := serve.FindAgent()
		if err != nil {
			return err
		}
		o.AgentPath = p
	}
	o.Out = cmd.ErrOrStderr()
	if b.cpuProfile != "" {
		f, err := os.Create(b.cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	if b.memProfile != "" {
		defer func() {
			if f, err := os.Create(b.memProfile); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
		}()
	}
	rep, err := bench.Run(cmd.Context(), *o)
	if err != nil {
		return err
	}
	md := rep.Markdown("warren bench " + strings.Join(os.Args[2:], " "))
	fmt.Fprint(cmd.OutOrStdout(), md)
	if strings.HasSuffix(b.out, ".csv") {
		return appendCSV(b.out, rep.Rows("warren bench "+strings.Join(os.Args[2:], " ")))
	}
	if b.out != "" {
		return appendResults(b.out, md)
	}
	return nil
}

// register defines bench's flags on f, with b's fields as their values.
func (b *benchFlags) register(f *pflag.FlagSet) {
	o := &b.o
	f.DurationVar(&o.Duration, "duration", 20*time.Second, "length of each throughput measurement")
	f.IntVar(&o.Concurrency, "concurrency", 16, "concurrent clients")
	f.IntVar(&o.Recycle, "recycle", 0, "the private server's --recycle (0: its default; -1: no recycling)")
	f.BoolVar(&o.HostRoot, "host-root", false, "the private server runs container sandboxes as host root, without user namespaces (to compare)")
	f.IntVar(&o.ExecSamples, "exec-samples", 2000, "exec round trips to time")
	f.StringVar(&o.AgentPath, "agent", "", "path of warren-agent (default: beside this binary)")
	f.IntVar(&o.DensityMax, "density-max", 500, "density: stop at this many live sandboxes")
	f.IntVar(&o.BurstCount, "burst-count", 1000, "pool-burst: creates per run")
	f.IntVar(&o.BurstClients, "burst-clients", 64, "pool-burst: concurrent clients")
	f.IntVar(&o.BurstPool, "burst-pool", 200, "pool-burst: warm pool size of the second run")
	f.IntVar(&o.PauseCount, "pause-count", 100, "pause: sandboxes paused")
	f.IntVar(&o.PauseHoldMB, "pause-hold-mb", 64, "pause: anonymous memory each holds")
	f.Float64Var(&o.BestEffortCap, "best-effort-cap", 0, "the private server's --best-effort-cap (0 = its default 0.1 core; -1 = off)")
	f.IntVar(&o.InterferenceIdle, "interference-idle", 200, "interference: waiting sandboxes with a busy background process next to the latency sandbox, with and without the CPU gate (0 = skip)")
	f.IntVar(&o.NetworkIdle, "net-idle", 1000, "network: idle sandboxes created without and then with a network for the memory figure")
	f.StringVar(&o.NetworkParts, "net-parts", "", "network: only these parts, comma-separated: create, throughput, rule, idle (default all)")
	f.IntVar(&o.TransferMB, "transfer-mb", 1024, "transfer: size of the file downloaded and uploaded (MiB)")
	f.IntVar(&o.TransferRounds, "transfer-rounds", 3, "transfer: rounds of every leg, alternating; figures are medians")
	debianTar := os.Getenv("WARREN_DEBIAN_TAR")
	if debianTar == "" {
		debianTar = filepath.Join(DefaultDataDir, "cache", "debian-12.tar") // where `make run` builds it
	}
	f.StringVar(&o.DebianTar, "debian-tar", debianTar, "fncall: debian:12 root filesystem tarball (scripts/build-debian-image.sh) to import for the python3 figure")
	f.BoolVar(&o.NoVMTemplates, "no-vm-templates", false, "vm: the private server boots every microVM from its kernel (no memory templates)")
	f.StringVar(&o.VMKernel, "vm-kernel", serve.VMKernelDir(DefaultDataDir, ""), "vm: the microvm tier's guest kernel directory (make vm-kernel)")
	f.IntVar(&o.VM.Creates, "vm-creates", 8, "vm: microVMs created one after another for create→first exec")
	f.IntVar(&o.VM.Idle, "vm-idle", 20, "vm: idle microVMs started together and measured for host memory and node capacity")
	f.BoolVar(&o.VM.KSM, "vm-ksm", false, "vm: also measure the idle microVMs with the host's KSM on (host-wide; put back afterwards)")
	f.IntVar(&o.VM.Forks, "vm-fork", 8, "vm: children of the fork from memory")
	f.StringVar(&b.cpuProfile, "cpuprofile", "", "write a Go CPU profile of the run (the bench and its in-process server) to this file")
	f.StringVar(&b.memProfile, "memprofile", "", "write a Go profile of the run's allocations (the bench and its in-process server) to this file")
	f.StringVar(&b.out, "out", "", "append the results to this file: a CSV history (docs/benchmarks-history.csv) when it ends in .csv, else a Markdown table")
	f.StringVar(&o.E2BSDKDir, "e2b-sdk", filepath.Join("test", "e2b-sdk"), "e2b: directory of the official e2b npm package (scripts/install-deps.sh installs it in test/e2b-sdk)")
	f.StringVar(&o.Figures, "figures", "core", "what to measure, comma-separated: core, layers, elastic, history, all, or any of "+strings.Join(bench.FigureSets, ", "))
	f.IntVar(&o.History.Steps, "ff-steps", 1000, "fast-forward: cached steps re-issued")
	f.IntVar(&o.History.SnapshotMB, "snapshot-mb", 100, "snapshot: data in the writable layer (MiB)")
	f.IntVar(&o.History.Files, "snapshot-files", 2000, "snapshot: files holding it")
	f.IntVar(&o.History.Fork, "fork", 8, "fork: sandboxes per fork")
	f.IntVar(&o.Layers.LayerMB, "layer-mb", 2048, "create-size: size of the big workspace layer (MiB)")
	f.IntVar(&o.Layers.CreateSamples, "create-samples", 20, "create-size: creates timed per layer")
	f.IntVar(&o.Layers.ImageMB, "image-mb", 1024, "lazy: size of the image (MiB)")
	f.Float64Var(&o.Layers.TouchPercent, "touch-percent", 5, "lazy: share of the image the task reads")
	f.IntVar(&o.Layers.Burst, "burst", 500, "burst: sandboxes created")
	f.IntVar(&o.Layers.BurstWorkspaces, "burst-workspaces", 50, "burst: distinct workspaces")
	f.IntVar(&o.Layers.WorkspaceMB, "workspace-mb", 4, "burst: size of one workspace (MiB)")
	f.IntVar(&o.Layers.UpgradeWorkspaces, "upgrade-workspaces", 1000, "upgrade: workspaces sharing the toolkit")
}

// appendResults adds a run to the results file, below the marker line.
func appendResults(path, md string) error {
	old, _ := os.ReadFile(path)
	const marker = "<!-- results: newest first -->\n"
	s := string(old)
	if i := strings.Index(s, marker); i >= 0 {
		s = s[:i+len(marker)] + "\n" + md + s[i+len(marker):]
	} else {
		s += "\n" + marker + "\n" + md
	}
	return os.WriteFile(path, []byte(s), 0o644)
}

// appendCSV adds a run's rows to a CSV history (date, command, machine,
// figure, value, unit, note), writing the header to a new file.
func appendCSV(path string, rows [][]string) error {
	_, statErr := os.Stat(path)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	if os.IsNotExist(statErr) {
		_ = w.Write([]string{"date", "command", "machine", "figure", "value", "unit", "note"})
	}
	_ = w.WriteAll(rows)
	if err := w.Error(); err != nil {
		f.Close()
		return fmt.Errorf("bench: write %s: %w", path, err)
	}
	return f.Close()
}
