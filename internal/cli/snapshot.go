package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

func newSnapshotCmd(g *globals) *cobra.Command {
	var req api.CreateSnapshotRequest
	cmd := &cobra.Command{
		Use:   "snapshot SANDBOX",
		Short: "snapshot a sandbox's filesystem and print the snapshot id (restore: create --snapshot ID)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			snap, err := g.client().Snapshot(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), snap)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), snap.ID)
			return err
		},
	}
	cmd.Flags().StringVar(&req.Name, "name", "", "a name for the snapshot")
	cmd.Flags().BoolVar(&req.Stop, "stop", false, "stop the sandbox after the snapshot")
	return cmd
}

func newForkCmd(g *globals) *cobra.Command {
	var count int
	cmd := &cobra.Command{
		Use:   "fork SANDBOX",
		Short: "make N sandboxes from the sandbox's current filesystem and print their ids",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			res, err := g.client().Fork(cmd.Context(), args[0], count)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			for _, sb := range res.Sandboxes {
				if _, err := fmt.Fprintln(cmd.OutOrStdout(), sb.ID); err != nil {
					return err
				}
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&count, "count", "n", 1, "how many sandboxes")
	return cmd
}

func newTrajCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "traj", Short: "trajectory logs"}
	var path string
	show := &cobra.Command{
		Use:   "show TRAJECTORY",
		Short: "print every step of a trajectory",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			steps, err := g.client().TrajectoryAll(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if path != "" {
				var keep []api.TrajectoryStep
				for _, st := range steps {
					if st.Path == path || st.To == path || strings.HasPrefix(st.Path, strings.TrimSuffix(path, "/")+"/") {
						keep = append(keep, st)
					}
				}
				steps = keep
			}
			if g.json {
				if steps == nil {
					steps = []api.TrajectoryStep{}
				}
				return printJSON(cmd.OutOrStdout(), steps)
			}
			t := newTable(cmd.OutOrStdout(), "STEP", "AT", "OP", "OPERATION", "RESULT")
			for _, st := range steps {
				t.row(fmt.Sprint(st.Step), st.At.Format(time.RFC3339), st.Op, describeOp(&st), describeResult(&st))
			}
			return t.flush()
		},
	}
	show.Flags().StringVar(&path, "path", "", "only the steps that changed this path")
	cmd.AddCommand(show)
	return cmd
}

func describeOp(st *api.TrajectoryStep) string {
	switch {
	case st.Exec != nil && st.Exec.Cmd != "":
		return clip(st.Exec.Cmd, 60)
	case st.Exec != nil:
		return clip(strings.Join(st.Exec.Argv, " "), 60)
	case st.Op == "rename":
		return st.Path + " -> " + st.To
	case st.Op == "write":
		return fmt.Sprintf("%s (%d bytes)", st.Path, st.DataSize)
	}
	return st.Path
}

func describeResult(st *api.TrajectoryStep) string {
	switch {
	case st.Error != nil:
		return st.Error.Code
	case st.Result != nil:
		return fmt.Sprintf("exit %d, %.1f ms", st.Result.ExitCode, st.Result.DurationMs)
	}
	return "ok"
}

func clip(s string, n int) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
