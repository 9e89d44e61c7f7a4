package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
	warren "github.com/warrenhq/warren/sdk/go"
)

// remoteSpec splits "ID:/path" into id and path. A local path never matches:
// it has no colon, or a slash before its first colon.
func remoteSpec(s string) (id, p string, ok bool) {
	i := strings.IndexByte(s, ':')
	if i <= 0 || strings.ContainsRune(s[:i], '/') {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

func newCpCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cp SRC DST",
		Short: "copy files and directories between this machine and a sandbox",
		Long: `Copy a file or directory tree. Exactly one side is ID:/path in a sandbox.
"-" as the local side means standard input or output (single files only).
If DST is an existing directory, SRC is copied into it under its own name;
otherwise DST becomes the copy.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			sid, spath, sremote := remoteSpec(args[0])
			did, dpath, dremote := remoteSpec(args[1])
			c := g.client()
			ctx := cmd.Context()
			var err error
			var summary string
			switch {
			case sremote && dremote:
				return errors.New("cp: copying between two sandboxes is not supported; go through a local path")
			case !sremote && !dremote:
				return errors.New("cp: one of SRC and DST must be ID:/path")
			case dremote:
				if !path.IsAbs(dpath) {
					return fmt.Errorf("cp: %q: the sandbox path must be absolute", args[1])
				}
				summary, err = upload(ctx, c, cmd.InOrStdin(), args[0], did, dpath)
			default:
				if !path.IsAbs(spath) {
					return fmt.Errorf("cp: %q: the sandbox path must be absolute", args[0])
				}
				summary, err = download(ctx, c, cmd.OutOrStdout(), sid, spath, args[1])
			}
			if err != nil {
				return err
			}
			if g.json && summary != "" {
				return printJSON(cmd.OutOrStdout(), map[string]string{"copied": summary})
			}
			return nil
		},
	}
	return cmd
}

// remoteDirTarget returns where src named base lands under the sandbox path
// dst: inside dst when dst is an existing directory (or ends in "/").
func remoteDirTarget(ctx context.Context, c *warren.Client, id, dst, base string) (string, bool, error) {
	fi, err := c.Stat(ctx, id, dst)
	switch {
	case err == nil && fi.Type == "dir":
		return path.Join(dst, base), true, nil
	case err == nil:
		return dst, false, nil
	case warren.IsNotFound(err):
		if strings.HasSuffix(dst, "/") {
			return path.Join(dst, base), false, nil
		}
		return dst, false, nil
	}
	return "", false, err
}

func upload(ctx context.Context, c *warren.Client, stdin io.Reader, src, id, dst string) (string, error) {
	if src == "-" {
		if _, err := c.WriteFile(ctx, id, dst, stdin, 0); err != nil {
			return "", err
		}
		return dst, nil
	}
	fi, err := os.Stat(src)
	if err != nil {
		return "", fmt.Errorf("cp: %w", err)
	}
	target, _, err := remoteDirTarget(ctx, c, id, dst, filepath.Base(src))
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		f, err := os.Open(src)
		if err != nil {
			return "", fmt.Errorf("cp: %w", err)
		}
		defer f.Close()
		if _, err := c.WriteFile(ctx, id, target, f, fi.Mode().Perm()); err != nil {
			return "", err
		}
		return target, nil
	}
	if _, err := c.Mkdir(ctx, id, api.MkdirRequest{Path: target, Mode: uint32(fi.Mode().Perm()), Parents: true}); err != nil && !warren.IsConflict(err) {
		return "", err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, src)) }()
	_, err = c.UploadArchive(ctx, id, target, pr)
	pr.CloseWithError(errors.New("upload finished")) // unblock the writer if the upload stopped early
	if err != nil {
		return "", err
	}
	return target, nil
}

func download(ctx context.Context, c *warren.Client, stdout io.Writer, id, src, dst string) (string, error) {
	fi, err := c.Stat(ctx, id, src)
	if err != nil {
		return "", err
	}
	if dst == "-" {
		if fi.Type == "dir" {
			return "", errors.New("cp: cannot write a directory to standard output")
		}
		rc, err := c.ReadFile(ctx, id, src)
		if err != nil {
			return "", err
		}
		defer rc.Close()
		if _, err := io.Copy(stdout, rc); err != nil {
			return "", fmt.Errorf("cp: %w", err)
		}
		return "", nil
	}
	target := dst
	if st, err := os.Stat(dst); err == nil && st.IsDir() {
		target = filepath.Join(dst, path.Base(src))
	}
	if fi.Type != "dir" {
		rc, err := c.ReadFile(ctx, id, src)
		if err != nil {
			return "", err
		}
		defer rc.Close()
		mode := os.FileMode(fi.Mode).Perm()
		if mode == 0 {
			mode = 0o644
		}
		if err := writeFileAtomic(target, rc, mode); err != nil {
			return "", fmt.Errorf("cp: %w", err)
		}
		return target, nil
	}
	rc, err := c.DownloadArchive(ctx, id, src)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	if err := os.MkdirAll(target, 0o755); err != nil {
		return "", fmt.Errorf("cp: %w", err)
	}
	if err := extractTar(rc, target); err != nil {
		return "", fmt.Errorf("cp: %w", err)
	}
	return target, nil
}

// writeFileAtomic writes r to name through a temporary file and a rename.
func writeFileAtomic(name string, r io.Reader, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".warren-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, mode)
	}
	if err == nil {
		err = os.Rename(tmp, name)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}
