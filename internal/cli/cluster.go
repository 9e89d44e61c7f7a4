package cli

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/warrenhq/warren/internal/bus"
	"github.com/warrenhq/warren/internal/edge"
	"github.com/warrenhq/warren/internal/serve"
)

// natsFlags adds the flags that say how to reach an external NATS cluster.
func natsFlags(f *pflag.FlagSet, c *bus.DialConfig) {
	f.StringVar(&c.URLs, "nats", "", "NATS server URLs, comma-separated (nats://host:4222,... or tls://...)")
	f.StringVar(&c.Creds, "nats-creds", "", "NATS credentials file (JWT and NKey seed)")
	f.StringVar(&c.NKeySeed, "nats-nkey", "", "file holding an NKey seed")
	f.StringVar(&c.User, "nats-user", "", "NATS user name")
	f.StringVar(&c.Password, "nats-password", "", "NATS password (env WARREN_NATS_PASSWORD)")
	f.StringVar(&c.Token, "nats-token", "", "NATS auth token (env WARREN_NATS_TOKEN)")
	f.StringVar(&c.TLSCA, "nats-tls-ca", "", "CA bundle that signs the NATS servers' certificates")
	f.StringVar(&c.TLSCert, "nats-tls-cert", "", "client certificate for mutual TLS")
	f.StringVar(&c.TLSKey, "nats-tls-key", "", "client key for mutual TLS")
	f.IntVar(&c.Replicas, "replicas", 1, "replicas of the JetStream buckets and streams this process creates (3 on a three-server cluster)")
}

func natsFromEnv(c *bus.DialConfig) {
	if c.Password == "" {
		c.Password = os.Getenv("WARREN_NATS_PASSWORD")
	}
	if c.Token == "" {
		c.Token = os.Getenv("WARREN_NATS_TOKEN")
	}
}

func logger(verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// tuneGC lets the garbage collector run less often in the control-plane
// processes (their live heap is tens of MiB; at GOGC=100 collection took
// ~9% of an apiserver's CPU under create load). GOGC in the environment wins.
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
}

func newAPIServerCmd() *cobra.Command {
	var o serve.APIOptions
	var verbose bool
	cmd := &cobra.Command{
		Use:   "apiserver",
		Short: "run one apiserver replica (HTTP API, IAM, placement, watcher) against an external NATS cluster",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			natsFromEnv(&o.NATS)
			tuneGC()
			o.Logger = logger(verbose)
			out := cmd.OutOrStdout()
			o.Ready = func(url, token string) {
				if token != "" {
					fmt.Fprintf(out, "warren apiserver is ready\n  URL:   %s\n  token: %s\n", url, token)
				} else {
					fmt.Fprintf(out, "warren apiserver is ready\n  URL:   %s\n", url)
				}
			}
			o.E2BReady = func(url, token string) { printE2B(out, url, token) }
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return serve.RunAPIServer(ctx, o)
		},
	}
	f := cmd.Flags()
	natsFlags(f, &o.NATS)
	f.StringVar(&o.Listen, "listen", "127.0.0.1:7070", "API listen address")
	f.StringVar(&o.DataDir, "data-dir", "/var/lib/warren", "state directory (the bootstrap admin token is written here)")
	f.StringVar(&o.E2BListen, "e2b-listen", "", "also serve E2B's control plane (the official e2b SDKs' E2B_API_URL) on this address (default: off)")
	httpFlags(f, &o.HTTP)
	f.BoolVar(&verbose, "verbose", false, "debug logging")
	_ = cmd.MarkFlagRequired("nats")
	return cmd
}

func newEdgeCmd() *cobra.Command {
	var o serve.EdgeOptions
	var verbose bool
	var labels []string
	cmd := &cobra.Command{
		Use:   "edge",
		Short: "run the edge of this node (sandboxes, admission, storage) against an external NATS cluster",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			natsFromEnv(&o.NATS)
			o.Logger = logger(verbose)
			o.Labels = map[string]string{}
			for _, l := range labels {
				k, v, ok := strings.Cut(l, "=")
				if !ok || k == "" {
					return fmt.Errorf("--label %q is not key=value", l)
				}
				o.Labels[k] = v
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return serve.RunEdge(ctx, o)
		},
	}
	f := cmd.Flags()
	natsFlags(f, &o.NATS)
	f.StringVar(&o.Node, "node", "", "node name (default: the hostname)")
	f.StringVar(&o.DataDir, "data-dir", "/var/lib/warren", "this node's state directory (sandboxes, writable layers)")
	f.StringVar(&o.Store, "store", "", "image store directory, shared by the nodes of a cluster (default: <data-dir>/images)")
	f.StringVar(&o.AgentPath, "agent", "", "path of warren-agent (default: beside this binary)")
	f.StringArrayVar(&labels, "label", nil, "node label key=value, matched by node_selector (repeatable)")
	f.Float64Var(&o.CPUOvercommit, "cpu-overcommit", 20, "CPU overcommit factor used by admission")
	f.Float64Var(&o.MemoryOvercommit, "memory-overcommit", 1.5, "memory overcommit factor used by admission")
	f.Float64Var(&o.DiskOvercommit, "disk-overcommit", serve.DefaultDiskOvercommit, "disk overcommit factor used by admission: disk_mb is admitted up to what the scratch filesystem can really hold × this")
	f.BoolVar(&o.KeepOnShutdown, "keep-sandboxes", false, "leave sandboxes running on shutdown (they are adopted at the next start)")
	f.IntVar(&o.Recycle, "recycle", serve.DefaultRecycle, "containers of deleted sandboxes kept per shape, wiped, for reuse by new sandboxes (0 = none: a new container for every sandbox)")
	f.DurationVar(&o.RecycleIdle, "recycle-idle", edge.DefaultRecycleIdle, "how long a recycled container waits for a sandbox of its shape before it is destroyed")
	f.BoolVar(&o.NoTelemetry, "no-telemetry", false, "do not load the node's BPF telemetry (the audit of sandboxes then records nothing)")
	f.BoolVar(&o.TelemetryRefusals, "telemetry-refusals", false, "also audit every syscall of a sandbox refused with EPERM (slows every syscall of the host)")
	f.BoolVar(&o.TelemetryFiles, "telemetry-files", false, "also audit the file writes, renames, unlinks and chmods of sandbox processes (slows every syscall of the host)")
	f.StringVar(&o.DataListen, "data-listen", serve.DefaultDataListen, "address of the data listener, where apiservers stream exec output and files (HTTP/2, grants signed with the cluster's key)")
	f.StringVar(&o.DataAdvertise, "data-advertise", "", "address apiservers dial for the data listener (default: the listener's address)")
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
	f.BoolVar(&verbose, "verbose", false, "debug logging")
	_ = cmd.MarkFlagRequired("nats")
	return cmd
}

