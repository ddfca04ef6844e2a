package main

import (
	"github.com/spf13/cobra"
)

func newRootCmd(e env) *cobra.Command {
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
	root.SetIn(e.in)
	root.SetOut(e.out)
	root.SetErr(e.err)
	root.AddCommand(newVersionCmd(), newBundleCmd(e), newServerCmd(e), newCACmd(e), newFederationCmd(e), newAgentCmd(e), newAuditCmd(e), newConfigCmd(e), newTokenCmd(e), newBackupCmd(e), newRestoreCmd(e), newPolicyCmd(e), newJWTCmd(e))
	setupCLI(root)
	return root
}
