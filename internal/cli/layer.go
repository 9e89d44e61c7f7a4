package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

func newLayerCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "layer",
		Aliases: []string{"layers"},
		Short:   "manage named, versioned layers (workspaces, toolkits)",
	}
	cmd.AddCommand(newLayerCreateCmd(g), newLayerLsCmd(g), newLayerInspectCmd(g), newLayerRmCmd(g), newLayerGCCmd(g))
	return cmd
}

func newLayerCreateCmd(g *globals) *cobra.Command {
	var fromDir, fromTar, fromSandbox, name string
	var version int
	cmd := &cobra.Command{
		Use:   "create (--from-dir DIR | --from-tar FILE | --from-sandbox ID) --name NAME [--version N]",
		Short: "create a layer version from a directory, a tarball or a sandbox's changes",
		Long: `Create a version of a named layer. --from-dir packs a local directory
(owners kept), --from-tar uploads a layer tarball (plain or gzip, OCI whiteouts
honoured), --from-sandbox packs what the sandbox changed in its root (an
environment builder starts a base, runs its setup commands, and packs the
result). Without --version the next version is created.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n := 0
			for _, s := range []string{fromDir, fromTar, fromSandbox} {
				if s != "" {
					n++
				}
			}
			if n != 1 {
				return errors.New("give exactly one of --from-dir, --from-tar, --from-sandbox")
			}
			if version < 0 {
				return errors.New("--version must be positive")
			}
			c := g.client()
			ctx := cmd.Context()
			var l *api.Layer
			var err error
			switch {
			case fromSandbox != "":
				p := newProgress(cmd.ErrOrStderr(), "packing the changes of "+fromSandbox+" (on the server)", 0)
				l, err = c.CreateLayerFromSandbox(ctx, fromSandbox, name, version)
				p.stop()
			case fromTar != "":
				f, ferr := os.Open(fromTar)
				if ferr != nil {
					return ferr
				}
				defer f.Close()
				var size int64
				if st, err := f.Stat(); err == nil {
					size = st.Size()
				}
				p := newProgress(cmd.ErrOrStderr(), "uploading "+fromTar, size)
				l, err = c.CreateLayerFromTar(ctx, name, version, p.reader(f))
				p.stop()
			default:
				st, serr := os.Stat(fromDir)
				if serr != nil {
					return serr
				}
				if !st.IsDir() {
					return fmt.Errorf("%s is not a directory", fromDir)
				}
				pr, pw := io.Pipe()
				go func() { pw.CloseWithError(writeTarOwners(pw, fromDir, true)) }()
				p := newProgress(cmd.ErrOrStderr(), "packing "+fromDir, 0)
				l, err = c.CreateLayerFromTar(ctx, name, version, p.reader(pr))
				p.stop()
				pr.Close()
			}
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), l)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s@%d %s\n", l.Name, l.Version, shortDigest(l.Digest))
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&fromDir, "from-dir", "", "local directory to pack")
	f.StringVar(&fromTar, "from-tar", "", "layer tarball to upload (.tar or .tar.gz)")
	f.StringVar(&fromSandbox, "from-sandbox", "", "sandbox whose changes to pack")
	f.StringVar(&name, "name", "", "layer name, e.g. ws/django-1234 (required)")
	f.IntVar(&version, "version", 0, "version to create (default: the next one)")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}

func newLayerLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls [NAME]",
		Aliases: []string{"list"},
		Short:   "list layers (every version)",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			ls, err := g.client().Layers(cmd.Context(), name)
			if err != nil {
				return err
			}
			if g.json {
				if ls == nil {
					ls = []api.Layer{}
				}
				return printJSON(cmd.OutOrStdout(), api.LayerList{Layers: ls})
			}
			now := time.Now()
			t := newTable(cmd.OutOrStdout(), "NAME", "VERSION", "DIGEST", "SIZE", "STORED", "SOURCE", "CREATED")
			for _, l := range ls {
				t.row(l.Name, fmt.Sprint(l.Version), shortDigest(l.Digest), humanBytes(l.Size), humanBytes(l.StoredSize), l.Source, age(l.CreatedAt, now))
			}
			return t.flush()
		},
	}
}

func newLayerInspectCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "inspect NAME[@VERSION]",
		Short: "show a layer version (the latest without @VERSION)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := g.client().Layer(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), l)
		},
	}
}

func newLayerRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm NAME[@VERSION]...",
		Aliases: []string{"delete"},
		Short:   "delete a layer version, or every version of a name",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var all []api.Layer
			for _, ref := range args {
				gone, err := g.client().DeleteLayer(cmd.Context(), ref)
				if err != nil {
					return fmt.Errorf("%s: %w", ref, err)
				}
				all = append(all, gone...)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), api.LayerList{Layers: all})
			}
			for _, l := range all {
				fmt.Fprintf(cmd.OutOrStdout(), "%s@%d\n", l.Name, l.Version)
			}
			return nil
		},
	}
}

func newLayerGCCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "gc",
		Short: "remove layers no image, named layer or sandbox uses",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r, err := g.client().GCLayers(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), r)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "removed %d layers (%s), kept %d\n", len(r.Removed), humanBytes(r.Bytes), r.Kept)
			return err
		},
	}
}

func newImagePullCmd(g *globals) *cobra.Command {
	var name string
	cmd := &cobra.Command{
		Use:   "pull REF [--name NAME]",
		Short: "pull an image from an OCI registry into the store",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p := newProgress(cmd.ErrOrStderr(), "pulling "+args[0]+" (on the server)", 0)
			img, err := g.client().PullImage(cmd.Context(), args[0], name)
			p.stop()
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), img)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", img.Name, shortDigest(img.Digest))
			return err
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "store the image under this name (default: REF)")
	return cmd
}
