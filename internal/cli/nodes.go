package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/warrenhq/warren/api"
	"github.com/warrenhq/warren/internal/runtime/microvm"
	"github.com/warrenhq/warren/internal/serve"
)

func newNodesCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "nodes",
		Aliases: []string{"node"},
		Short:   "list the nodes of the cluster",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			nodes, err := g.client().Nodes(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				if nodes == nil {
					nodes = []api.Node{}
				}
				return printJSON(cmd.OutOrStdout(), api.NodeList{Nodes: nodes})
			}
			now := time.Now()
			t := newTable(cmd.OutOrStdout(), "NAME", "STATE", "CPU", "MEMORY", "SANDBOXES", "TIERS", "HEARTBEAT")
			for _, n := range nodes {
				tiers := strings.Join(n.Tiers, ",")
				if tiers == "" {
					tiers = "-"
				}
				t.row(n.Name, n.State,
					fmtFloat(n.CPURequested)+"/"+fmtFloat(n.CPUCapacity),
					bytesMB(n.MemRequested)+"/"+bytesMB(n.MemoryMB),
					fmt.Sprint(n.Sandboxes), tiers, age(n.LastHeartbeat, now))
			}
			return t.flush()
		},
	}
}

// Version is the release of this binary; set it at build time with
// -ldflags "-X github.com/warrenhq/warren/internal/cli.Version=v1.2.3".
var Version = "dev"

// versionInfo describes this binary.
type versionInfo struct {
	Version string `json:"version"`
	Commit  string `json:"commit,omitempty"`
	Go      string `json:"go"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
	// VMKernel is the microvm tier's guest kernel in the default data
	// directory (`make vm-kernel`), when there is one.
	VMKernel string `json:"vm_kernel,omitempty"`
}

func buildInfo() versionInfo {
	v := versionInfo{Version: Version, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	if k, err := microvm.OpenKernel(serve.VMKernelDir(DefaultDataDir, "")); err == nil {
		v.VMKernel = k.Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				v.Commit = s.Value
			case "vcs.modified":
				if s.Value == "true" && v.Commit != "" {
					v.Commit += "-dirty"
				}
			}
		}
	}
	return v
}

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the version of this binary",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := buildInfo()
			if g.json {
				return printJSON(cmd.OutOrStdout(), v)
			}
			s := "warren " + v.Version
			if v.Commit != "" {
				s += " (" + v.Commit + ")"
			}
			if _, err := fmt.Fprintf(cmd.OutOrStdout(), "%s %s %s/%s\n", s, v.Go, v.OS, v.Arch); err != nil {
				return err
			}
			if v.VMKernel != "" {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "microvm guest kernel: %s\n", v.VMKernel)
				return err
			}
			return nil
		},
	}
}
