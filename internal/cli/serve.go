package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/warrenhq/warren/internal/apiserver"
	"github.com/warrenhq/warren/internal/connlimit"
	"github.com/warrenhq/warren/internal/e2b"
	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/image"
	"github.com/warrenhq/warren/internal/serve"
)

func init() {
	importImage = func(ctx context.Context, storeDir, src, name string) error {
		store, err := image.Open(storeDir)
		if err != nil {
			return err
		}
		_, err = store.Import(ctx, src, name)
		return err
	}
	importDisk = func(ctx context.Context, storeDir, src, name, format string) error {
		store, err := image.Open(storeDir)
		if err != nil {
			return err
		}
		_, err = store.ImportDisk(ctx, src, name, format)
		return err
	}
}

func newServeCmd() *cobra.Command {
	var o serve.Options
	var verbose bool
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "run warren on this machine: embedded NATS, apiserver, placement, watcher and one edge",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
			out := cmd.OutOrStdout()
			o.Ready = func(url, token string) {
				fmt.Fprintf(out, "warren is ready\n  URL:   %s\n  token: %s\n  try:   curl -s -H 'Authorization: Bearer %s' -d '{\"image\":\"busybox\"}' %s/v1/sandboxes\n",
					url, token, token, url)
			}
			o.E2BReady = func(url, token string) { printE2B(out, url, token) }
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return serve.Run(ctx, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.DataDir, "data-dir", "/var/lib/warren", "state directory (NATS store, images, sandboxes, admin token)")
	f.StringVar(&o.Listen, "listen", "127.0.0.1:7070", "API listen address")
	f.StringVar(&o.E2BListen, "e2b-listen", "", "also serve E2B's control plane (the official e2b SDKs' E2B_API_URL) on this address (default: off)")
	f.StringVar(&o.Node, "node", "", "node name (default: the hostname)")
	f.StringVar(&o.AgentPath, "agent", "", "path of warren-agent (default: beside this binary)")
	f.StringVar(&o.Store, "store", "", "layer store directory, shared by every node of a cluster (default: DATA_DIR/images)")
	f.StringVar(&o.NATSListen, "nats-listen", "", "also serve NATS to other processes on this address (default: in-process only)")
	f.Float64Var(&o.CPUOvercommit, "cpu-overcommit", 20, "CPU overcommit factor used by admission")
	f.Float64Var(&o.MemoryOvercommit, "memory-overcommit", 1.5, "memory overcommit factor used by admission")
	f.Float64Var(&o.DiskOvercommit, "disk-overcommit", serve.DefaultDiskOvercommit, "disk overcommit factor used by admission: disk_mb is admitted up to what the scratch filesystem can really hold × this")
	f.Int64Var(&o.MinMemoryAvailableMB, "min-memory-available-mb", 0, "refuse new sandboxes while the host's MemAvailable is below this (0 = 2% of memory, at least 256; -1 = off)")
	f.Float64Var(&o.MaxMemoryPressure, "max-memory-pressure", 0, "refuse new sandboxes while memory PSI some avg10 (percent) is above this (0 = 40; -1 = off)")
	f.Float64Var(&o.BestEffortCap, "best-effort-cap", 0, "cap the best-effort class as a whole at this many cores while any latency-class sandbox runs an operation (0 = 0.1; -1 = never)")
	f.Float64Var(&o.MaxCPUPressure, "max-cpu-pressure", 0, "count best-effort sandboxes between operations at their idle_cpu in admission only while CPU PSI some avg10 (percent) is at most this (0 = 90; -1 = always)")
	f.BoolVar(&o.KeepOnShutdown, "keep-sandboxes", false, "leave sandboxes running on shutdown (they are adopted at the next start)")
	f.IntVar(&o.Recycle, "recycle", serve.DefaultRecycle, "containers of deleted sandboxes kept per shape, wiped, for reuse by new sandboxes (0 = none: a new container for every sandbox)")
	f.DurationVar(&o.RecycleIdle, "recycle-idle", edge.DefaultRecycleIdle, "how long a recycled container waits for a sandbox of its shape before it is destroyed")
	f.DurationVar(&o.TrajectorySweep, "trajectory-sweep", apiserver.DefaultSweepEvery, "how often trajectories past their trajectory_ttl are deleted and storage quotas are copied to the storage account")
	f.BoolVar(&o.NoTelemetry, "no-telemetry", false, "do not load the node's BPF telemetry (the audit of sandboxes then records nothing)")
	f.BoolVar(&o.TelemetryRefusals, "telemetry-refusals", false, "also audit every syscall of a sandbox refused with EPERM (slows every syscall of the host)")
	f.BoolVar(&o.TelemetryFiles, "telemetry-files", false, "also audit the file writes, renames, unlinks and chmods of sandbox processes (slows every syscall of the host)")
	f.BoolVar(&o.Userns.AllowHostRoot, "allow-host-root", false, "where this kernel cannot run container sandboxes in user namespaces, run them as host root (without it the node refuses to start there)")
	f.BoolVar(&o.Userns.HostRoot, "host-root", false, "run container sandboxes as host root even where user namespaces work (measurements only)")
	f.Uint32Var(&o.Userns.IDBase, "id-base", 0, "first host uid/gid of the sandboxes' user namespaces (65,536 per sandbox; 0 = 1048576)")
	f.IntVar(&o.Userns.IDRanges, "id-ranges", 0, "how many ranges of 65,536 host ids from --id-base (0 = 16384): the most sandboxes at once")
	f.IntVar(&o.VMTCGBufferMB, "vm-tcg-buffer-mb", 0, "TCG's code buffer (MiB) of a microVM restored from a memory template; what a VM filled of it stays resident: 8 holds ~10 MiB less per idle VM than the default 16 and slows create under TCG; no effect under KVM (default 16)")
	f.BoolVar(&o.NoVMTemplates, "no-vm-templates", false, "boot every microVM from its kernel (default: most are restored from a memory template of their shape, built at the shape's first create)")
	f.StringVar(&o.VMKernel, "vm-kernel", "", "guest kernel directory of the microvm tier: vmlinux, modules/ (default: DATA_DIR/"+serve.DefaultVMKernel+", made by `make vm-kernel`; \"off\": no microvm tier)")
	f.StringVar(&o.Userns.NetPool, "net-pool", "", "node-local IPv4 pool of networked sandboxes' addresses, a /31 each (default 10.213.0.0/16)")
	f.StringVar(&o.Userns.DNSUpstream, "dns-upstream", "", "where the resolver of networked sandboxes forwards the names they may resolve, host:port (default the host's resolver from /etc/resolv.conf)")
	f.IntVar(&o.Userns.NetEgressRateMbit, "net-egress-rate-mbit", 0, "networked sandboxes' egress rate limit in Mbit/s when their create sets none (0: no limit)")
	f.IntVar(&o.Userns.NetIngressRateMbit, "net-ingress-rate-mbit", 0, "networked sandboxes' ingress rate limit in Mbit/s when their create sets none (0: no limit)")
	f.Uint32Var(&o.Userns.NetMaxConns, "net-max-conns", 0, "networked sandboxes' limit of open connections each, counted in the host's connection tracking (0 = 4096)")
	httpFlags(f, &o.HTTP)
	f.BoolVar(&verbose, "verbose", false, "debug logging")
	return cmd
}

