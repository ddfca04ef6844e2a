package agentapi

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"

	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
)

type fetchX509Options struct {
	conn
	write string
	out   *cli.OutputFlag
}

func newFetchX509Cmd(e cli.Env, defaultSocket string) *cobra.Command {
	var o fetchX509Options
	cmd := &cobra.Command{
		Use:   "x509 [--socket-path PATH] [--write DIR]",
		Short: "Fetch this process's X509-SVIDs and the X.509 bundles (spire-agent api fetch x509)",
		Long: `Fetch what the Workload API gives this process: its X509-SVIDs (FetchX509SVID)
and the X.509 bundles that come with them. Each SVID is verified against its
own trust domain's bundle, with go-spiffe, before anything is printed: an
agent that hands out a certificate its own bundle does not verify is an
error. The table shows each SVID's SPIFFE ID, hint, expiry and chain
subjects, then each trust domain with its number of X.509 authorities.

--write DIR writes, for SVID N (from 0), svid.N.pem (the chain), svid.N.key
(its key, mode 0600), bundle.N.pem (the roots of its own trust domain) and
federated_bundle.N.M.pem (one for each other trust domain, M in trust domain
order), as spire-agent does.`,
		Example: `  trustbridge agent api fetch x509
  trustbridge agent api fetch x509 --socket-path ./var/run/secrets/workload-spiffe-uds/workload-api.sock --write ./svids
  SPIFFE_ENDPOINT_SOCKET=unix:///run/spire/sockets/agent.sock trustbridge agent api fetch x509 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runFetchX509(cmd.Context(), e, o)
		},
	}
	o.addFlags(cmd, defaultSocket)
	cmd.Flags().StringVar(&o.write, "write", "", "directory to write svid.N.pem, svid.N.key (0600), bundle.N.pem and federated_bundle.N.M.pem into")
	o.out = cli.AddOutputFlag(cmd)
	return cmd
}

// X509Output is what fetch x509 prints.
type X509Output struct {
	SVIDs   []X509SVIDOutput `json:"svids"`
	Bundles []BundleOutput   `json:"bundles"`
	// Files are what --write wrote.
	Files []string `json:"files,omitempty"`
}

// X509SVIDOutput is one X509-SVID.
type X509SVIDOutput struct {
	SPIFFEID  string       `json:"spiffe_id"`
	Hint      string       `json:"hint,omitempty"`
	ExpiresAt time.Time    `json:"expires_at"`
	Chain     []CertOutput `json:"chain"`
}

// CertOutput is one certificate of a chain.
type CertOutput struct {
	Subject   string    `json:"subject"`
	Issuer    string    `json:"issuer"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
}

func runFetchX509(ctx context.Context, e cli.Env, o fetchX509Options) error {
	if err := o.out.Check(); err != nil {
		return err
	}
	ctx, client, addr, done, err := o.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	x, err := client.FetchX509Context(ctx)
	if err != nil {
		return callError(addr, "X509-SVID", o.timeout, err)
	}
	for i, s := range x.SVIDs {
		if _, _, err := x509svid.Verify(s.Certificates, x.Bundles); err != nil {
			return fmt.Errorf("the agent at %s handed out X509-SVID %d (%s), which its own bundle of %s does not verify: %w", addr, i, s.ID, s.ID.TrustDomain().Name(), err)
		}
	}
	out := x509Output(x)
	if o.write != "" {
		if out.Files, err = writeX509(o.write, x); err != nil {
			return fmt.Errorf("--write: %w", err)
		}
	}
	return o.out.Write(e.Out, out, func(w io.Writer) error { return x509Table(w, out) })
}

func x509Output(x *workloadapi.X509Context) X509Output {
	out := X509Output{SVIDs: []X509SVIDOutput{}}
	for _, s := range x.SVIDs {
		so := X509SVIDOutput{SPIFFEID: s.ID.String(), Hint: s.Hint, ExpiresAt: s.Certificates[0].NotAfter.UTC(), Chain: []CertOutput{}}
		for _, c := range s.Certificates {
			so.Chain = append(so.Chain, certOutput(c))
		}
		out.SVIDs = append(out.SVIDs, so)
	}
	out.Bundles = x509Bundles(x.Bundles)
	return out
}

func certOutput(c *x509.Certificate) CertOutput {
	return CertOutput{Subject: subject(c), Issuer: c.Issuer.String(), NotBefore: c.NotBefore.UTC(), NotAfter: c.NotAfter.UTC()}
}

// subject names c by its subject, or its URI SAN when the subject is
// empty (an X509-SVID leaf often has none).
func subject(c *x509.Certificate) string {
	if s := c.Subject.String(); s != "" {
		return s
	}
	if len(c.URIs) > 0 {
		return c.URIs[0].String()
	}
	return "(empty)"
}

// x509Bundles counts set's authorities per trust domain, sorted.
func x509Bundles(set *x509bundle.Set) []BundleOutput {
	return perTrustDomain(set.Bundles(), func(b *x509bundle.Bundle) BundleOutput {
		n := len(b.X509Authorities())
		return BundleOutput{TrustDomain: b.TrustDomain().Name(), X509: &n}
	})
}

// perTrustDomain is one row per bundle, sorted by trust domain.
func perTrustDomain[B any](bundles []B, row func(B) BundleOutput) []BundleOutput {
	out := make([]BundleOutput, 0, len(bundles))
	for _, b := range bundles {
		out = append(out, row(b))
	}
	slices.SortFunc(out, func(a, b BundleOutput) int { return strings.Compare(a.TrustDomain, b.TrustDomain) })
	return out
}

func x509Table(w io.Writer, out X509Output) error {
	for i, s := range out.SVIDs {
		fmt.Fprintf(w, "SVID %d: %s\n  hint:       %s\n  expires at: %s\n  chain:\n", i, cli.Printable(s.SPIFFEID), orNone(s.Hint), stamp(s.ExpiresAt))
		for j, c := range s.Chain {
			fmt.Fprintf(w, "    [%d] %s (issuer %s, until %s)\n", j, cli.Printable(c.Subject), cli.Printable(c.Issuer), stamp(c.NotAfter))
		}
		fmt.Fprintln(w)
	}
	if err := bundlesTable(w, out.Bundles); err != nil {
		return err
	}
	for _, f := range out.Files {
		if _, err := fmt.Fprintf(w, "wrote %s\n", f); err != nil {
			return err
		}
	}
	return nil
}

// writeX509 writes each SVID's chain, key and bundles into dir, named as
// spire-agent names them, and returns the paths written.
func writeX509(dir string, x *workloadapi.X509Context) ([]string, error) {
	var files []cli.OutFile
	for i, s := range x.SVIDs {
		key, err := cli.KeyPEM(s.PrivateKey)
		if err != nil {
			return nil, fmt.Errorf("SVID %d's key: %w", i, err)
		}
		own, err := x.Bundles.GetX509BundleForTrustDomain(s.ID.TrustDomain())
		if err != nil {
			return nil, err
		}
		files = append(files,
			cli.OutFile{Name: fmt.Sprintf("svid.%d.pem", i), Data: cli.CertsPEM(s.Certificates), Mode: 0o644},
			cli.OutFile{Name: fmt.Sprintf("svid.%d.key", i), Data: key, Mode: 0o600},
			cli.OutFile{Name: fmt.Sprintf("bundle.%d.pem", i), Data: cli.CertsPEM(own.X509Authorities()), Mode: 0o644})
		m := 0
		for _, b := range sortedBundles(x.Bundles) {
			if b.TrustDomain() == s.ID.TrustDomain() {
				continue
			}
			files = append(files, cli.OutFile{Name: fmt.Sprintf("federated_bundle.%d.%d.pem", i, m), Data: cli.CertsPEM(b.X509Authorities()), Mode: 0o644})
			m++
		}
	}
	if err := cli.WriteFiles(dir, files); err != nil {
		return nil, err
	}
	paths := make([]string, len(files))
	for i, f := range files {
		paths[i] = filepath.Join(dir, f.Name)
	}
	return paths, nil
}

func sortedBundles(set *x509bundle.Set) []*x509bundle.Bundle {
	bs := set.Bundles()
	slices.SortFunc(bs, func(a, b *x509bundle.Bundle) int {
		return strings.Compare(a.TrustDomain().Name(), b.TrustDomain().Name())
	})
	return bs
}
