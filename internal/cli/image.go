package cli

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

// importImage imports an OCI archive (file) or OCI layout (directory) src
// into the image store directory as name. The lead wires it to
// internal/image; nil means this build has no image store.
var importImage func(ctx context.Context, dataDir, src, name string) error

// DefaultDataDir is where warren keeps its state on a node.
const DefaultDataDir = "/var/lib/warren"

func newImageCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "image",
		Aliases: []string{"images"},
		Short:   "manage images",
	}
	cmd.AddCommand(newImageLsCmd(g), newImageImportCmd(g), newImagePullCmd(g), newImageBuildCmd(g))
	return cmd
}

func newImageLsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "list images",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			imgs, err := g.client().Images(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				if imgs == nil {
					imgs = []api.Image{}
				}
				return printJSON(cmd.OutOrStdout(), api.ImageList{Images: imgs})
			}
			now := time.Now()
			t := newTable(cmd.OutOrStdout(), "NAME", "DIGEST", "LAYERS", "SIZE", "CREATED")
			for _, im := range imgs {
				t.row(im.Name, shortDigest(im.Digest), fmt.Sprint(len(im.Layers)), humanBytes(im.Size), age(im.CreatedAt, now))
			}
			return t.flush()
		},
	}
}

func shortDigest(d string) string {
	algo, hex, ok := strings.Cut(d, ":")
	if !ok {
		algo, hex = "", d
	}
	if len(hex) > 12 {
		hex = hex[:12]
	}
	if algo == "" {
		return hex
	}
	return algo + ":" + hex
}

func newImageImportCmd(g *globals) *cobra.Command {
	var name, dataDir, store string
	cmd := &cobra.Command{
		Use:   "import FILE|DIR --name NAME",
		Short: "import an OCI archive or layout into the local image store",
		Long: `Import an OCI image archive (a .tar file) or an OCI layout directory into the
image store of this machine (--data-dir). This talks to the store directly,
not to the API, so it runs on the node itself.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if importImage == nil {
				return errors.New("image import is not available in this build")
			}
			if store == "" {
				store = filepath.Join(dataDir, "images")
			}
			if err := importImage(cmd.Context(), store, args[0], name); err != nil {
				return fmt.Errorf("import %s: %w", args[0], err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), map[string]string{"name": name, "source": args[0]})
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), name)
			return err
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "image name (required)")
	cmd.Flags().StringVar(&dataDir, "data-dir", DefaultDataDir, "warren's data directory")
	cmd.Flags().StringVar(&store, "store", "", "layer store directory (default: DATA_DIR/images)")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}