// httpFlags are the connection limits of the HTTP API (docs/operations.md).
func httpFlags(f *pflag.FlagSet, h *serve.HTTPLimits) {
	f.IntVar(&h.MaxConns, "max-conns", 0, "most HTTP connections held at once; past it a connection is answered 503 and closed (0 = half the descriptor limit, the rest kept for sandboxes)")
	f.IntVar(&h.MaxConnsPerClient, "max-conns-per-client", connlimit.DefaultPerClient, "most HTTP connections of one client address")
	f.DurationVar(&h.HeaderTimeout, "http-header-timeout", serve.DefaultHeaderTimeout, "time a client has to send a request's headers")
	f.DurationVar(&h.IdleTimeout, "http-idle-timeout", serve.DefaultIdleTimeout, "an idle keep-alive HTTP connection is closed after this")
}

// printE2B prints the environment an E2B SDK user sets to reach warren's
// E2B front.
func printE2B(out io.Writer, url, token string) {
	fmt.Fprintf(out, "E2B front is ready (docs/e2b.md)\n  export E2B_API_URL=%s\n  export E2B_SANDBOX_URL=%s\n", url, url)
	if token != "" {
		fmt.Fprintf(out, "  export E2B_API_KEY=%s\n", e2b.E2BKey(token))
	}
}
