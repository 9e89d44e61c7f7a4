package cli

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

// newFnCallCmd is `warren fncall`: it runs one stateless task in a
// pre-warmed container and exits with the task's exit code.
func newFnCallCmd(g *globals) *cobra.Command {
	var (
		req          api.FnCallRequest
		envs, files  []string
		timeout, mem string
		stdin        bool
	)
	cmd := &cobra.Command{
		Use:   "fncall [flags] -- CMD [ARG...] | fncall [flags] 'SHELL STRING'",
		Short: "run one stateless task in a pre-warmed container (the fncall tier); exits with its exit code",
		Long: `Run one stateless task in a pre-warmed container that is reset afterwards.
With "--" (or several words) the words are argv; a single word is a shell
string. --file LOCAL:/PATH copies a local file in before the command runs
(under /tmp, /var/tmp, /root, /home, /run or /work; the root is read-only).
Flags go before the command. Output is printed when the task ends.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			argv, shell, err := commandWords(args, cmd.ArgsLenAtDash() == 0)
			if err != nil {
				return err
			}
			if argv != nil {
				req.Argv = argv
			} else {
				req.Cmd = shell
			}
			if req.Env, err = parseKV("env", envs); err != nil {
				return err
			}
			if req.Timeout, err = parseSeconds("timeout", timeout); err != nil {
				return err
			}
			if req.MemoryMB, err = parseSizeMB("memory", mem); err != nil {
				return err
			}
			if req.Files, err = readFnCallFiles(req.Files, files); err != nil {
				return err
			}
			if stdin {
				if req.Stdin, err = readStdin(cmd); err != nil {
					return err
				}
			}
			res, err := g.client().FnCall(cmd.Context(), req)
			if err != nil {
				return err
			}
			if g.json {
				if err := printJSON(cmd.OutOrStdout(), res); err != nil {
					return err
				}
			} else {
				io.WriteString(cmd.OutOrStdout(), res.Stdout)
				io.WriteString(cmd.ErrOrStderr(), res.Stderr)
				reportEnd(cmd.ErrOrStderr(), res)
			}
			return exitStatus(res)
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // everything after the first word belongs to the command
	f.StringVar(&req.Image, "image", "", "image (default busybox)")
	f.StringArrayVar(&files, "file", nil, "copy local file LOCAL to /PATH before the command runs: LOCAL:/PATH (repeatable)")
	f.StringArrayVarP(&envs, "env", "e", nil, "environment variable K=V (repeatable)")
	f.StringVar(&req.Cwd, "cwd", "", "working directory (default /work)")
	f.StringVar(&timeout, "timeout", "", "kill the task after this long: seconds or a duration (default 30s, at most 600s)")
	f.Float64Var(&req.CPU, "cpu", 0, "CPU cores (default 1)")
	f.StringVar(&mem, "memory", "", "memory limit: MiB or a size like 512m (default 512m)")
	f.BoolVarP(&stdin, "stdin", "i", false, "send warren's standard input to the task")
	return cmd
}

// readFnCallFiles adds the files of the --file values (LOCAL:/PATH) to
// dst, keyed by /PATH, making dst when there is one; it returns dst.
func readFnCallFiles(dst map[string][]byte, files []string) (map[string][]byte, error) {
	for _, f := range files {
		local, remote, ok := cutLast(f, ":/")
		if !ok || local == "" {
			return dst, fmt.Errorf("--file %q: want LOCAL:/PATH", f)
		}
		b, err := os.ReadFile(local)
		if err != nil {
			return dst, fmt.Errorf("--file: %w", err)
		}
		if dst == nil {
			dst = map[string][]byte{}
		}
		dst["/"+remote] = b
	}
	return dst, nil
}

// cutLast cuts s around the last sep; after excludes sep's first byte
// (cutLast("a:/b", ":/") is "a", "b").
func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}
