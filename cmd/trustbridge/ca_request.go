package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/sds/agent"
)

type caRequestOptions struct {
	CAConn
	credsDir string
	renew    bool
	spiffeID string
	ttl      time.Duration
	keyType  string
}

func newCARequestCmd(e Env) *cobra.Command {
	var (
		o               caRequestOptions
		outOld, certOld *OldName
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
	outOld = AddOldName(cmd, "out", CredentialsDirFlag)
	certOld = AddOldName(cmd, "cert-dir", "prov-cert")
	f := cmd.Flags()
	AddCAConnFlags(f, &o.CAConn)
	f.StringVar(&o.credsDir, CredentialsDirFlag, "", "directory to write key.pem (0600), cert-chain.pem, root-cert.pem and bundle.spiffe.json into (required)")
	f.BoolVar(&o.renew, "renew", false, "authenticate with the certificate in --credentials-dir and replace it (renewal in place)")
	f.StringVar(&o.spiffeID, "spiffe-id", "", "SPIFFE ID to put in the CSR; the server refuses it unless it is the identity you authenticate as")
	f.DurationVar(&o.ttl, "ttl", 0, "certificate lifetime to ask for (default: the server's --workload-ttl)")
	f.StringVar(&o.keyType, "key-type", string(ca.KeyECP256), "workload key type: ec-p256, ec-p384, rsa-2048, rsa-3072, rsa-4096")
	return cmd
}

func runCARequest(ctx context.Context, e Env, o caRequestOptions) error {
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
		return RequestError(o.Addr, o.Timeout, "a certificate", err)
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
	if n := CountTrue(o.TokenFile != "", o.renew, o.ProvCert != ""); n != 1 {
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
		return ClientCredentials(o.credsDir, "--renew: --credentials-dir", "", now, want)
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

// bearerToken sends "authorization: Bearer <token>", only over TLS.
type BearerToken = caclient.BearerToken

// requestError says what a failed call means for the person running it.
func RequestError(addr string, timeout time.Duration, what string, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	switch st.Code() {
	case codes.Unauthenticated:
		return fmt.Errorf("the CA at %s did not accept the credentials (token or certificate): %s", addr, msg)
	case codes.PermissionDenied:
		return fmt.Errorf("the CA at %s refused to issue this identity: %s", addr, msg)
	case codes.InvalidArgument:
		return fmt.Errorf("the CA at %s refused the request: %s", addr, msg)
	case codes.ResourceExhausted:
		return fmt.Errorf("the CA at %s is busy or rate-limits this identity; retry later: %s", addr, msg)
	case codes.Unavailable:
		return fmt.Errorf("cannot get %s from %s (is the server running with --grpc-listen, and does --root-cert hold its roots?): %s", what, addr, msg)
	case codes.DeadlineExceeded:
		return fmt.Errorf("no answer from the CA at %s within --timeout %s: %s", addr, timeout, msg)
	}
	return fmt.Errorf("the CA at %s: %s: %s", addr, st.Code(), msg)
}

func ReadPEMCerts(path string) ([]*x509.Certificate, error) {
	return caclient.ReadPEMCerts(path)
}

// parsePEMCerts parses every CERTIFICATE block; there must be one.
func ParsePEMCerts(data []byte) ([]*x509.Certificate, error) {
	return caclient.ParsePEMCerts(data)
}

// readSmallFile reads at most limit bytes of a regular file.
func ReadSmallFile(path string, limit int64) ([]byte, error) {
	return caclient.ReadFile(path, limit)
}

// countTrue is how many of bs are true.
func CountTrue(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}
