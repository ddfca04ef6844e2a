package ca

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/cmd/trustbridge/cli"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/sds/agent"
)

type caRequestOptions struct {
	cli.CAConn
	credsDir string
	renew    bool
	spiffeID string
	ttl      time.Duration
	keyType  string
}

func newCARequestCmd(e cli.Env) *cobra.Command {
	var (
		o               caRequestOptions
		outOld, certOld *cli.OldName
	)
	cmd := &cobra.Command{
		Use:   "request --ca-addr ADDR --root-cert FILE (--token-file FILE | --renew | --prov-cert DIR) --credentials-dir DIR",
		Short: "Obtain a workload certificate from a running server's certificate service (bootstrap a VM, renew)",
		Long: `Generate a key locally and ask the certificate service of a running trustbridge
(--grpc-listen) for an X509-SVID, writing into --credentials-dir: key.pem (mode 0600),
cert-chain.pem (leaf first), root-cert.pem (the roots of the workload's own
trust domain, and only those) and bundle.spiffe.json (a SPIFFE bundle map of
every trust domain the server lets this workload trust, its own included).

Trust stays per trust domain: the roots come from the server's SDS (ROOTCA and
ALL, fetched with the new certificate on the same listener), never from the
flat root list appended to the certificate chain, so a federated peer's root
is only ever trusted for that peer's trust domain. Point Envoy's SPIFFE
validator (trust_bundles) or go-spiffe's bundle source at bundle.spiffe.json;
tools that take one PEM file of roots get root-cert.pem and trust the local
trust domain alone.

The server decides the identity from how the caller authenticates, never from
the request: with --token-file, a bootstrap token (--bootstrap-token-file on
the server) or a Kubernetes service account token; with --renew, the
certificate in --credentials-dir (cert-chain.pem and key.pem, as written by
this command or 'ca issue'), which renews it in place; with --prov-cert DIR,
the certificate in another directory (Istio's PROV_CERT), which is only read.

--root-cert is the trust for the connection: the server must present an
X509-SVID for --server-spiffe-id that chains to these roots. 'trustbridge
bundle inspect -o pem' of a fetched bundle, or the root-cert.pem of an
earlier run, produces it.`,
		Example: `  # bootstrap with a token, then renew in place before the certificate expires
  trustbridge ca request --ca-addr trustbridge.example.org:15012 --root-cert root-cert.pem \
      --token-file laptop.token --credentials-dir /etc/creds
  trustbridge ca request --ca-addr trustbridge.example.org:15012 --root-cert /etc/creds/root-cert.pem \
      --renew --credentials-dir /etc/creds
  # renew with the certificate of one directory into another
  trustbridge ca request --ca-addr trustbridge.example.org:15012 --root-cert root-cert.pem \
      --prov-cert /etc/creds --credentials-dir /etc/creds.new`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := outOld.Merge(&o.credsDir, ""); err != nil {
				return err
			}
			if err := certOld.Merge(&o.ProvCert, "pass only --prov-cert, or --renew to renew the certificate of --credentials-dir in place"); err != nil {
				return err
			}
			return runCARequest(cmd.Context(), e, o)
		},
	}
	outOld = cli.AddOldName(cmd, "out", cli.CredentialsDirFlag)
	certOld = cli.AddOldName(cmd, "cert-dir", "prov-cert")
	f := cmd.Flags()
	cli.AddCAConnFlags(f, &o.CAConn)
	f.StringVar(&o.credsDir, cli.CredentialsDirFlag, "", "directory to write key.pem (0600), cert-chain.pem, root-cert.pem and bundle.spiffe.json into (required)")
	f.BoolVar(&o.renew, "renew", false, "authenticate with the certificate in --credentials-dir and replace it (renewal in place)")
	f.StringVar(&o.spiffeID, "spiffe-id", "", "SPIFFE ID to put in the CSR; the server refuses it unless it is the identity you authenticate as")
	f.DurationVar(&o.ttl, "ttl", 0, "certificate lifetime to ask for (default: the server's --workload-ttl)")
	f.StringVar(&o.keyType, "key-type", string(ca.KeyECP256), "workload key type: ec-p256, ec-p384, rsa-2048, rsa-3072, rsa-4096")
	return cmd
}

