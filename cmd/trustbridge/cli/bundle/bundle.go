package bundle

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/server/api"
)

// Formats of bundle show and bundle inspect besides table, json and yaml.
const (
	outputSPIFFE = "spiffe"
	outputPEM    = "pem"
)

func newBundleShowCmd(e cli.Env) *cobra.Command {
	var c cli.AdminClient
	cmd := &cobra.Command{
		Use:   "show",
		Short: "Print this trust domain's bundle (its CA's roots), as a peer's operator needs it",
		Long: `Print the local trust domain's bundle, the roots the CA publishes (like
spire-server bundle show): -o spiffe is the SPIFFE bundle document an
https_spiffe peer's operator gives as the bootstrap bundle (federation add
--bundle, --federate's fourth field, SPIRE's bundle set -format spiffe);
-o pem the roots as PEM (Istio's root-cert.pem; SPIRE's -format pem); the
table, json and yaml formats describe each root with its SHA-256 fingerprint,
to compare over a second channel.

It reads the --data-dir (file storage) without taking the server's lock, so
it works while the server runs, or, with --admin, asks the running server
(any storage, and a --ca-dir server).`,
		Example: `  trustbridge bundle show --data-dir /var/lib/trustbridge
  trustbridge bundle show -o spiffe > example.org.json       # for a peer's operator
  trustbridge bundle show -o pem --admin http://127.0.0.1:15014 > root-cert.pem`,
		Args: cobra.NoArgs,
	}
	out := cli.AddOutputFlag(cmd, outputSPIFFE, outputPEM)
	f := cmd.Flags()
	f.StringVar(&c.DataDir, "data-dir", "./data", "the server's --data-dir, read without its lock")
	f.StringVar(&c.Addr, "admin", "", "ask the running server at this admin address instead (e.g. http://127.0.0.1:15014)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := out.Check(); err != nil {
			return err
		}
		var (
			b   *spiffebundle.Bundle
			src string
			err error
		)
		if c.Addr != "" {
			b, err = bundleFromAdmin(cmd.Context(), &c)
			src = c.Addr
		} else {
			b, err = bundleFromDataDir(c.DataDir)
			src = c.DataDir
		}
		if err != nil {
			return err
		}
		return writeBundle(e.Out, out, b, src, e.Now())
	}
	return cmd
}

// bundleFromDataDir reads the published roots and JWT keys from the CA
// state in dir, read-only: the journal is written atomically after the
// material it names.
func bundleFromDataDir(dir string) (*spiffebundle.Bundle, error) {
	store := ca.NewStore(dir)
	j, roots, jwtKeys, err := store.LoadWithJWTKeys("")
	if err != nil {
		return nil, err
	}
	if j == nil {
		return nil, fmt.Errorf("no CA state in %s; pass the server's --data-dir, or --admin to ask the running server", store.Dir())
	}
	td, err := spiffeid.TrustDomainFromString(j.TrustDomain)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", store.Dir(), err)
	}
	certs := make([]*x509.Certificate, 0, len(roots))
	for _, r := range roots {
		certs = append(certs, r.Cert)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("no roots in %s (a --ca-dir server keeps its roots in that directory); use --admin to ask the running server", store.Dir())
	}
	b := spiffebundle.FromX509Authorities(td, certs)
	for _, k := range jwtKeys {
		if err := b.AddJWTAuthority(k.KID, k.Key.Public()); err != nil {
			return nil, fmt.Errorf("%s: JWT key %s: %w", store.Dir(), k.KID, err)
		}
	}
	b.SetSequenceNumber(j.Sequence)
	if j.Settings != nil && j.Settings.RefreshHintSeconds > 0 {
		b.SetRefreshHint(time.Duration(j.Settings.RefreshHintSeconds) * time.Second)
	}
	return b, nil
}

