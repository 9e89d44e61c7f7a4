package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/internal/imagebuild"
)

// newImageBuildCmd is `warren image build`: it builds an image from a
// Dockerfile through the API (internal/imagebuild).
func newImageBuildCmd(g *globals) *cobra.Command {
	var (
		file, tag string
		args      []string
		noCache   bool
		o         imagebuild.Options
	)
	cmd := &cobra.Command{
		Use:   "build [-f Dockerfile] -t NAME [--build-arg K=V]... CONTEXT",
		Short: "build an image from a Dockerfile",
		Long: `Build an image from a Dockerfile, through the API (so it works against a
remote server too). FROM names an image of the server or an OCI reference to
pull; RUN runs in a build sandbox; COPY and ADD upload files from the build
context (ADD extracts local tar archives; remote URLs are refused); ENV,
WORKDIR, USER and ARG work as in Docker, and the image keeps ENV, WORKDIR and
USER as the defaults of its sandboxes. CMD, ENTRYPOINT, LABEL and EXPOSE are
recorded; other instructions are ignored with a note. Every step that changes
files becomes a layer cached under its key ("build/<key>" layers): a rebuild
with nothing changed only looks the steps up. Multi-stage builds, RUN --mount
and here-documents are not supported.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, pos []string) error {
			o.Context = pos[0]
			st, err := os.Stat(o.Context)
			if err != nil {
				return fmt.Errorf("build context: %w", err)
			}
			if !st.IsDir() {
				return fmt.Errorf("build context %s is not a directory", o.Context)
			}
			if file == "" {
				file = filepath.Join(o.Context, "Dockerfile")
			}
			o.Dockerfile, err = os.ReadFile(file)
			if err != nil {
				return fmt.Errorf("read the Dockerfile: %w", err)
			}
			o.DockerfileName = file
			o.Tag = tag
			o.NoCache = noCache
			if o.BuildArgs, err = parseBuildArgs(args); err != nil {
				return err
			}
			o.Out = cmd.OutOrStdout()
			if g.json {
				o.Out = cmd.ErrOrStderr()
			}
			res, err := imagebuild.Build(cmd.Context(), g.client(), o)
			if err != nil {
				var se *imagebuild.StepError
				if errors.As(err, &se) {
					return fmt.Errorf("%w (no image was stored)", err)
				}
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), res.Image)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "file", "f", "", "the Dockerfile (default: CONTEXT/Dockerfile)")
	f.StringVarP(&tag, "tag", "t", "", "the image name to store (required)")
	f.StringArrayVar(&args, "build-arg", nil, "set a build argument KEY=VALUE (repeatable)")
	f.BoolVar(&noCache, "no-cache", false, "run every step again")
	f.Float64Var(&o.CPU, "cpu", 0, "CPU cores of each build sandbox (default: the server's)")
	f.Int64Var(&o.MemoryMB, "memory", 0, "memory of each build sandbox in MiB (default 2048)")
	f.Int64Var(&o.DiskMB, "disk", 0, "writable disk of each build sandbox in MiB (default 8192)")
	f.Float64Var(&o.Timeout, "timeout", 0, "seconds each RUN may take (default 3600)")
	_ = cmd.MarkFlagRequired("tag")
	return cmd
}

// parseBuildArgs reads the --build-arg values: KEY=VALUE, or KEY alone to
// take KEY from the environment as Docker does (skipped when unset).
func parseBuildArgs(args []string) (map[string]string, error) {
	buildArgs := map[string]string{}
	for _, a := range args {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			// As in Docker: --build-arg K takes K from the environment.
			v, ok = os.LookupEnv(k)
			if !ok {
				continue
			}
		}
		if k == "" {
			return nil, fmt.Errorf("--build-arg %q: expected KEY=VALUE", a)
		}
		buildArgs[k] = v
	}
	return buildArgs, nil
}
