package cli

import (
	"fmt"
	"strconv"
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
	var sandbox string
	ls := &cobra.Command{
		Use:   "ls",
		Short: "list the snapshots of the token's project and the projects below it, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			list, err := g.client().ListSnapshots(cmd.Context(), sandbox)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			t := newTable(cmd.OutOrStdout(), "ID", "NAME", "SANDBOX", "PROJECT", "SIZE", "PARENT", "CREATED")
			for _, sn := range list {
				t.row(sn.ID, sn.Name, sn.Sandbox, sn.Project, fmt.Sprint(sn.Size), sn.Parent, sn.CreatedAt.Format(time.RFC3339))
			}
			return t.flush()
		},
	}
	ls.Flags().StringVar(&sandbox, "sandbox", "", "only this sandbox's snapshots")
	rm := &cobra.Command{
		Use:   "rm SNAPSHOT...",
		Short: "delete snapshots and their layers (one still in use is a 409 saying what uses it)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, id := range args {
				if err := g.client().DeleteSnapshot(cmd.Context(), id); err != nil {
					return fmt.Errorf("%s: %w", id, err)
				}
			}
			return nil
		},
	}
	cmd.AddCommand(ls, rm)
	return cmd
}

func newForkCmd(g *globals) *cobra.Command {
	var count int
	cmd := &cobra.Command{
		Use:   "fork SANDBOX [N]",
		Short: "make N sandboxes (default 1) from the sandbox's current filesystem and print their ids",
		Args:  cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 2 {
				n, err := strconv.Atoi(args[1])
				if err != nil || n < 1 {
					return fmt.Errorf("N %q is not a positive count", args[1])
				}
				if cmd.Flags().Changed("count") && n != count {
					return fmt.Errorf("N %d and --count %d disagree", n, count)
				}
				count = n
			}
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

// trajectoryWithAudit reads every step of a trajectory of the token's
// project, each with its audit records.
func trajectoryWithAudit(cmd *cobra.Command, g *globals, name string) ([]api.TrajectoryStep, error) {
	var steps []api.TrajectoryStep
	var after int64
	for {
		p, err := g.client().TrajectoryAudit(cmd.Context(), name, after, 0)
		if err != nil {
			return nil, err
		}
		steps = append(steps, p.Steps...)
		if p.Next == 0 {
			return steps, nil
		}
		after = p.Next
	}
}

// newTrajCmd is `warren traj`: it reads, compares, replays and deletes
// trajectory logs. --project, for every subcommand, names the project that
// owns the trajectory.
func newTrajCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "traj", Short: "trajectory logs"}
	var project string
	cmd.PersistentFlags().StringVar(&project, "project", "", "the project that owns the trajectory (names are per project; default: the token's)")
	cmd.AddCommand(newTrajShowCmd(g, &project), newTrajDiffCmd(g, &project), newTrajReplayCmd(g, &project), newTrajLsCmd(g), newTrajRmCmd(g, &project))
	return cmd
}

// newTrajShowCmd is `warren traj show`: it prints the steps of a
// trajectory of *project, with their audit records or only the audit's
// summary when asked.
func newTrajShowCmd(g *globals, project *string) *cobra.Command {
	var path string
	var withAudit, auditSummary bool
	show := &cobra.Command{
		Use:   "show TRAJECTORY",
		Short: "print every step of a trajectory",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (withAudit || auditSummary) && *project != "" {
				return fmt.Errorf("--audit and --audit-summary read the token's own project's trajectories (drop --project)")
			}
			if auditSummary {
				sum, err := g.client().TrajectoryAuditSummary(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				if g.json {
					return printJSON(cmd.OutOrStdout(), sum)
				}
				sum.Telemetry = true // kept records: say nothing of the node
				return printAudit(cmd.OutOrStdout(), sum)
			}
			var steps []api.TrajectoryStep
			var err error
			if withAudit {
				steps, err = trajectoryWithAudit(cmd, g, args[0])
			} else {
				steps, err = g.client().TrajectoryAllOf(cmd.Context(), *project, args[0])
			}
			if err != nil {
				return err
			}
			if path != "" {
				steps = stepsOnPath(steps, path)
			}
			return printTrajSteps(cmd, g, steps)
		},
	}
	show.Flags().StringVar(&path, "path", "", "only the steps that changed this path")
	show.Flags().BoolVar(&withAudit, "audit", false, "under each step, what its sandbox's processes did (the kernel's audit records)")
	show.Flags().BoolVar(&auditSummary, "audit-summary", false, "only the audit's counts per step and kind, and the records a policy rule matched")
	return show
}

