package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

func newEventsCmd(g *globals) *cobra.Command {
	var follow bool
	var after uint64
	var limit int
	cmd := &cobra.Command{
		Use:   "events",
		Short: "print cluster events (node down/up, sandboxes lost); -f follows the stream",
		Long: `warren events prints the events of the cluster the token may see, oldest first.
With -f it keeps printing them as they happen (a stream that resumes by itself after a
broken connection) until interrupted or, with --limit, after that many events. --after N
starts after event sequence number N (the SEQ column).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			c := g.client()
			print := func(ev api.Event) error {
				if g.json {
					b, err := json.Marshal(ev)
					if err != nil {
						return err
					}
					_, err = fmt.Fprintf(out, "%s\n", b)
					return err
				}
				return printEvent(out, ev)
			}
			if !follow {
				if limit <= 0 {
					limit = 100
				}
				list, err := c.Events(cmd.Context(), after, limit, 0)
				if err != nil {
					return err
				}
				for _, ev := range list.Events {
					if err := print(ev); err != nil {
						return err
					}
				}
				return nil
			}
			ctx, cancel := context.WithCancel(cmd.Context())
			defer cancel()
			n := 0
			errEnough := errors.New("enough")
			err := c.FollowEvents(ctx, after, func(ev api.Event) error {
				if err := print(ev); err != nil {
					return err
				}
				if n++; limit > 0 && n >= limit {
					return errEnough
				}
				return nil
			})
			if errors.Is(err, errEnough) || errors.Is(err, context.Canceled) {
				return nil
			}
			return err
		},
	}
	f := cmd.Flags()
	f.BoolVarP(&follow, "follow", "f", false, "keep printing events as they happen")
	f.Uint64Var(&after, "after", 0, "start after this event sequence number")
	f.IntVar(&limit, "limit", 0, "stop after this many events (default without -f: 100)")
	return cmd
}

func printEvent(w io.Writer, ev api.Event) error {
	subject := ev.Node
	if ev.Sandbox != "" {
		subject = ev.Sandbox
	}
	_, err := fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", ev.Seq, ev.Time.Local().Format(time.RFC3339), ev.Type, subject, ev.Message)
	return err
}
