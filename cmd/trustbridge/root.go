package main

import (
	"github.com/spf13/cobra"
)

func newRootCmd(e Env) *cobra.Command {
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
	root.AddCommand(newVersionCmd(), NewBundleCmd(e), newServerCmd(e), NewCACmd(e), NewFederationCmd(e), newAgentCmd(e), NewAuditCmd(e), NewConfigCmd(e), NewTokenCmd(e), NewBackupCmd(e), NewRestoreCmd(e), NewPolicyCmd(e), NewJWTCmd(e))
	setupCLI(root)
	return root
}
