package cli

import (
	"fmt"
	"math"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/warrenhq/warren/api"
)

// createFlags are the values of `warren create`'s flags: the request's
// fields set as they are, and the text that request parses into it.
type createFlags struct {
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
}

// newCreateCmd is `warren create`: it creates a sandbox from the flags and
// prints its id.
func newCreateCmd(g *globals) *cobra.Command {
	c := &createFlags{}
	cmd := &cobra.Command{
		Use:   "create (--image IMAGE | --snapshot ID | --trajectory T --resume) [flags]",
		Short: "create a sandbox and print its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := c.request(cmd)
			if err != nil {
				return err
			}
			sb, err := g.client().Create(cmd.Context(), *req)
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
	c.register(cmd.Flags())
	return cmd
}

// register defines create's flags on f, with c's fields as their values.
func (c *createFlags) register(f *pflag.FlagSet) {
	f.StringVar(&c.req.Image, "image", "", "image name (required unless --snapshot or --resume)")
	f.StringVar(&c.req.Tier, "tier", "", "isolation tier: container (default), microvm or vm")
	f.BoolVar(&c.req.Display, "display", false, "a virtual screen (tier vm): screenshot, display, input routes")
	f.Float64Var(&c.req.CPU, "cpu", 0, "CPU cores (default 1)")
	f.StringVar(&c.memory, "memory", "", "memory limit: MiB or a size like 512m, 4g (default 512m)")
	f.StringVar(&c.disk, "disk", "", "writable layer limit: MiB or a size like 1g (default 1g)")
	f.Int64Var(&c.req.Pids, "pids", 0, "process limit (default 1024)")
	f.StringVar(&c.ttl, "ttl", "", "maximum lifetime: seconds or a duration like 1h")
	f.StringVar(&c.idle, "idle-timeout", "", "stop after this long without an operation: seconds or a duration")
	f.StringArrayVarP(&c.envs, "env", "e", nil, "environment variable K=V (repeatable)")
	f.StringArrayVarP(&c.labels, "label", "l", nil, "label K=V (repeatable)")
	f.StringVar(&c.req.User, "user", "", "default user for commands")
	f.StringVar(&c.req.Hostname, "hostname", "", "hostname inside the sandbox")
	f.StringVar(&c.req.Snapshot, "snapshot", "", "restore this snapshot (instead of --image)")
	f.StringVar(&c.req.Trajectory, "trajectory", "", "record every operation in this trajectory log")
	f.StringVar(&c.req.Checkpoint, "checkpoint", "", "trajectory checkpoints: none, every-step or a number of steps")
	f.IntVar(&c.req.TrajectoryTTL, "trajectory-ttl", 0, "delete the trajectory (log and inputs) this many seconds after it is made, once no sandbox records it (0 = keep until warren traj rm)")
	f.BoolVar(&c.req.Resume, "resume", false, "re-attach to --trajectory (fast-forward through its log)")
	f.BoolVar(&c.req.Branch, "branch", false, "with --resume: on divergence fork a new trajectory T~k instead of failing")
	f.StringArrayVar(&c.layers, "layer", nil, "named layer above the image, bottom first: REF, or REF:/MOUNT[:protected] to attach it read-only at a mount point (repeatable)")
	f.StringVar(&c.req.Project, "project", "", "project (default: the token's)")
	f.StringVar(&c.req.Priority, "priority", "", "QoS class: best-effort (default) or latency")
	f.StringVar(&c.req.IdleTimeoutAction, "idle-action", "", "what --idle-timeout does: stop (default) or pause")
	f.StringArrayVar(&c.selector, "node-selector", nil, "place only on nodes with label K=V (repeatable)")
	f.StringArrayVar(&c.allow, "allow", nil, "give the sandbox a network and allow this destination: CIDR or ADDR[:PORT][/tcp|/udp], HOST[:PORT] (a name or *.suffix), a network rule's name, or internet (repeatable; implies --network)")
	f.BoolVar(&c.network, "network", false, "give the sandbox a network interface (nothing reachable beyond --allow)")
	f.StringVar(&c.netGroup, "network-group", "", "put the sandbox in this network group ([a-z0-9-]{1,63}): the project's sandboxes of the group on its node reach each other (implies --network)")
	f.IntVar(&c.netRate, "network-egress-rate-mbit", 0, "bound what the sandbox sends, in Mbit/s (0: the node's default; implies --network)")
	f.IntVar(&c.netInRate, "network-ingress-rate-mbit", 0, "bound what the sandbox receives, in Mbit/s (0: the node's default; implies --network)")
	f.IntVar(&c.netMaxConns, "network-max-conns", 0, "bound the sandbox's open connections (0: the node's default; implies --network)")
	f.Float64Var(&c.idleCPU, "idle-cpu", 0, "CPU cores the sandbox's processes get between operations (default: the project's, else 0.05; 0 = frozen between operations)")
	f.StringArrayVar(&c.auditWS, "audit-workspace", nil, "a directory the agent is meant to change: its file operations stay out of the audit (repeatable)")
	f.StringArrayVar(&c.auditPolicy, "audit-policy", nil, "an audit hook KIND:PATTERN=ACTION, e.g. 'write:/opt/toolkit/**=kill-step'; actions flag, kill-step, fail-sandbox (repeatable)")
	f.BoolVar(&c.req.AlwaysOn, "always-on", false, "keep the full --cpu between operations too (a sandbox serving a port, a long job)")
}

// request checks and parses the flags of cmd into c's request and returns
// it.
func (c *createFlags) request(cmd *cobra.Command) (*api.CreateSandboxRequest, error) {
	req := &c.req
	var err error
	if req.Image == "" && req.Snapshot == "" && !req.Resume {
		return nil, fmt.Errorf("--image is required (or --snapshot ID, or --trajectory T --resume)")
	}
	if req.MemoryMB, err = parseSizeMB("memory", c.memory); err != nil {
		return nil, err
	}
	if req.DiskMB, err = parseSizeMB("disk", c.disk); err != nil {
		return nil, err
	}
	t, err := parseSeconds("ttl", c.ttl)
	if err != nil {
		return nil, err
	}
	req.TTL = int64(math.Ceil(t))
	t, err = parseSeconds("idle-timeout", c.idle)
	if err != nil {
		return nil, err
	}
	req.IdleTimeout = int64(math.Ceil(t))
	if req.Env, err = parseKV("env", c.envs); err != nil {
		return nil, err
	}
	if req.Labels, err = parseKV("label", c.labels); err != nil {
		return nil, err
	}
	if req.NodeSelector, err = parseKV("node-selector", c.selector); err != nil {
		return nil, err
	}
	if cmd.Flags().Changed("idle-cpu") {
		if c.idleCPU < 0 {
			return nil, fmt.Errorf("--idle-cpu must be 0 or more cores")
		}
		req.IdleCPU = &c.idleCPU
	}
	if req.Layers, err = appendLayers(req.Layers, c.layers); err != nil {
		return nil, err
	}
	if c.network || len(c.allow) > 0 || c.netGroup != "" || c.netRate != 0 || c.netInRate != 0 || c.netMaxConns != 0 {
		req.Network = &api.NetworkSpec{Egress: append([]string{}, c.allow...), Group: c.netGroup, EgressRateMbit: c.netRate,
			IngressRateMbit: c.netInRate, MaxConns: c.netMaxConns}
	}
	if len(c.auditWS) > 0 || len(c.auditPolicy) > 0 {
		if req.Audit, err = auditSpec(c.auditWS, c.auditPolicy); err != nil {
			return nil, err
		}
	}
	return req, nil
}

// auditSpec is the audit of a sandbox: the workspace directories kept out
// of it, and the policy rules of --audit-policy (KIND:PATTERN=ACTION).
func auditSpec(workspace, policy []string) (*api.AuditSpec, error) {
	audit := &api.AuditSpec{Workspace: workspace}
	for _, p := range policy {
		i := strings.LastIndex(p, "=")
		if i <= 0 {
			return nil, fmt.Errorf("--audit-policy %q: want KIND:PATTERN=ACTION, e.g. 'write:/opt/toolkit/**=kill-step'", p)
		}
		audit.Policy = append(audit.Policy, api.AuditRule{On: p[:i], Do: p[i+1:]})
	}
	return audit, nil
}

// appendLayers appends the layers of the --layer values refs to dst, in
// order (see parseLayer).
func appendLayers(dst []api.LayerAttachment, refs []string) ([]api.LayerAttachment, error) {
	for _, l := range refs {
		a, err := parseLayer(l)
		if err != nil {
			return dst, err
		}
		dst = append(dst, a)
	}
	return dst, nil
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
