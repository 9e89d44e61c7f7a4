package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

func newRunCmd(g *globals) *cobra.Command {
	var (
		req     api.ExecRequest
		envs    []string
		timeout string
		stdin   bool
		detach  bool
	)
	cmd := &cobra.Command{
		Use:   "run [flags] ID -- CMD [ARG...] | run [flags] ID 'SHELL STRING'",
		Short: "run a command in a sandbox, streaming its output; exits with its exit code",
		Long: `Run a command in a sandbox. With "--" (or several words) the words are run
directly as argv; a single word is a shell string run by the session's shell.
Flags go before the sandbox id. Output streams live; the exit code of warren
is the command's.`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, rest := args[0], args[1:]
			argv := cmd.ArgsLenAtDash() == 1
			if len(rest) > 0 && rest[0] == "--" { // flags stop at ID, so "--" arrives as a word
				argv, rest = true, rest[1:]
			}
			if len(rest) == 0 {
				return fmt.Errorf("no command given")
			}
			if argv || len(rest) > 1 {
				req.Argv = rest
			} else {
				req.Cmd = rest[0]
			}
			var err error
			if req.Env, err = parseKV("env", envs); err != nil {
				return err
			}
			if req.Timeout, err = parseSeconds("timeout", timeout); err != nil {
				return err
			}
			if stdin {
				b, err := io.ReadAll(cmd.InOrStdin())
				if err != nil {
					return fmt.Errorf("read stdin: %w", err)
				}
				req.Stdin = string(b)
			}
			c := g.client()
			out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
			if detach {
				req.Background = true
				res, err := c.Exec(cmd.Context(), id, req)
				if err != nil {
					return err
				}
				if g.json {
					return printJSON(out, res)
				}
				_, err = fmt.Fprintln(out, res.CommandID)
				return err
			}
			var res *api.ExecResult
			if g.json {
				res, err = c.Exec(cmd.Context(), id, req)
				if err == nil {
					err = printJSON(out, res)
				}
			} else {
				res, err = c.ExecStream(cmd.Context(), id, req, out, errw)
			}
			if err != nil {
				return err
			}
			if !g.json {
				reportEnd(errw, res)
			}
			if code := exitCode(res); code != 0 {
				return &exitError{code: code}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.SetInterspersed(false) // everything after ID belongs to the command
	f.StringVar(&req.Session, "session", "", "session (shell) to run in; keeps cwd and env between commands")
	f.StringVar(&req.Cwd, "cwd", "", "working directory")
	f.StringArrayVarP(&envs, "env", "e", nil, "environment variable K=V (repeatable)")
	f.StringVar(&timeout, "timeout", "", "kill the command after this long: seconds or a duration (default 600s)")
	f.StringVarP(&req.User, "user", "u", "", "user to run as")
	f.BoolVarP(&stdin, "stdin", "i", false, "send warren's standard input to the command")
	f.BoolVarP(&detach, "detach", "d", false, "run in the background and print the command id")
	f.BoolVar(&req.Trusted, "trusted", false, "run with the shell and programs of the sandbox's protected toolkit layer, outside any session")
	return cmd
}

// reportEnd says on w how a command ended when its exit code cannot.
func reportEnd(w io.Writer, res *api.ExecResult) {
	if res.TimedOut {
		fmt.Fprintln(w, "warren: command timed out")
	} else if res.OOMKilled {
		fmt.Fprintln(w, "warren: command killed by the OOM killer (out of the sandbox's memory)")
	} else if res.Signal != "" {
		fmt.Fprintf(w, "warren: command killed by %s\n", res.Signal)
	}
	if res.DiskFull {
		fmt.Fprintln(w, "warren: the sandbox's disk is full (its disk_mb limit)")
	}
	if res.PidsLimited {
		fmt.Fprintln(w, "warren: the sandbox's pids limit refused a fork or thread")
	}
	if res.Truncated {
		fmt.Fprintln(w, "warren: output truncated")
	}
}

// exitCode maps a result to a process exit code.
func exitCode(res *api.ExecResult) int {
	code := res.ExitCode
	switch {
	case res.TimedOut && code == 0:
		return 124
	case code < 0 || code > 255:
		return 255
	}
	return code
}