func runCARequest(ctx context.Context, e cli.Env, o caRequestOptions) error {
	kt, want, err := o.check()
	if err != nil {
		return err
	}
	clientCert, token, err := o.credentials(e.Now(), &want)
	if err != nil {
		return err
	}
	roots, serverID, err := o.Server(want)
	if err != nil {
		return err
	}
	td := serverID.TrustDomain()
	if !want.IsZero() && !want.MemberOf(td) {
		return fmt.Errorf("--spiffe-id %s is not in the server's trust domain %s", want, td.Name())
	}

	key, err := ca.GenerateKey(kt)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	issued, err := agent.Obtain(ctx, o.Addr, roots, serverID, clientCert, caclient.Request{Key: key, ID: want, TTL: o.ttl, Token: token})
	if err != nil {
		return cli.RequestError(o.Addr, o.Timeout, "a certificate", err)
	}
	if err := caclient.WriteCredentials(o.credsDir, key, issued.Chain, issued.Trust); err != nil {
		return err
	}
	id, leafChain := issued.ID, issued.Chain
	fmt.Fprintf(e.Out, "issued %s, valid until %s\n  %s (%s: %d roots of %s; %s: %s)\n", id, leafChain[0].NotAfter.UTC().Format(time.RFC3339),
		o.credsDir, caclient.RootsFile, len(issued.Trust.Local), id.TrustDomain().Name(), caclient.BundleMapFile, trustDomainList(issued.Trust))
	for _, td := range issued.Trust.Withheld {
		fmt.Fprintf(e.Err, "warning: %s left out of %s: the server's trust policy lets %s trust only some of its peers, which a bundle file cannot say; use trustbridge agent (SDS) for it\n",
			td.Name(), caclient.BundleMapFile, id)
	}
	return nil
}

// check checks the flags that need no file, and returns the key type and
// the identity asked for (zero without --spiffe-id).
func (o caRequestOptions) check() (ca.KeyType, spiffeid.ID, error) {
	if o.Addr == "" || o.RootCert == "" || o.credsDir == "" {
		return "", spiffeid.ID{}, errors.New("--ca-addr, --root-cert and --credentials-dir are required")
	}
	if n := cli.CountTrue(o.TokenFile != "", o.renew, o.ProvCert != ""); n != 1 {
		return "", spiffeid.ID{}, errors.New("give exactly one of --token-file (bootstrap or service account token), --renew (renew the certificate in --credentials-dir) and --prov-cert DIR (authenticate with the certificate in DIR)")
	}
	if o.ttl < 0 || o.ttl%time.Second != 0 {
		return "", spiffeid.ID{}, fmt.Errorf("--ttl %s: want a whole, positive number of seconds", o.ttl)
	}
	if o.Timeout <= 0 {
		return "", spiffeid.ID{}, fmt.Errorf("--timeout %s must be positive", o.Timeout)
	}
	kt, err := ca.ParseKeyType(o.keyType)
	if err != nil {
		return "", spiffeid.ID{}, fmt.Errorf("--key-type: %w", err)
	}
	if o.spiffeID == "" {
		return kt, spiffeid.ID{}, nil
	}
	want, err := spiffeid.FromString(o.spiffeID)
	if err != nil {
		return "", spiffeid.ID{}, fmt.Errorf("--spiffe-id %q: %w", o.spiffeID, err)
	}
	return kt, want, nil
}

// credentials reads what the caller authenticates with: the certificate
// of --renew or --prov-cert (a renewal, which keeps its identity when
// *want is zero) or the token of --token-file.
func (o caRequestOptions) credentials(now time.Time, want *spiffeid.ID) (*tls.Certificate, string, error) {
	if o.renew {
		return cli.ClientCredentials(o.credsDir, "--renew: --credentials-dir", "", now, want)
	}
	return o.CAConn.Credentials(now, want)
}

// trustDomainList names the trust domains of t's bundle map, sorted.
func trustDomainList(t caclient.Trust) string {
	names := []string{t.TrustDomain.Name()}
	for td := range t.Bundles {
		if td != t.TrustDomain {
			names = append(names, td.Name())
		}
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
