package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

// newPoolCmd is `warren pool`: it manages the warm pools.
func newPoolCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "pool", Short: "warm pools: sandboxes kept ready on every node, claimed by creates of the same shape"}
	ls, create := newPoolLsCmd(g), newPoolCreateCmd(g)
	get := &cobra.Command{
		Use:   "get NAME",
		Short: "show one warm pool",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := g.client().Pool(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), p)
		},
	}
	rm := &cobra.Command{
		Use:     "rm NAME...",
		Aliases: []string{"delete"},
		Short:   "delete warm pools; their unclaimed sandboxes are stopped",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			failed := 0
			for _, name := range args {
				if _, err := g.client().DeletePool(cmd.Context(), name); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "warren: pool rm %s: %s\n", name, errText(err))
					failed++
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), name)
			}
			if failed > 0 {
				return &exitError{code: 1}
			}
			return nil
		},
	}
	cmd.AddCommand(ls, create, get, rm)
	return cmd
}

// newPoolLsCmd is `warren pool ls`: it lists the warm pools.
func newPoolLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "list the warm pools",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			pools, err := g.client().Pools(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				if pools == nil {
					pools = []api.Pool{}
				}
				return printJSON(cmd.OutOrStdout(), api.PoolList{Pools: pools})
			}
			t := newTable(cmd.OutOrStdout(), "NAME", "IMAGE", "TIER", "CPU", "MEMORY", "SIZE", "READY", "CREATING", "CLAIMED", "ERROR")
			for _, p := range pools {
				t.row(p.Name, p.Image, p.Tier, fmtFloat(p.CPU), bytesMB(p.MemoryMB), fmt.Sprint(p.Size), fmt.Sprint(p.Ready),
					fmt.Sprint(p.Creating), fmt.Sprint(p.Claimed), orDash(p.Error))
			}
			return t.flush()
		},
	}
}

// newPoolCreateCmd is `warren pool create`: it creates or resizes a warm
// pool and prints its name.
func newPoolCreateCmd(g *globals) *cobra.Command {
	var (
		req          api.PoolRequest
		memory, disk string
	)
	cmd := &cobra.Command{
		Use:   "create NAME --image IMAGE --size N [flags]",
		Short: "create a warm pool (or resize one of the same shape) and print its name",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			req.Name = args[0]
			if req.Image == "" {
				return fmt.Errorf("--image is required")
			}
			if req.MemoryMB, err = parseSizeMB("memory", memory); err != nil {
				return err
			}
			if req.DiskMB, err = parseSizeMB("disk", disk); err != nil {
				return err
			}
			p, err := g.client().CreatePool(cmd.Context(), req)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), p)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), p.Name)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&req.Image, "image", "", "image of the pool's sandboxes (required)")
	f.IntVar(&req.Size, "size", 1, "sandboxes kept ready per node (0 empties the pool)")
	f.StringVar(&req.Tier, "tier", "", "isolation tier: container (default), microvm or vm")
	f.Float64Var(&req.CPU, "cpu", 0, "CPU cores (default 1)")
	f.StringVar(&memory, "memory", "", "memory limit: MiB or a size like 512m (default 512m)")
	f.StringVar(&disk, "disk", "", "writable layer limit: MiB or a size like 1g (default 1g)")
	f.Int64Var(&req.Pids, "pids", 0, "process limit (default 1024)")
	f.StringVar(&req.Priority, "priority", "", "QoS class: best-effort (default) or latency")
	return cmd
}

// orDash is s, or "-" when s is empty (a table's empty cell).
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
