package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

func newAuditCmd(g *globals) *cobra.Command {
	var step int64
	var kind string
	var summary, follow bool
	cmd := &cobra.Command{
		Use:   "audit ID",
		Short: "print what a sandbox's processes did (execs, signals to its agent, refusals, file changes), from its node's kernel",
		Long: `warren audit ID prints the sandbox's audit, oldest first: every exec of its processes,
every signal sent to its PID 1 (its agent), on nodes started with --telemetry-refusals every
syscall refused with EPERM, and on nodes started with --telemetry-files every file write,
rename, unlink and chmod; each with the trajectory step that was running (0: between steps).
--step K keeps step K's records, --kind one kind (exec, refused, signal, file, connect, limit, denied), --summary
counts them per step, -f follows them as they come until the sandbox stops.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if follow {
				return followAudit(cmd, g, args[0])
			}
			q := warren.AuditQuery{Kind: kind, Summary: summary}
			if cmd.Flags().Changed("step") {
				q.Step, q.HasStep = step, true
			}
			al, err := g.client().Audit(cmd.Context(), args[0], q)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if g.json {
				return printJSON(out, al)
			}
			return printAudit(out, al)
		},
	}
	cmd.Flags().Int64Var(&step, "step", 0, "only this trajectory step's records (0 = between steps)")
	cmd.Flags().StringVar(&kind, "kind", "", "only records of this kind: exec, refused, signal, file, connect, limit, denied")
	cmd.Flags().BoolVar(&summary, "summary", false, "per step, how many records of each kind")
	cmd.Flags().BoolVarP(&follow, "follow", "f", false, "print records as they come, until the sandbox stops (--json: NDJSON)")
	return cmd
}

// followAudit prints a sandbox's records as they come, one a line.
func followAudit(cmd *cobra.Command, g *globals, id string) error {
	out := cmd.OutOrStdout()
	return g.client().FollowAudit(cmd.Context(), id, 0, func(r api.AuditRecord) error {
		if g.json {
			b, err := json.Marshal(&r)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(out, "%s\n", b)
			return err
		}
		_, err := fmt.Fprintf(out, "%s\t%d\t%s\t%d\t%d\t%d\t%s\n", r.Time.Format("15:04:05.000"), r.Step, r.Kind, r.Pid, r.Ppid, r.UID, auditWhat(&r))
		return err
	})
}

func printAudit(w io.Writer, al *api.AuditList) error {
	if !al.Telemetry {
		fmt.Fprintln(w, "(the sandbox's node records nothing: no telemetry)")
	}
	if al.Summary != nil {
		t := newTable(w, "STEP", "COUNTS", "MATCHED")
		for _, st := range al.Summary {
			kinds := slices.Sorted(maps.Keys(st.Counts))
			parts := make([]string, 0, len(kinds))
			for _, k := range kinds {
				parts = append(parts, fmt.Sprintf("%s=%d", k, st.Counts[k]))
			}
			t.row(strconv.FormatInt(st.Step, 10), strings.Join(parts, " "), strconv.FormatInt(st.Matched, 10))
		}
		return t.flush()
	}
	t := newTable(w, "TIME", "STEP", "KIND", "PID", "PPID", "UID", "WHAT")
	for _, r := range al.Records {
		t.row(r.Time.Format("15:04:05.000"), strconv.FormatInt(r.Step, 10), r.Kind, strconv.Itoa(r.Pid),
			strconv.Itoa(r.Ppid), strconv.Itoa(r.UID), auditWhat(&r))
	}
	if err := t.flush(); err != nil {
		return err
	}
	if al.Dropped > 0 {
		fmt.Fprintf(w, "(%d older records dropped)\n", al.Dropped)
	}
	return nil
}

// auditWhat is a record's detail in one line.
func auditWhat(r *api.AuditRecord) string {
	switch r.Kind {
	case api.AuditKindExec:
		s := r.Path + "  " + strconv.Quote(strings.Join(r.Argv, " "))
		if r.ArgvTruncated {
			s += " (argv cut)"
		}
		return s + ruleNote(r)
	case api.AuditKindSignal:
		return fmt.Sprintf("signal %d to pid %d", r.Signal, r.Target)
	case api.AuditKindRefused:
		return r.Syscall + ruleNote(r)
	case api.AuditKindFile:
		if r.To != "" {
			return fmt.Sprintf("%s %s -> %s", r.Op, r.Path, r.To)
		}
		return r.Op + " " + r.Path + ruleNote(r)
	case api.AuditKindConnect:
		return "connect " + r.Dest + ruleNote(r)
	case api.AuditKindLimit:
		return "limit " + r.Op + ruleNote(r)
	}
	return ""
}

// ruleNote names the audit policy rule that matched r, if any.
func ruleNote(r *api.AuditRecord) string {
	if r.Rule == "" {
		return ""
	}
	return fmt.Sprintf("  [%s: %s]", r.Action, r.Rule)
}
