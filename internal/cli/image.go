package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
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

// importDisk imports the disk image file src (format "qcow2", "raw" or ""
// = by its name) into the image store directory as name, an image of the
// vm tier. Wired like importImage.
var importDisk func(ctx context.Context, dataDir, src, name, format string) error

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
				layers := fmt.Sprint(len(im.Layers))
				if im.Disk != nil {
					layers = "vm disk" // a VM disk image: its size is the disk's
				}
				t.row(im.Name, shortDigest(im.Digest), layers, humanBytes(im.Size), age(im.CreatedAt, now))
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
	var name, dataDir, store, disk, format string
	cmd := &cobra.Command{
		Use:   "import FILE|DIR --name NAME [--data-dir DIR | --store DIR]\n  warren image import --disk FILE.qcow2|FILE.raw --name NAME [--format qcow2|raw] [--data-dir DIR | --store DIR]",
		Short: "import an OCI archive or layout, a docker-save archive, a root filesystem or a VM disk image",
		Long: `Import an image: an OCI image archive (.tar), an OCI layout directory, a
docker-save archive, or a root filesystem (a directory or a tarball, plain or
gzip). By default it is uploaded through the API (POST /v1/images:import), so
it works against a remote server. With --data-dir or --store it is written
into the image store directory of this machine instead (no server needed:
the node's own store, e.g. before its first start).

With --disk, FILE is a whole VM disk image (qcow2 or raw: by its name, .qcow2,
.raw or .img, or --format) that sandboxes of tier "vm" boot with its own
bootloader, kernel and init (e.g. the Debian 12 test disk scripts/vm-disk.sh
builds). It is validated with qemu-img: a corrupt or encrypted image, another
format, or one with a backing file or an external data file (QEMU would read
that host file) is refused. Each sandbox writes to a copy-on-write overlay
over it.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if disk != "" {
				return cobra.NoArgs(cmd, args)
			}
			if format != "" {
				return errors.New("--format goes with --disk")
			}
			return cobra.ExactArgs(1)(cmd, args)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			local := cmd.Flags().Changed("data-dir") || cmd.Flags().Changed("store")
			if local && store == "" {
				store = filepath.Join(dataDir, "images")
			}
			if disk != "" {
				return runImportDisk(cmd, g, local, store, disk, name, format)
			}
			src := args[0]
			if local {
				if importImage == nil {
					return errors.New("image import is not available in this build")
				}
				if err := importImage(cmd.Context(), store, src, name); err != nil {
					return fmt.Errorf("import %s: %w", src, err)
				}
				if g.json {
					return printJSON(cmd.OutOrStdout(), map[string]string{"name": name, "source": src})
				}
				_, err := fmt.Fprintln(cmd.OutOrStdout(), name)
				return err
			}
			img, err := uploadImage(cmd, g, src, name)
			if err != nil {
				return fmt.Errorf("import %s: %w", src, err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), img)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", img.Name, shortDigest(img.Digest))
			return err
		},
	}
	cmd.Flags().StringVar(&name, "name", "", "image name (required)")
	cmd.Flags().StringVar(&dataDir, "data-dir", DefaultDataDir, "import into the store of this data directory instead of uploading")
	cmd.Flags().StringVar(&store, "store", "", "import into this layer store directory instead of uploading")
	cmd.Flags().StringVar(&disk, "disk", "", "import this VM disk image (qcow2 or raw) for tier \"vm\" sandboxes")
	cmd.Flags().StringVar(&format, "format", "", "the --disk image's format, qcow2 or raw (default: by its name)")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}

// runImportDisk imports a VM disk image: into the local store, or through
// the API (POST /v1/images:import?disk=FORMAT).
func runImportDisk(cmd *cobra.Command, g *globals, local bool, store, src, name, format string) error {
	if format == "" {
		format = diskFormat(src)
	}
	if format != "qcow2" && format != "raw" {
		return fmt.Errorf("import %s: the disk image's format must be qcow2 or raw (name it .qcow2, .raw or .img, or give --format)", src)
	}
	if local {
		if importDisk == nil {
			return errors.New("disk image import is not available in this build")
		}
		if err := importDisk(cmd.Context(), store, src, name, format); err != nil {
			return fmt.Errorf("import %s: %w", src, err)
		}
		if g.json {
			return printJSON(cmd.OutOrStdout(), map[string]string{"name": name, "source": src, "format": format})
		}
		_, err := fmt.Fprintln(cmd.OutOrStdout(), name)
		return err
	}
	img, err := uploadDisk(cmd, g, src, name, format)
	if err != nil {
		return fmt.Errorf("import %s: %w", src, err)
	}
	if g.json {
		return printJSON(cmd.OutOrStdout(), img)
	}
	_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", img.Name, shortDigest(img.Digest))
	return err
}

// diskFormat is a disk image's format by its file name ("" if unknown).
func diskFormat(p string) string {
	switch strings.ToLower(filepath.Ext(p)) {
	case ".qcow2":
		return "qcow2"
	case ".raw", ".img":
		return "raw"
	}
	return ""
}

// uploadDisk sends a disk image file to POST /v1/images:import?disk=FORMAT.
func uploadDisk(cmd *cobra.Command, g *globals, src, name, format string) (*api.Image, error) {
	f, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	p := newProgress(cmd.ErrOrStderr(), "uploading "+filepath.Base(src), st.Size())
	defer p.stop()
	img, err := g.client().ImportDisk(cmd.Context(), name, format, p.reader(f))
	p.stop()
	if err == nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "imported %s: disk image, %s in %.1fs\n", name, humanBytes(st.Size()), p.elapsed().Seconds())
	}
	return img, err
}

// uploadImage sends a file (or a directory, as a tar) to POST
// /v1/images:import, with progress on stderr.
func uploadImage(cmd *cobra.Command, g *globals, src, name string) (*api.Image, error) {
	st, err := os.Stat(src)
	if err != nil {
		return nil, err
	}
	var body io.Reader
	var size int64
	if st.IsDir() {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writeTarOwners(pw, src, true)) }()
		defer pr.Close()
		body = pr
	} else {
		f, err := os.Open(src)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		body, size = f, st.Size()
	}
	p := newProgress(cmd.ErrOrStderr(), "uploading "+filepath.Base(src), size)
	defer p.stop()
	img, err := g.client().ImportImage(cmd.Context(), name, p.reader(body))
	p.stop()
	if err == nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "imported %s: %d layers, %s in %.1fs\n", name, len(img.Layers), humanBytes(img.Size), p.elapsed().Seconds())
	}
	return img, err
}
