package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/internal/sim"
)

func newSimCmd() *cobra.Command {
	var cfg sim.Config
	var out string
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "measure the real control plane (NATS, apiservers, placement, watcher, IAM) with simulated nodes",
		Long: `warren sim starts NATS (one server, or a three-server cluster with --nats-servers 3), apiserver
processes and one process of simulated nodes (fake edges that admit, hold and report sandboxes
without starting anything), then measures: creations per second with many clients each creating one
sandbox per call, the same with batch creates, filling to --hold live sandboxes, and one burst of
--burst sandboxes in a single call. It prints a Markdown report with the CPU and memory of every
process. The defaults are a short run; the full scale is
  warren sim --nodes 160 --hold 400000 --burst 32768 --duration 10s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tuneGC()
			var buf bytes.Buffer
			cfg.Out = io.MultiWriter(cmd.OutOrStdout(), &buf)
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if err := sim.Run(ctx, cfg); err != nil {
				return err
			}
			if out != "" {
				var args []string
				for i := 2; i < len(os.Args); i++ {
					if a := os.Args[i]; a == "--out" {
						i++
					} else if !strings.HasPrefix(a, "--out=") {
						args = append(args, a)
					}
				}
				md := fmt.Sprintf("### Control plane, `warren sim %s` (%s)\n\n%s", strings.Join(args, " "),
					time.Now().UTC().Format("2006-01-02"), buf.String())
				return appendResults(out, md)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.NATSServers, "nats-servers", 1, "NATS servers: 1, or 3 for a cluster (R3 buckets)")
	f.IntVar(&cfg.APIServers, "apiservers", 2, "apiserver processes")
	f.IntVar(&cfg.Nodes, "nodes", 160, "simulated nodes")
	f.IntVar(&cfg.Clients, "clients", 64, "concurrent clients in the single-create phase (an eighth of them in the batch phase)")
	f.BoolVar(&cfg.SDKClients, "sdk-clients", false, "single-create clients use the Go SDK (net/http, JSON both ways) instead of a lean HTTP/1.1 client")
	f.DurationVar(&cfg.Duration, "duration", 3*time.Second, "length of each sustained phase")
	f.IntVar(&cfg.BatchSize, "batch", 256, "sandboxes per call in the batch phase")
	f.IntVar(&cfg.Hold, "hold", 40000, "live sandboxes to hold (full scale: 400000)")
	f.StringVar(&out, "out", "", "append the report to this Markdown file (docs/BENCHMARKS.md)")
	f.BoolVar(&cfg.NoAuth, "no-auth", false, "run NATS without credentials (to measure what the bus's authentication costs)")
	f.IntVar(&cfg.Burst, "burst", 4096, "sandboxes in the final one-call burst (full scale: 32768)")
	return cmd
}

func newSimEdgesCmd() *cobra.Command {
	var cfg sim.EdgesConfig
	cmd := &cobra.Command{
		Use:    "sim-edges",
		Short:  "serve simulated nodes (used by warren sim)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			natsFromEnv(&cfg.NATS)
			tuneGC()
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return sim.RunEdges(ctx, cfg)
		},
	}
	f := cmd.Flags()
	natsFlags(f, &cfg.NATS)
	f.IntVar(&cfg.Nodes, "nodes", 160, "simulated nodes")
	f.StringVar(&cfg.Prefix, "prefix", "sim", "node name prefix")
	f.Float64Var(&cfg.CPU, "cpu", 1e6, "cores each node offers")
	f.Int64Var(&cfg.MemoryMB, "memory-mb", 1<<40, "memory each node offers")
	f.IntVar(&cfg.MaxSandboxes, "max-sandboxes", 10000, "sandboxes each node admits")
	f.IntVar(&cfg.Conns, "conns", 8, "NATS connections shared by the nodes")
	f.StringVar(&cfg.AuthDir, "auth-dir", "", "credentials directory with edge-<node>.nk for every node (each node then has its own connection)")
	return cmd
}
