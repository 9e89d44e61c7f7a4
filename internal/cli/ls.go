package cli

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

func newLsCmd(g *globals) *cobra.Command {
	var (
		labels []string
		state  string
		all    bool
	)
	cmd := &cobra.Command{
		Use:     "ls [--label K=V] [--state STATE | --all]",
		Aliases: []string{"list", "ps"},
		Short:   "list live sandboxes (creating, running, paused); --all adds stopped, failed and lost ones",
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
			if !all && state == "" {
				sbs = liveOnly(sbs)
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
	cmd.Flags().StringVar(&state, "state", "", "only sandboxes in this state (creating, running, paused, stopped, failed, lost)")
	cmd.Flags().BoolVarP(&all, "all", "a", false, "also the sandboxes that ended (stopped, failed, lost)")
	return cmd
}

// liveOnly keeps the sandboxes that have not ended.
func liveOnly(sbs []api.Sandbox) []api.Sandbox {
	var out []api.Sandbox
	for _, s := range sbs {
		switch s.State {
		case api.StateCreating, api.StateRunning, api.StatePaused:
			out = append(out, s)
		}
	}
	return out
}

func newRmCmd(g *globals) *cobra.Command {
	var labels []string
	cmd := &cobra.Command{
		Use:     "rm ID... | rm -l K=V...",
		Aliases: []string{"delete", "stop"},
		Short:   "stop and remove sandboxes, by id or every live one whose labels all match",
		RunE: func(cmd *cobra.Command, args []string) error {
			c := g.client()
			sel, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			switch {
			case len(args) == 0 && len(sel) == 0:
				return fmt.Errorf("name sandboxes by id or by --label K=V")
			case len(args) > 0 && len(sel) > 0:
				return fmt.Errorf("name sandboxes by id or by --label, not both")
			case len(sel) > 0:
				sbs, err := c.List(cmd.Context(), warren.ListOptions{Labels: sel})
				if err != nil {
					return err
				}
				for _, s := range liveOnly(sbs) {
					args = append(args, s.ID)
				}
			}
			results := deleteAll(cmd.Context(), c, args)
			var done []api.Sandbox
			failed := 0
			for i, r := range results {
				if r.err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "warren: rm %s: %s\n", args[i], errText(r.err))
					failed++
					continue
				}
				done = append(done, *r.sb)
				if !g.json {
					fmt.Fprintln(cmd.OutOrStdout(), r.sb.ID)
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
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "every live sandbox with label K=V (repeatable: all must match)")
	return cmd
}

// rmParallel bounds how many deletes warren rm sends at once.
const rmParallel = 8

type deleted struct {
	sb  *api.Sandbox
	err error
}

// deleteAll deletes the sandboxes ids, rmParallel at a time, and returns
// the outcomes in the order of ids.
func deleteAll(ctx context.Context, c *warren.Client, ids []string) []deleted {
	out := make([]deleted, len(ids))
	sem := make(chan struct{}, rmParallel)
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			sb, err := c.Delete(ctx, id)
			out[i] = deleted{sb, err}
		}()
	}
	wg.Wait()
	return out
}
