package cli

import (
	"fmt"
	"math"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

func newCreateCmd(g *globals) *cobra.Command {
	var (
		req          api.CreateSandboxRequest
		memory, disk string
		ttl, idle    string
		envs, labels []string
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
	f.StringVar(&req.Tier, "tier", "", "isolation tier (default container)")
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
	f.BoolVar(&req.Resume, "resume", false, "re-attach to --trajectory (fast-forward through its log)")
	return cmd
}