// stepsOnPath keeps the steps that changed path or a path below it.
func stepsOnPath(steps []api.TrajectoryStep, path string) []api.TrajectoryStep {
	var keep []api.TrajectoryStep
	for _, st := range steps {
		if st.Path == path || st.To == path || strings.HasPrefix(st.Path, strings.TrimSuffix(path, "/")+"/") {
			keep = append(keep, st)
		}
	}
	return keep
}

// printTrajSteps prints steps for `warren traj show`: as JSON, or a table
// with each step's audit records below it.
func printTrajSteps(cmd *cobra.Command, g *globals, steps []api.TrajectoryStep) error {
	if g.json {
		if steps == nil {
			steps = []api.TrajectoryStep{}
		}
		return printJSON(cmd.OutOrStdout(), steps)
	}
	t := newTable(cmd.OutOrStdout(), "STEP", "AT", "OP", "OPERATION", "RESULT")
	for _, st := range steps {
		t.row(fmt.Sprint(st.Step), st.At.Format(time.RFC3339), st.Op, describeOp(&st), describeResult(&st))
		for _, r := range st.Audit {
			t.row("", r.Time.Format("15:04:05.000"), "  "+r.Kind, auditWhat(&r), "")
		}
	}
	return t.flush()
}

// newTrajDiffCmd is `warren traj diff`: it lists the files that the file
// operations of a trajectory of *project changed between two steps, and
// its commands there.
func newTrajDiffCmd(g *globals, project *string) *cobra.Command {
	return &cobra.Command{
		Use:   "diff TRAJECTORY A B",
		Short: "list the files that file operations changed after step A up to step B (commands are listed, not analysed)",
		Args:  cobra.ExactArgs(3),
		RunE: func(cmd *cobra.Command, args []string) error {
			var a, b int64
			if _, err := fmt.Sscanf(args[1], "%d", &a); err != nil || a < 0 {
				return fmt.Errorf("step A %q is not a step number", args[1])
			}
			if _, err := fmt.Sscanf(args[2], "%d", &b); err != nil || b < a {
				return fmt.Errorf("step B %q is not a step number at least A", args[2])
			}
			steps, err := g.client().TrajectoryAllOf(cmd.Context(), *project, args[0])
			if err != nil {
				return err
			}
			changed, order, execs := changedBetween(steps, a, b)
			if g.json {
				return printJSON(cmd.OutOrStdout(), map[string]any{"files": changed, "commands": execs})
			}
			t := newTable(cmd.OutOrStdout(), "PATH", "CHANGE")
			for _, p := range order {
				t.row(p, changed[p])
			}
			for _, st := range execs {
				t.row(fmt.Sprintf("(step %d: %s)", st.Step, describeOp(&st)), "command, not analysed")
			}
			return t.flush()
		},
	}
}

// changedBetween reads the successful steps after a up to b: changed maps
// each path their file operations touched to "changed" or "removed" (its
// last change), order lists those paths as first touched, and execs are
// the commands, which it does not analyse.
func changedBetween(steps []api.TrajectoryStep, a, b int64) (changed map[string]string, order []string, execs []api.TrajectoryStep) {
	changed = map[string]string{}
	note := func(p, what string) {
		if _, ok := changed[p]; !ok {
			order = append(order, p)
		}
		changed[p] = what
	}
	for _, st := range steps {
		if st.Step <= a || st.Step > b || st.Error != nil {
			continue
		}
		switch st.Op {
		case "write", "mkdir":
			note(st.Path, "changed")
		case "remove":
			note(st.Path, "removed")
		case "rename":
			note(st.Path, "removed")
			note(st.To, "changed")
		case "exec":
			execs = append(execs, st)
		}
	}
	return changed, order, execs
}