// bundleFromAdmin reads the published bundle from GET /v1/bundle, with the
// trust domain GET /v1/trust names (a bundle document does not).
func bundleFromAdmin(ctx context.Context, c *cli.AdminClient) (*spiffebundle.Bundle, error) {
	body, err := c.Do(ctx, http.MethodGet, "/v1/trust", nil, false)
	if err != nil {
		return nil, err
	}
	var trust api.Trust
	if err := json.Unmarshal([]byte(body), &trust); err != nil {
		return nil, fmt.Errorf("admin answer: %w", err)
	}
	td, err := bundledoc.TrustDomainName(trust.TrustDomain)
	if err != nil {
		return nil, fmt.Errorf("admin answer: %w", err)
	}
	doc, err := c.Do(ctx, http.MethodGet, "/v1/bundle", nil, false)
	if err != nil {
		return nil, err
	}
	b, _, err := bundledoc.Parse(td, []byte(doc))
	if err != nil {
		return nil, fmt.Errorf("admin answer: %w", err)
	}
	return b, nil
}

// writeBundle prints b as the chosen format; table, json and yaml are
// bundle inspect's report of it.
func writeBundle(w io.Writer, out *cli.OutputFlag, b *spiffebundle.Bundle, src string, now time.Time) error {
	switch {
	case out.Is(outputSPIFFE):
		doc, err := bundledoc.Marshal(b)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", doc)
		return err
	case out.Is(outputPEM):
		return writePEM(w, b)
	}
	ins := &Inspection{Source: src, Kind: "bundle", bundles: []*spiffebundle.Bundle{b}, Warnings: []warningReport{}}
	ins.fill(now)
	return out.Write(w, ins, ins.writeTable)
}

// writePEM writes b's X.509 authorities as PEM CERTIFICATE blocks.
func writePEM(w io.Writer, b *spiffebundle.Bundle) error {
	_, err := w.Write(caclient.EncodeCerts(b.X509Authorities()))
	return err
}

func newBundleSetCmd(e cli.Env) *cobra.Command {
	var c cli.AdminClient
	cmd := &cobra.Command{
		Use:   "set TRUST_DOMAIN FILE",
		Short: "Set a trust domain's bootstrap or static bundle on the running server",
		Long: `Give the running server a bundle of TRUST_DOMAIN (like spire-server bundle
set): FILE ("-" for standard input) holds a SPIFFE bundle document or PEM CA
certificates (Istio's root-cert.pem), detected by its content, checked as a
fetched bundle is (CA certificates only, none naming another trust domain).

When TRUST_DOMAIN has an endpoint added with federation add, the bundle
becomes its bootstrap bundle: it authenticates the endpoint's https_spiffe
first fetch (once fetched, the endpoint's own bundle is kept current). Else
it is a static bundle: trusted as is, shown with origin "static", until set
again or deleted with bundle delete; federation add later takes it as the
bootstrap bundle. Applied at once, recorded in the audit log and kept in the
data directory. Trust domains configured by flags or files, and our own, are
refused. Needs the admin token (<data-dir>/admin.token), or the admin socket
found by default.`,
		Example: `  trustbridge bundle set east.example east.example.json --data-dir /var/lib/trustbridge
  trustbridge bundle set mesh.example /etc/cacerts/root-cert.pem
  # the bundle first, then the endpoint it bootstraps (SPIRE's order)
  trustbridge bundle set east.example east.example.pem
  trustbridge federation add east.example https://east.example:8443/ \
      --endpoint-spiffe-id spiffe://east.example/trustbridge/bundle-endpoint`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			td, err := bundledoc.ParseTrustDomain(args[0])
			if err != nil {
				return fmt.Errorf("trust domain %q: %w", args[0], err)
			}
			doc, err := readInput(cmd.InOrStdin(), args[1], bundledoc.DefaultMaxSize)
			if err != nil {
				return err
			}
			// Checked here too, so a wrong file is refused with its name
			// before anything is sent.
			if _, _, err := bundledoc.ParseAny(td, doc); err != nil {
				return fmt.Errorf("%s: %w", displayName(args[1]), err)
			}
			return cli.AdminFrom(cmd, &c).Relay(cmd.Context(), e.Out, http.MethodPut, "/v1/bundles/"+url.PathEscape(td.Name()), doc, true)
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.Addr, "admin", "http://127.0.0.1:15014", cli.AdminFlagHelp)
	c.AddAuthFlags(f)
	return cmd
}
