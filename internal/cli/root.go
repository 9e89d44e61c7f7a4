// Package cli implements the warren command line: the root command, its
// global flags and the client verbs built on the Go SDK (sdk/go).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	warren "github.com/warrenhq/warren/sdk/go"
)

// globals holds the values of the global flags.
type globals struct {
	url   string
	token string
	json  bool
}

// client returns an SDK client for the flags, falling back to the
// environment and the defaults of warren.ResolveEnv.
func (g *globals) client() *warren.Client {
	u, t := warren.ResolveEnv(g.url, g.token)
	return warren.New(u, t)
}

// exitError makes Main return a specific exit code without printing anything.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

// NewRootCmd builds the warren command tree.
func NewRootCmd() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "warren",
		Short:         "warren: sandboxes for agents and their tools",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.url, "url", "", "API endpoint (env "+warren.EnvURL+", default "+warren.DefaultURL+")")
	pf.StringVar(&g.token, "token", "", "API token (env "+warren.EnvToken+", default: contents of "+warren.DefaultTokenFile+")")
	pf.BoolVar(&g.json, "json", false, "print JSON instead of human-readable output")

	root.AddCommand(
		newServeCmd(),
		newAPIServerCmd(),
		newEdgeCmd(),
		newNATSCmd(),
		newSimCmd(),
		newSimEdgesCmd(),
		newCreateCmd(g),
		newRunCmd(g),
		newShellCmd(g),
		newCpCmd(g),
		newLsCmd(g),
		newRmCmd(g),
		newImageCmd(g),
		newLayerCmd(g),
		newNodesCmd(g),
		newEventsCmd(g),
		newProjectCmd(g),
		newTokenCmd(g),
		newSnapshotCmd(g),
		newForkCmd(g),
		newPauseCmd(g, false),
		newPauseCmd(g, true),
		newFnCallCmd(g),
		newPoolCmd(g),
		newTemplateCmd(g),
		newNetworkCmd(g),
		newNetworkRulesCmd(g),
		newLogsCmd(g),
		newStatsCmd(g),
		newTrajCmd(g),
		newAuditCmd(g),
		newPortForwardCmd(g),
		newExposeCmd(g),
		newVersionCmd(g),
		newBenchCmd(),
	)
	return root
}

// Main runs the command line with args (without the program name) and
// returns the process exit code.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := NewRootCmd()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	// The SDK's errors say "warren: …" already: one prefix is enough.
	fmt.Fprintln(stderr, "warren: "+strings.TrimPrefix(err.Error(), "warren: "))
	return 1
}

// Execute runs the command line of this process and exits.
func Execute() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