// newTrajReplayCmd is `warren traj replay`: it re-executes a trajectory of
// *project in a fresh sandbox, lists the steps whose outcome differs, and
// exits with status 1 if any does.
func newTrajReplayCmd(g *globals, project *string) *cobra.Command {
	var rreq api.ReplayRequest
	replay := &cobra.Command{
		Use:   "replay TRAJECTORY [--mask REGEX]... [--ignore FIELD]...",
		Short: "re-execute a trajectory's log in a fresh sandbox and list the steps whose outcome differs (exit status 1 if any)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			rreq.Trajectory, rreq.Project = args[0], *project
			rep, err := g.client().ReplayTrajectoryWith(cmd.Context(), rreq)
			if err != nil {
				return err
			}
			if g.json {
				if err := printJSON(cmd.OutOrStdout(), rep); err != nil {
					return err
				}
			} else {
				t := newTable(cmd.OutOrStdout(), "STEP", "OP", "OPERATION", "DIFFERS", "LOGGED", "NOW")
				for _, d := range rep.Differences {
					t.row(fmt.Sprint(d.Step), d.Op, describeOp(&d.Logged), strings.Join(d.Fields, ","), describeOutcome(&d.Logged, d.Fields), describeOutcome(&d.Got, d.Fields))
				}
				if err := t.flush(); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%d of %d steps differ (%.0f ms, sandbox %s%s)\n", len(rep.Differences), rep.Steps, rep.DurationMs, rep.Sandbox, map[bool]string{true: ", kept"}[rreq.Keep])
			}
			if !rep.Deterministic {
				return &exitError{code: 1}
			}
			return nil
		},
	}
	replay.Flags().BoolVar(&rreq.Keep, "keep", false, "leave the replay's sandbox running")
	replay.Flags().StringArrayVar(&rreq.Masks, "mask", nil, "regular expression whose matches in stdout and stderr are not compared (repeatable)")
	replay.Flags().StringArrayVar(&rreq.Ignore, "ignore", nil, "outcome field not to compare: "+strings.Join(api.ReplayFields, ", ")+" (repeatable)")
	return replay
}

// newTrajLsCmd is `warren traj ls`: it lists the trajectories the token
// sees, with the bytes each stores.
func newTrajLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "ls",
		Short: "list the trajectories of the token's project and the projects below it, with the bytes each stores",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			list, err := g.client().ListTrajectories(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			t := newTable(cmd.OutOrStdout(), "NAME", "PROJECT", "SANDBOX", "BYTES", "CREATED", "EXPIRES")
			for _, tr := range list {
				exp := "-"
				if !tr.ExpiresAt.IsZero() {
					exp = tr.ExpiresAt.Format(time.RFC3339)
				}
				t.row(tr.Name, tr.Project, tr.Sandbox, fmt.Sprint(tr.Bytes), tr.CreatedAt.Format(time.RFC3339), exp)
			}
			return t.flush()
		},
	}
}

// newTrajRmCmd is `warren traj rm`: it deletes trajectories of *project.
func newTrajRmCmd(g *globals, project *string) *cobra.Command {
	return &cobra.Command{
		Use:   "rm TRAJECTORY...",
		Short: "delete trajectories: their logs and the inputs they kept (a live sandbox recording one, or a branch of it, keeps it: 409)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, name := range args {
				if err := g.client().DeleteTrajectory(cmd.Context(), *project, name); err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
			}
			return nil
		},
	}
}

// describeOutcome shows the parts of a step's outcome named in fields.
func describeOutcome(st *api.TrajectoryStep, fields []string) string {
	if st.Error != nil {
		return st.Error.Code
	}
	var parts []string
	for _, f := range fields {
		switch {
		case st.Result != nil && f == "exit_code":
			parts = append(parts, fmt.Sprintf("exit %d", st.Result.ExitCode))
		case st.Result != nil && f == "stdout":
			parts = append(parts, fmt.Sprintf("stdout %q", clip(st.Result.Stdout, 30)))
		case st.Result != nil && f == "stderr":
			parts = append(parts, fmt.Sprintf("stderr %q", clip(st.Result.Stderr, 30)))
		case st.Result != nil && f == "signal":
			parts = append(parts, "signal "+st.Result.Signal)
		case st.Result != nil && f == "timed_out":
			parts = append(parts, fmt.Sprintf("timed out %v", st.Result.TimedOut))
		case st.File != nil && f == "file":
			parts = append(parts, fmt.Sprintf("%s %d bytes mode %o", st.File.Type, st.File.Size, st.File.Mode))
		}
	}
	if len(parts) == 0 {
		return "ok"
	}
	return strings.Join(parts, "; ")
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
