package cli

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

func newLogsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "logs SANDBOX",
		Short: "show a sandbox's recent commands and how each ended (exit code, signal, timeout)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cmds, err := g.client().Commands(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				if cmds == nil {
					cmds = []api.CommandRecord{}
				}
				return printJSON(cmd.OutOrStdout(), api.CommandHistory{Commands: cmds})
			}
			t := newTable(cmd.OutOrStdout(), "STARTED", "EXIT", "DURATION", "COMMAND")
			for i := range cmds {
				c := &cmds[i]
				t.row(c.StartedAt.Local().Format(time.TimeOnly), outcome(c), fmt.Sprintf("%.1fms", c.DurationMs), commandText(c))
			}
			return t.flush()
		},
	}
}

// outcome is a command record's end in a few characters.
func outcome(c *api.CommandRecord) string {
	switch {
	case c.Error != "":
		return "error"
	case c.TimedOut:
		return "timeout"
	case c.OOMKilled:
		return "oom"
	case c.Signal != "":
		return c.Signal
	case c.ExitCode != nil:
		return fmt.Sprint(*c.ExitCode)
	case c.CommandID != "":
		return "bg"
	}
	return "-"
}

func commandText(c *api.CommandRecord) string {
	s := c.Cmd
	if s == "" {
		s = strings.Join(c.Argv, " ")
	}
	s = clip(s, 80)
	if c.Trusted {
		s = "[trusted] " + s
	}
	if c.CommandID != "" {
		s += " (" + c.CommandID + ")"
	}
	if c.Error != "" {
		s += ": " + c.Error
	}
	return s
}

func newStatsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "stats SANDBOX",
		Short: "show what a sandbox uses now (CPU time, memory) beside its limits",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := g.client().Stats(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), st)
			}
			pct := 0.0
			if st.MemoryLimitMB > 0 {
				pct = 100 * float64(st.MemoryBytes) / float64(st.MemoryLimitMB<<20)
			}
			t := newTable(cmd.OutOrStdout(), "ID", "STATE", "CPU TIME", "CPU LIMIT", "MEMORY", "MEMORY LIMIT", "MEM %", "COMMANDS")
			t.row(st.ID, st.State, fmt.Sprintf("%.2fs", st.CPUSeconds), fmtFloat(st.CPU), humanBytes(st.MemoryBytes), bytesMB(st.MemoryLimitMB),
				fmt.Sprintf("%.1f%%", pct), fmt.Sprint(st.Commands))
			return t.flush()
		},
	}
}
