package cli

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

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
			words := args
			argv := cmd.ArgsLenAtDash() == 0
			if len(words) > 0 && words[0] == "--" {
				argv, words = true, words[1:]
			}
			if len(words) == 0 {
				return fmt.Errorf("no command given")
			}
			if argv || len(words) > 1 {
				req.Argv = words
			} else {
				req.Cmd = words[0]
			}
			var err error
			if req.Env, err = parseKV("env", envs); err != nil {
				return err
			}
			if req.Timeout, err = parseSeconds("timeout", timeout); err != nil {
				return err
			}
			if req.MemoryMB, err = parseSizeMB("memory", mem); err != nil {
				return err
			}
			for _, f := range files {
				local, remote, ok := cutLast(f, ":/")
				if !ok || local == "" {
					return fmt.Errorf("--file %q: want LOCAL:/PATH", f)
				}
				b, err := os.ReadFile(local)
				if err != nil {
					return fmt.Errorf("--file: %w", err)
				}
				if req.Files == nil {
					req.Files = map[string][]byte{}
				}
				req.Files["/"+remote] = b
			}
			if stdin {
				b, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
				req.Stdin = string(b)
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
			if code := exitCode(res); code != 0 {
				return &exitError{code: code}
			}
			return nil
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

// cutLast cuts s around the last sep; after excludes sep's first byte
// (cutLast("a:/b", ":/") is "a", "b").
func cutLast(s, sep string) (before, after string, ok bool) {
	i := strings.LastIndex(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+len(sep):], true
}
