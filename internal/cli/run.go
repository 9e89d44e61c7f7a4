package cli

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
)

// newRunCmd is `warren run`: it runs a command in a sandbox, streaming its
// output, and exits with the command's exit code.
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
			id := args[0]
			// Flags stop at ID, so "--" arrives as a word (commandWords).
			argv, shell, err := commandWords(args[1:], cmd.ArgsLenAtDash() == 1)
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
			if stdin {
				if req.Stdin, err = readStdin(cmd); err != nil {
					return err
				}
			}
			return runExec(cmd, g, id, &req, detach)
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

// runExec runs req in sandbox id for `warren run`. Detached, it prints the
// command's id; else it prints its output (streamed, or as JSON at the end)
// and returns an exitError with the command's exit code when not 0.
func runExec(cmd *cobra.Command, g *globals, id string, req *api.ExecRequest, detach bool) error {
	c := g.client()
	out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
	if detach {
		req.Background = true
		res, err := c.Exec(cmd.Context(), id, *req)
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
	var err error
	if g.json {
		res, err = c.Exec(cmd.Context(), id, *req)
		if err == nil {
			err = printJSON(out, res)
		}
	} else {
		res, err = c.ExecStream(cmd.Context(), id, *req, out, errw)
	}
	if err != nil {
		return err
	}
	if !g.json {
		reportEnd(errw, res)
	}
	return exitStatus(res)
}

// commandWords reads the words of a command line (run, fncall): with
// dashed (they came after "--") or a first word "--" (cobra passes "--"
// on as a word once flags stopped), or when there are several, they are
// argv; a single word is a shell string. No words is an error.
func commandWords(words []string, dashed bool) (argv []string, shell string, err error) {
	if len(words) > 0 && words[0] == "--" {
		dashed, words = true, words[1:]
	}
	if len(words) == 0 {
		return nil, "", fmt.Errorf("no command given")
	}
	if dashed || len(words) > 1 {
		return words, "", nil
	}
	return nil, words[0], nil
}

// readStdin reads all of cmd's standard input (--stdin of run and fncall).
func readStdin(cmd *cobra.Command) (string, error) {
	b, err := io.ReadAll(cmd.InOrStdin())
	if err != nil {
		return "", fmt.Errorf("read stdin: %w", err)
	}
	return string(b), nil
}

// exitStatus is nil when res exited 0, else an exitError with its exit
// code (exitCode).
func exitStatus(res *api.ExecResult) error {
	if code := exitCode(res); code != 0 {
		return &exitError{code: code}
	}
	return nil
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
