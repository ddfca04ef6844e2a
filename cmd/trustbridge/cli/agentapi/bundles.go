package agentapi

import (
	"context"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
)

type fetchBundlesOptions struct {
	conn
	out *cli.OutputFlag
}

func newFetchBundlesCmd(e cli.Env, defaultSocket string) *cobra.Command {
	var o fetchBundlesOptions
	cmd := &cobra.Command{
		Use:   "bundles [--socket-path PATH]",
		Short: "Fetch the X.509 and JWT bundles this process may trust, per trust domain (spire-agent api fetch jwtbundle)",
		Long: `Fetch the bundles the Workload API hands this process: the X.509 bundles
(FetchX509Bundles) and the JWT bundles (FetchJWTBundles), and show each trust
domain with its number of X.509 and JWT authorities: which peers this
workload trusts, as its agent decided.`,
		Example: `  trustbridge agent api fetch bundles
  trustbridge agent api fetch bundles --socket-path ./api.sock -o yaml`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runFetchBundles(cmd.Context(), e, o)
		},
	}
	o.addFlags(cmd, defaultSocket)
	o.out = cli.AddOutputFlag(cmd)
	return cmd
}

// BundlesOutput is what fetch bundles prints.
type BundlesOutput struct {
	Bundles []BundleOutput `json:"bundles"`
}

func runFetchBundles(ctx context.Context, e cli.Env, o fetchBundlesOptions) error {
	if err := o.out.Check(); err != nil {
		return err
	}
	ctx, client, addr, done, err := o.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	x, err := client.FetchX509Bundles(ctx)
	if err != nil {
		return callError(addr, "X.509 bundles", o.timeout, err)
	}
	j, err := client.FetchJWTBundles(ctx)
	if err != nil {
		return callError(addr, "JWT bundles", o.timeout, err)
	}
	out := BundlesOutput{Bundles: mergeBundles(x509Bundles(x), jwtBundles(j))}
	return o.out.Write(e.Out, out, func(w io.Writer) error { return bundlesTable(w, out.Bundles) })
}

// mergeBundles joins the X.509 and JWT counts of each trust domain; a
// kind a trust domain lacks counts zero.
func mergeBundles(x509s, jwts []BundleOutput) []BundleOutput {
	byTD := map[string]*BundleOutput{}
	var out []BundleOutput
	for _, b := range append(x509s, jwts...) {
		if byTD[b.TrustDomain] == nil {
			zero, zero2 := 0, 0
			byTD[b.TrustDomain] = &BundleOutput{TrustDomain: b.TrustDomain, X509: &zero, JWT: &zero2}
		}
		m := byTD[b.TrustDomain]
		if b.X509 != nil {
			m.X509 = b.X509
		}
		if b.JWT != nil {
			m.JWT = b.JWT
		}
	}
	for _, b := range byTD {
		out = append(out, *b)
	}
	slices.SortFunc(out, func(a, b BundleOutput) int { return strings.Compare(a.TrustDomain, b.TrustDomain) })
	if out == nil {
		out = []BundleOutput{}
	}
	return out
}
