package cli

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	warren "github.com/warrenhq/warren/sdk/go"
)

func newShellCmd(g *globals) *cobra.Command {
	var (
		opt     warren.TerminalOptions
		envs    []string
		timeout string
	)
	cmd := &cobra.Command{
		Use:   "shell [flags] ID [-- CMD [ARG...] | 'SHELL STRING']",
		Short: "an interactive terminal in a sandbox (its shell, or CMD); exits with its exit code",
		Long: `Open an interactive terminal in a sandbox, like docker exec -it: the sandbox's
shell, or CMD ("--" and words: argv; one word: a shell string). When stdin is a
terminal it is put in raw mode (every key, ^C included, goes to the sandbox)
and window size changes follow (SIGWINCH); this works over SSH too. When stdin
is not a terminal (a pipe, a file), the command gets no terminal either, like
docker exec -i: stdout and stderr stay apart and the end of stdin closes the
command's. The exit code of warren is the command's. Flags go before the
sandbox id.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, rest := args[0], args[1:]
			argv := cmd.ArgsLenAtDash() == 1
			if len(rest) > 0 && rest[0] == "--" {
				argv, rest = true, rest[1:]
			}
			switch {
			case len(rest) == 0:
			case argv || len(rest) > 1:
				opt.Argv = rest
			default:
				opt.Cmd = rest[0]
			}
			var err error
			if opt.Env, err = parseKV("env", envs); err != nil {
				return err
			}
			if opt.Timeout, err = parseSeconds("timeout", timeout); err != nil {
				return err
			}
			return runShell(cmd, g.client(), id, opt)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&opt.User, "user", "u", "", "run as this user")
	f.StringVarP(&opt.Cwd, "workdir", "w", "", "working directory")
	f.StringArrayVarP(&envs, "env", "e", nil, "KEY=VALUE (repeatable)")
	f.StringVar(&timeout, "timeout", "", "kill the command after this long (seconds or a duration; default none)")
	return cmd
}

// runShell connects the local terminal (or stdin and stdout) to a terminal
// in sandbox id until its command ends.
func runShell(cmd *cobra.Command, c *warren.Client, id string, opt warren.TerminalOptions) error {
	ctx := cmd.Context()
	in, out := cmd.InOrStdin(), cmd.OutOrStdout()
	inFile, _ := in.(*os.File)
	tty := inFile != nil && term.IsTerminal(int(inFile.Fd()))
	if tty {
		if w, h, err := term.GetSize(int(inFile.Fd())); err == nil {
			opt.Cols, opt.Rows = w, h
		}
	} else {
		// Stdin is not a terminal (a pipe, a file, /dev/null): no terminal
		// in the sandbox either, as ssh and docker exec -i do. The end of
		// stdin then closes the program's stdin; on a terminal it would be
		// a ^D, which a shell still setting up its line editor can miss.
		opt.NoTTY = true
		opt.Stderr = cmd.ErrOrStderr()
		if opt.Cmd == "" && len(opt.Argv) == 0 {
			// The sandbox's shell, reading its commands from stdin: a
			// shell string runs as "SHELL -c CMD", so $0 is that shell.
			opt.Cmd = `exec "$0"`
		}
	}
	opt.Stdout = out
	t, err := c.Terminal(ctx, id, opt)
	if err != nil {
		return err
	}
	defer t.Close()
	if tty {
		st, err := term.MakeRaw(int(inFile.Fd()))
		if err != nil {
			return fmt.Errorf("raw mode: %w", err)
		}
		defer term.Restore(int(inFile.Fd()), st)
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for {
				select {
				case <-winch:
					if w, h, err := term.GetSize(int(inFile.Fd())); err == nil {
						_ = t.Resize(ctx, w, h)
					}
				case <-t.Done():
					return
				}
			}
		}()
	}
	go func() {
		// Stdin's end (a pipe, not a terminal) ends the program's input.
		if _, err := io.Copy(t, in); err == nil {
			_ = t.CloseInput(ctx)
		}
	}()
	res, err := t.Wait(ctx)
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return &exitError{code: res.ExitCode}
	}
	return nil
}
