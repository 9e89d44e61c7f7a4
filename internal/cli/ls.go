package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

func newLsCmd(g *globals) *cobra.Command {
	var (
		labels []string
		state  string
	)
	cmd := &cobra.Command{
		Use:     "ls [--label K=V] [--state STATE]",
		Aliases: []string{"list", "ps"},
		Short:   "list sandboxes",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			sbs, err := g.client().List(cmd.Context(), warren.ListOptions{Labels: l, State: state})
			if err != nil {
				return err
			}
			if g.json {
				if sbs == nil {
					sbs = []api.Sandbox{}
				}
				return printJSON(cmd.OutOrStdout(), api.SandboxList{Sandboxes: sbs})
			}
			now := time.Now()
			t := newTable(cmd.OutOrStdout(), "ID", "STATE", "IMAGE", "NODE", "CPU", "MEMORY", "AGE", "LABELS")
			for _, s := range sbs {
				t.row(s.ID, s.State, s.Image, s.Node, fmtFloat(s.CPU), bytesMB(s.MemoryMB), age(s.CreatedAt, now), labelString(s.Labels))
			}
			return t.flush()
		},
	}
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "only sandboxes with label K=V (repeatable)")
	cmd.Flags().StringVar(&state, "state", "", "only sandboxes in this state (creating, running, stopped, failed)")
	return cmd
}

func newRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"delete", "stop"},
		Short:   "stop and remove sandboxes",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c := g.client()
			var done []api.Sandbox
			failed := 0
			for _, id := range args {
				sb, err := c.Delete(cmd.Context(), id)
				if err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "warren: rm %s: %v\n", id, err)
					failed++
					continue
				}
				done = append(done, *sb)
				if !g.json {
					fmt.Fprintln(cmd.OutOrStdout(), sb.ID)
				}
			}
			if g.json {
				if done == nil {
					done = []api.Sandbox{}
				}
				if err := printJSON(cmd.OutOrStdout(), api.SandboxList{Sandboxes: done}); err != nil {
					return err
				}
			}
			if failed > 0 {
				return &exitError{code: 1}
			}
			return nil
		},
	}
}
