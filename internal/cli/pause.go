package cli

import (
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

// newPauseCmd builds pause (resume false) or resume: by ids, or every
// sandbox whose labels all match (a job-level pause).
func newPauseCmd(g *globals, resume bool) *cobra.Command {
	var (
		labels     []string
		noPrefetch bool
	)
	verb, what := "pause", "freeze sandboxes and push their memory out; any later operation resumes them"
	if resume {
		verb, what = "resume", "thaw paused sandboxes"
	}
	cmd := &cobra.Command{
		Use:   verb + " ID... | " + verb + " -l K=V...",
		Short: what + " (by id, or every sandbox whose labels all match)",
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := parseKV("label", labels)
			if err != nil {
				return err
			}
			switch {
			case len(args) == 0 && len(sel) == 0:
				return fmt.Errorf("name sandboxes by id or by --label K=V")
			case len(args) > 0 && len(sel) > 0:
				return fmt.Errorf("name sandboxes by id or by --label, not both")
			}
			c := g.client()
			res := &api.PauseResult{Sandboxes: []string{}}
			if len(sel) > 0 {
				if resume {
					res, err = c.ResumeMatching(cmd.Context(), sel)
				} else {
					res, err = c.PauseMatching(cmd.Context(), sel)
				}
				if err != nil {
					return err
				}
			} else {
				for _, id := range args {
					if resume {
						var opts api.ResumeRequest
						if noPrefetch {
							f := false
							opts.Prefetch = &f
						}
						_, err = c.ResumeWith(cmd.Context(), id, opts)
					} else {
						_, err = c.Pause(cmd.Context(), id)
					}
					if err != nil {
						if res.Errors == nil {
							res.Errors = map[string]string{}
						}
						res.Errors[id] = errText(err)
						continue
					}
					res.Sandboxes = append(res.Sandboxes, id)
				}
			}
			return printPauseResult(cmd, g, verb, res)
		},
	}
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "every sandbox with label K=V (repeatable: all must match)")
	if resume {
		cmd.Flags().BoolVar(&noPrefetch, "no-prefetch", false, "leave swapped-out memory to page faults instead of reading it back ahead")
	}
	return cmd
}

// printPauseResult prints the ids done, and those that failed on stderr;
// any failure is exit status 1.
func printPauseResult(cmd *cobra.Command, g *globals, verb string, res *api.PauseResult) error {
	if g.json {
		if err := printJSON(cmd.OutOrStdout(), res); err != nil {
			return err
		}
	} else {
		for _, id := range res.Sandboxes {
			fmt.Fprintln(cmd.OutOrStdout(), id)
		}
		ids := make([]string, 0, len(res.Errors))
		for id := range res.Errors {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			fmt.Fprintf(cmd.ErrOrStderr(), "warren: %s %s: %s\n", verb, id, res.Errors[id])
		}
	}
	if len(res.Errors) > 0 {
		return &exitError{code: 1}
	}
	return nil
}

// errText is an error's message without the "warren: " the SDK's errors
// start with (the CLI adds its own).
func errText(err error) string {
	return strings.TrimPrefix(err.Error(), "warren: ")
}