func newNATSCmd() *cobra.Command {
	var cfg bus.EmbeddedConfig
	var routes, authDir, nodes string
	cmd := &cobra.Command{
		Use:   "nats",
		Short: "run a NATS server with JetStream (for development clusters and tests; use the official nats-server in production)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if routes != "" {
				cfg.Routes = strings.Split(routes, ",")
			}
			if cfg.ServerName == "" {
				cfg.ServerName = "warren-nats-" + strings.NewReplacer(":", "-", ".", "-").Replace(cfg.Listen)
			}
			cfg.DataDir = filepath.Clean(cfg.DataDir)
			if !cfg.NoAuth {
				if authDir == "" {
					authDir = filepath.Join(cfg.DataDir, "auth")
				}
				var names []string
				if nodes != "" {
					names = strings.Split(nodes, ",")
				}
				auth, err := bus.EnsureAuth(authDir, names)
				if err != nil {
					return err
				}
				cfg.Auth = auth
			}
			srv, err := bus.StartEmbedded(cfg)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "nats is ready\n  URL: %s\n", srv.ClientURL())
			if cfg.Auth != nil {
				fmt.Fprintf(out, "  apiserver credentials: %s\n", cfg.Auth.Path(bus.RoleAPIServer, ""))
				for _, n := range cfg.Auth.Nodes() {
					fmt.Fprintf(out, "  edge %s credentials: %s\n", n, cfg.Auth.Path(bus.RoleEdge, n))
				}
			} else {
				fmt.Fprintln(out, "  WARNING: no authentication (--no-auth): anyone who reaches this port controls the cluster")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			<-ctx.Done()
			srv.Shutdown()
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:4222", "client listen address")
	f.StringVar(&cfg.DataDir, "data-dir", "/var/lib/warren-nats", "JetStream storage (under <data-dir>/nats)")
	f.StringVar(&cfg.ServerName, "name", "", "server name, unique in the cluster")
	f.StringVar(&cfg.ClusterName, "cluster-name", "warren", "cluster name")
	f.StringVar(&cfg.ClusterListen, "cluster-listen", "", "route listen address (host:port); empty: no cluster")
	f.BoolVar(&cfg.Log, "log", false, "write the NATS server log to stderr")
	f.StringVar(&authDir, "auth-dir", "", "credentials directory: apiserver.nk, edge-<node>.nk (NKey seeds, made when missing) and the route secret; share it between the servers of a cluster (default: <data-dir>/auth)")
	f.StringVar(&nodes, "nodes", "", "edge nodes to make credentials for, comma-separated (each edge runs with --nats-nkey <auth-dir>/edge-<node>.nk)")
	f.StringVar(&cfg.TLSCert, "tls-cert", "", "server certificate: clients (tls:// URLs, --nats-tls-ca) and routes speak TLS")
	f.StringVar(&cfg.TLSKey, "tls-key", "", "the certificate's key")
	f.StringVar(&cfg.TLSCA, "tls-ca", "", "CA that signs the other servers' certificates (routes verify each other)")
	f.BoolVar(&cfg.NoAuth, "no-auth", false, "accept clients without credentials, with every permission (benchmarks of authentication's cost only)")
	f.StringVar(&routes, "routes", "", "routes to the other servers, comma-separated (nats-route://host:port)")
	cmd.AddCommand(newNATSKeysCmd())
	return cmd
}

// newNATSKeysCmd makes the bus's credentials without running a server (for
// the official nats-server: deploy/systemd/nats.conf takes the public keys).
func newNATSKeysCmd() *cobra.Command {
	var authDir, nodes string
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "make the missing NKey seeds of the apiservers and of each node in --auth-dir, and print their public keys",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var names []string
			if nodes != "" {
				names = strings.Split(nodes, ",")
			}
			auth, err := bus.EnsureAuth(authDir, names)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "apiserver\t%s\t%s\n", auth.PublicKey(bus.RoleAPIServer, ""), auth.Path(bus.RoleAPIServer, ""))
			for _, n := range auth.Nodes() {
				fmt.Fprintf(out, "edge %s\t%s\t%s\n", n, auth.PublicKey(bus.RoleEdge, n), auth.Path(bus.RoleEdge, n))
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&authDir, "auth-dir", "", "credentials directory")
	cmd.Flags().StringVar(&nodes, "nodes", "", "nodes to make credentials for, comma-separated")
	_ = cmd.MarkFlagRequired("auth-dir")
	return cmd
}
