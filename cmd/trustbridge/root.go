package main

import (
	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/audit"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/backup"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/bundle"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/ca"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/config"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/federation"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/health"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/identity"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/jwt"
	logcmd "github.com/trustbridge/trustbridge/cmd/trustbridge/cli/log"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/policy"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/svid"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli/token"
)

func newRootCmd(e cli.Env) *cobra.Command {
	root := &cobra.Command{
		Use:   "trustbridge",
		Short: "SPIFFE federation and trust bundle endpoint server",
		Long: `trustbridge serves and fetches SPIFFE trust bundles so that meshes, clusters
and companies can trust each other's workloads, one trust domain at a time.`,
		Example: `  trustbridge server --trust-domain example.org --data-dir ./data --init
  trustbridge federation status
  trustbridge bundle inspect -t example.org bundle.json
  trustbridge --version`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetIn(e.In)
	root.SetOut(e.Out)
	root.SetErr(e.Err)
	root.AddCommand(newVersionCmd(), bundle.NewCmd(e), newServerCmd(e), ca.NewCmd(e), federation.NewCmd(e), newAgentCmd(e), audit.NewCmd(e), config.NewCmd(e), token.NewCmd(e), backup.NewCmd(e, versionString()), backup.NewRestoreCmd(e), policy.NewCmd(e), identity.NewCmd(e), jwt.NewCmd(e), svid.NewX509Cmd(e))
	root.AddCommand(health.NewCmd(e), logcmd.NewCmd(e))
	setupCLI(root)
	return root
}
