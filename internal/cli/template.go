package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

// newTemplateCmd manages named templates (image + layers + resources):
// E2B's templateID names one (docs/e2b.md).
func newTemplateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "template", Aliases: []string{"templates"}, Short: "named sandbox templates (image, layers, resources, env); E2B's templateID names one"}
	create, ls := newTemplateCreateCmd(g), newTemplateLsCmd(g)
	get := &cobra.Command{
		Use:   "get NAME",
		Short: "show one template",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := g.client().GetTemplate(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), t)
		},
	}
	var rmProject string
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "delete templates",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, n := range args {
				if _, err := g.client().DeleteTemplate(cmd.Context(), n, rmProject); err != nil {
					return err
				}
			}
			return nil
		},
	}
	rm.Flags().StringVar(&rmProject, "project", "", "the template of this project (default: the token's)")
	cmd.AddCommand(create, ls, get, rm)
	return cmd
}

// newTemplateCreateCmd is `warren template create`: it creates or replaces
// a template and prints its name.
func newTemplateCreateCmd(g *globals) *cobra.Command {
	var (
		t                    api.Template
		memory, disk         string
		envs, labels, layers []string
	)
	cmd := &cobra.Command{
		Use:   "create NAME --image IMAGE [flags]",
		Short: "create (or replace) a template and print its name",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			t.Name = args[0]
			if t.Spec.Image == "" {
				return fmt.Errorf("--image is required")
			}
			if t.Spec.MemoryMB, err = parseSizeMB("memory", memory); err != nil {
				return err
			}
			if t.Spec.DiskMB, err = parseSizeMB("disk", disk); err != nil {
				return err
			}
			if t.Spec.Env, err = parseKV("env", envs); err != nil {
				return err
			}
			if t.Spec.Labels, err = parseKV("label", labels); err != nil {
				return err
			}
			if t.Spec.Layers, err = appendLayers(t.Spec.Layers, layers); err != nil {
				return err
			}
			out, err := g.client().CreateTemplate(cmd.Context(), t)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), out.Name)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&t.Spec.Image, "image", "", "image (required)")
	f.StringVar(&t.Spec.Tier, "tier", "", "isolation tier: container (default), microvm or vm")
	f.Float64Var(&t.Spec.CPU, "cpu", 0, "CPU cores (default 1)")
	f.StringVar(&memory, "memory", "", "memory limit: MiB or a size like 512m, 4g (default 512m)")
	f.StringVar(&disk, "disk", "", "writable layer limit: MiB or a size like 1g (default 1g)")
	f.StringArrayVarP(&envs, "env", "e", nil, "environment variable K=V (repeatable)")
	f.StringArrayVarP(&labels, "label", "l", nil, "label K=V (repeatable)")
	f.StringVar(&t.Spec.User, "user", "", "default user for commands")
	f.StringArrayVar(&layers, "layer", nil, "named layer above the image, bottom first: REF, or REF:/MOUNT[:protected] (repeatable)")
	f.StringVar(&t.Project, "project", "", "project (default: the token's)")
	return cmd
}

// newTemplateLsCmd is `warren template ls`: it lists the templates the
// token sees.
func newTemplateLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "list the templates this token sees",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ts, err := g.client().ListTemplates(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), api.TemplateList{Templates: ts})
			}
			tb := newTable(cmd.OutOrStdout(), "NAME", "PROJECT", "IMAGE", "LAYERS", "CPU", "MEMORY")
			for _, t := range ts {
				var ls []string
				for _, l := range t.Spec.Layers {
					ls = append(ls, l.Layer)
				}
				tb.row(t.Name, orDash(t.Project), t.Spec.Image, orDash(strings.Join(ls, ",")), fmtFloat(t.Spec.CPU), bytesMB(t.Spec.MemoryMB))
			}
			return tb.flush()
		},
	}
}
