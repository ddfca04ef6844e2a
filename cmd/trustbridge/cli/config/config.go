package config

import (
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/server"
)

func NewCmd(e cli.Env) *cobra.Command {
	cmd := &cobra.Command{
		Use:     "config",
		Short:   "Work with trustbridge server's --config file",
		Example: `  trustbridge config check /etc/trustbridge/config.yaml`,
	}
	check := &cobra.Command{
		Use:   "check FILE",
		Short: "Validate a server config file without starting anything",
		Long: `Read FILE as trustbridge server --config would, with the environment
variables that apply (TRUST_DOMAIN, SPIFFE_BUNDLE_ENDPOINTS, POD_NAMESPACE), and
check everything that can be checked without starting: unknown or repeated keys,
every value's type, the trust domain, the CA key type, the storage and flag
combinations, listen addresses, log settings and every federation endpoint
(including bootstrap bundles). A self-serving https_spiffe endpoint without a
bootstrap bundle passes only when the last-known-good store of --data-dir
holds its trust domain's bundle; with --storage kube, whose store is in
ConfigMaps, config check does not connect and needs the bootstrap bundle.
Prints "ok" or every problem found; the exit status is 1 on any problem.`,
		Example: `  trustbridge config check /etc/trustbridge/config.yaml
  TRUST_DOMAIN=example.org trustbridge config check deploy/base/config.yaml`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var o server.Config
			fs := pflag.NewFlagSet("server", pflag.ContinueOnError)
			fs.SetOutput(io.Discard)
			o.AddFlags(fs)
			o.ConfigPath = args[0]
			if err := o.Load(fs, os.Getenv); err != nil {
				return err
			}
			errs := server.CheckConfig(o)
			if len(errs) == 0 {
				_, err := fmt.Fprintf(e.Out, "%s: ok\n", args[0])
				return err
			}
			for _, err := range errs {
				fmt.Fprintf(e.Out, "%s: %v\n", args[0], err)
			}
			return fmt.Errorf("%s: %d problems", args[0], len(errs))
		},
	}
	cmd.AddCommand(check)
	return cmd
}
