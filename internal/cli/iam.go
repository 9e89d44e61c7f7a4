package cli

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/e2b"
)

func quotaString(q api.Quota) string {
	s := ""
	add := func(v string) {
		if s != "" {
			s += " "
		}
		s += v
	}
	if q.Sandboxes > 0 {
		add(fmt.Sprintf("sandboxes=%d", q.Sandboxes))
	}
	if q.CPU > 0 {
		add("cpu=" + fmtFloat(q.CPU))
	}
	if q.MemoryMB > 0 {
		add("memory=" + bytesMB(q.MemoryMB))
	}
	if s == "" {
		return "-"
	}
	return s
}

func newProjectCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "project", Aliases: []string{"projects"}, Short: "manage projects (nested, with quotas)"}
	var parent string
	var q api.Quota
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "create a subproject (of --parent, default the token's project)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := g.client().CreateProject(cmd.Context(), api.CreateProjectRequest{Name: args[0], Parent: parent, Quota: q})
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), p)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), p.ID)
			return err
		},
	}
	create.Flags().StringVar(&parent, "parent", "", "parent project id")
	create.Flags().IntVar(&q.Sandboxes, "sandboxes", 0, "quota: concurrent sandboxes (0: no own limit)")
	create.Flags().Float64Var(&q.CPU, "cpu", 0, "quota: cores")
	create.Flags().Int64Var(&q.MemoryMB, "memory-mb", 0, "quota: memory in MiB")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "list the projects this token reaches, with usage",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ps, err := g.client().Projects(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), api.ProjectList{Projects: ps})
			}
			t := newTable(cmd.OutOrStdout(), "PROJECT", "QUOTA", "SANDBOXES", "CPU", "MEMORY")
			for _, p := range ps {
				u := api.Usage{}
				if p.Usage != nil {
					u = *p.Usage
				}
				t.row(p.ID, quotaString(p.Quota), fmt.Sprint(u.Sandboxes), fmtFloat(u.CPU), bytesMB(u.MemoryMB))
			}
			return t.flush()
		},
	}
	var uq api.Quota
	set := &cobra.Command{
		Use:   "set-quota ID",
		Short: "set a project's quota (admin of a project above it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := g.client().UpdateProject(cmd.Context(), args[0], api.UpdateProjectRequest{Quota: uq})
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), p)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), p.ID, quotaString(p.Quota))
			return err
		},
	}
	set.Flags().IntVar(&uq.Sandboxes, "sandboxes", 0, "concurrent sandboxes (0: no own limit)")
	set.Flags().Float64Var(&uq.CPU, "cpu", 0, "cores")
	set.Flags().Int64Var(&uq.MemoryMB, "memory-mb", 0, "memory in MiB")
	rm := &cobra.Command{
		Use:   "rm ID",
		Short: "delete an empty project",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.client().DeleteProject(cmd.Context(), args[0])
		},
	}
	cmd.AddCommand(create, ls, set, rm)
	return cmd
}

func newTokenCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Aliases: []string{"tokens"}, Short: "manage API tokens"}
	var req api.CreateTokenRequest
	var expires time.Duration
	var e2bKey bool
	create := &cobra.Command{
		Use:   "create PRINCIPAL",
		Short: "issue a token (its secret is printed once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.Principal = args[0]
			req.ExpiresIn = int64(expires / time.Second)
			t, err := g.client().CreateToken(cmd.Context(), req)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			secret := t.Secret
			if e2bKey {
				secret = e2b.E2BKey(secret)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), secret)
			return err
		},
	}
	create.Flags().StringVar(&req.Project, "project", "", "project (default: the caller's)")
	create.Flags().StringVar(&req.Role, "role", "", "admin, member (default) or viewer")
	create.Flags().DurationVar(&expires, "expires-in", 0, "lifetime (default: as long as the caller's token)")
	create.Flags().BoolVar(&e2bKey, "e2b", false, "print the secret as an E2B API key (e2b_<hex>, for E2B_API_KEY; docs/e2b.md)")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "list the tokens this token manages",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ts, err := g.client().Tokens(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), api.TokenList{Tokens: ts})
			}
			t := newTable(cmd.OutOrStdout(), "ID", "PRINCIPAL", "PROJECT", "ROLE", "EXPIRES")
			for _, tk := range ts {
				exp, proj := "-", tk.Project
				if tk.ExpiresAt != nil {
					exp = tk.ExpiresAt.Format(time.RFC3339)
				}
				if proj == "" {
					proj = "(root)"
				}
				t.row(tk.ID, tk.Principal, proj, tk.Role, exp)
			}
			return t.flush()
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "revoke a token",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.client().RevokeToken(cmd.Context(), args[0])
		},
	}
	cmd.AddCommand(create, ls, revoke)
	return cmd
}
