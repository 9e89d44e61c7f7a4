package cli

import (
	"fmt"
	"math"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

func newCreateCmd(g *globals) *cobra.Command {
	var (
		req          api.CreateSandboxRequest
		memory, disk string
		ttl, idle    string
		envs, labels []string
		layers       []string
		selector     []string
		allow        []string
		auditWS      []string
		auditPolicy  []string
		network      bool
		netGroup     string
		netRate      int
		netInRate    int
		netMaxConns  int
		idleCPU      float64
	)
	cmd := &cobra.Command{
		Use:   "create (--image IMAGE | --snapshot ID | --trajectory T --resume) [flags]",
		Short: "create a sandbox and print its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if req.Image == "" && req.Snapshot == "" && !req.Resume {
				return fmt.Errorf("--image is required (or --snapshot ID, or --trajectory T --resume)")
			}
			if req.MemoryMB, err = parseSizeMB("memory", memory); err != nil {
				return err
			}
			if req.DiskMB, err = parseSizeMB("disk", disk); err != nil {
				return err
			}
			t, err := parseSeconds("ttl", ttl)
			if err != nil {
				return err
			}
			req.TTL = int64(math.Ceil(t))
			t, err = parseSeconds("idle-timeout", idle)
			if err != nil {
				return err
			}
			req.IdleTimeout = int64(math.Ceil(t))
			if req.Env, err = parseKV("env", envs); err != nil {
				return err
			}
			if req.Labels, err = parseKV("label", labels); err != nil {
				return err
			}
			if req.NodeSelector, err = parseKV("node-selector", selector); err != nil {
				return err
			}
			if cmd.Flags().Changed("idle-cpu") {
				if idleCPU < 0 {
					return fmt.Errorf("--idle-cpu must be 0 or more cores")
				}
				req.IdleCPU = &idleCPU
			}
			for _, l := range layers {
				a, err := parseLayer(l)
				if err != nil {
					return err
				}
				req.Layers = append(req.Layers, a)
			}
			if network || len(allow) > 0 || netGroup != "" || netRate != 0 || netInRate != 0 || netMaxConns != 0 {
				req.Network = &api.NetworkSpec{Egress: append([]string{}, allow...), Group: netGroup, EgressRateMbit: netRate,
					IngressRateMbit: netInRate, MaxConns: netMaxConns}
			}
			if len(auditWS) > 0 || len(auditPolicy) > 0 {
				req.Audit = &api.AuditSpec{Workspace: auditWS}
				for _, p := range auditPolicy {
					i := strings.LastIndex(p, "=")
					if i <= 0 {
						return fmt.Errorf("--audit-policy %q: want KIND:PATTERN=ACTION, e.g. 'write:/opt/toolkit/**=kill-step'", p)
					}
					req.Audit.Policy = append(req.Audit.Policy, api.AuditRule{On: p[:i], Do: p[i+1:]})
				}
			}
			sb, err := g.client().Create(cmd.Context(), req)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), sb)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), sb.ID)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Image, "image", "", "image name (required unless --snapshot or --resume)")
	f.StringVar(&req.Tier, "tier", "", "isolation tier: container (default), microvm or vm")
	f.BoolVar(&req.Display, "display", false, "a virtual screen (tier vm): screenshot, display, input routes")
	f.Float64Var(&req.CPU, "cpu", 0, "CPU cores (default 1)")
	f.StringVar(&memory, "memory", "", "memory limit: MiB or a size like 512m, 4g (default 512m)")
	f.StringVar(&disk, "disk", "", "writable layer limit: MiB or a size like 1g (default 1g)")
	f.Int64Var(&req.Pids, "pids", 0, "process limit (default 1024)")
	f.StringVar(&ttl, "ttl", "", "maximum lifetime: seconds or a duration like 1h")
	f.StringVar(&idle, "idle-timeout", "", "stop after this long without an operation: seconds or a duration")
	f.StringArrayVarP(&envs, "env", "e", nil, "environment variable K=V (repeatable)")
	f.StringArrayVarP(&labels, "label", "l", nil, "label K=V (repeatable)")
	f.StringVar(&req.User, "user", "", "default user for commands")
	f.StringVar(&req.Hostname, "hostname", "", "hostname inside the sandbox")
	f.StringVar(&req.Snapshot, "snapshot", "", "restore this snapshot (instead of --image)")
	f.StringVar(&req.Trajectory, "trajectory", "", "record every operation in this trajectory log")
	f.StringVar(&req.Checkpoint, "checkpoint", "", "trajectory checkpoints: none, every-step or a number of steps")
	f.IntVar(&req.TrajectoryTTL, "trajectory-ttl", 0, "delete the trajectory (log and inputs) this many seconds after it is made, once no sandbox records it (0 = keep until warren traj rm)")
	f.BoolVar(&req.Resume, "resume", false, "re-attach to --trajectory (fast-forward through its log)")
	f.BoolVar(&req.Branch, "branch", false, "with --resume: on divergence fork a new trajectory T~k instead of failing")
	f.StringArrayVar(&layers, "layer", nil, "named layer above the image, bottom first: REF, or REF:/MOUNT[:protected] to attach it read-only at a mount point (repeatable)")
	f.StringVar(&req.Project, "project", "", "project (default: the token's)")
	f.StringVar(&req.Priority, "priority", "", "QoS class: best-effort (default) or latency")
	f.StringVar(&req.IdleTimeoutAction, "idle-action", "", "what --idle-timeout does: stop (default) or pause")
	f.StringArrayVar(&selector, "node-selector", nil, "place only on nodes with label K=V (repeatable)")
	f.StringArrayVar(&allow, "allow", nil, "give the sandbox a network and allow this destination: CIDR or ADDR[:PORT][/tcp|/udp], HOST[:PORT] (a name or *.suffix), a network rule's name, or internet (repeatable; implies --network)")
	f.BoolVar(&network, "network", false, "give the sandbox a network interface (nothing reachable beyond --allow)")
	f.StringVar(&netGroup, "network-group", "", "put the sandbox in this network group ([a-z0-9-]{1,63}): the project's sandboxes of the group on its node reach each other (implies --network)")
	f.IntVar(&netRate, "network-egress-rate-mbit", 0, "bound what the sandbox sends, in Mbit/s (0: the node's default; implies --network)")
	f.IntVar(&netInRate, "network-ingress-rate-mbit", 0, "bound what the sandbox receives, in Mbit/s (0: the node's default; implies --network)")
	f.IntVar(&netMaxConns, "network-max-conns", 0, "bound the sandbox's open connections (0: the node's default; implies --network)")
	f.Float64Var(&idleCPU, "idle-cpu", 0, "CPU cores the sandbox's processes get between operations (default: the project's, else 0.05; 0 = frozen between operations)")
	f.StringArrayVar(&auditWS, "audit-workspace", nil, "a directory the agent is meant to change: its file operations stay out of the audit (repeatable)")
	f.StringArrayVar(&auditPolicy, "audit-policy", nil, "an audit hook KIND:PATTERN=ACTION, e.g. 'write:/opt/toolkit/**=kill-step'; actions flag, kill-step, fail-sandbox (repeatable)")
	f.BoolVar(&req.AlwaysOn, "always-on", false, "keep the full --cpu between operations too (a sandbox serving a port, a long job)")
	return cmd
}

// parseLayer reads a --layer value: "REF" stacks the layer into the root;
// "REF:/MOUNT" attaches it read-only at MOUNT, ":protected" after it makes
// it protected (usable by run --trusted, out of the sandbox's reach).
func parseLayer(v string) (api.LayerAttachment, error) {
	ref, rest, hasMount := strings.Cut(v, ":")
	a := api.LayerAttachment{Layer: ref}
	if ref == "" {
		return a, fmt.Errorf("--layer %q: want REF or REF:/MOUNT[:protected]", v)
	}
	if !hasMount {
		return a, nil
	}
	mount, opt, hasOpt := strings.Cut(rest, ":")
	if !strings.HasPrefix(mount, "/") {
		return a, fmt.Errorf("--layer %q: the mount point must be an absolute path", v)
	}
	a.Mount = mount
	switch {
	case !hasOpt:
	case opt == "protected":
		a.Protected = true
	default:
		return a, fmt.Errorf("--layer %q: unknown option %q (want protected)", v, opt)
	}
	return a, nil
}
