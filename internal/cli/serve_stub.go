package cli

import (
	"errors"

	"github.com/spf13/cobra"
)

// newServeCmd is a placeholder until serve.go lands; delete this file then.
func newServeCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "serve",
		Short: "run everything on one machine (not built in yet)",
		RunE: func(*cobra.Command, []string) error {
			return errors.New("serve is not implemented in this build")
		},
	}
}
