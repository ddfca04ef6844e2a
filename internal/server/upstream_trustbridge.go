package server

import (
	"errors"
	"fmt"
	"time"

	"github.com/spf13/pflag"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca/upstream/trustbridge"
	"github.com/trustbridge/trustbridge/internal/caclient"
)

// TrustbridgeUpstreamConfig are the flags of --upstream trustbridge: the
// upstream trustbridge's certificate service, and the SVID (of its trust
// domain, in its --downstream-allow) this server authenticates with.
type TrustbridgeUpstreamConfig struct {
	Address   string
	RootCert  string
	ProvCert  string
	tokenFile string
	serverID  string
	Timeout   time.Duration
}

func addTrustbridgeUpstreamFlags(f *pflag.FlagSet, o *TrustbridgeUpstreamConfig) {
	f.StringVar(&o.Address, "upstream-address", "", "with --upstream trustbridge: the upstream trustbridge's certificate service (its --grpc-listen), host:port")
	f.StringVar(&o.RootCert, "upstream-root-cert", "", "with --upstream trustbridge: PEM roots of the upstream's trust domain, to verify it")
	f.StringVar(&o.ProvCert, "upstream-prov-cert", "", "with --upstream trustbridge: directory with cert-chain.pem and key.pem, an X509-SVID the upstream issued for an ID in its --downstream-allow; "+
		"read on every request, keep it fresh with trustbridge ca request --renew or an agent")
	f.StringVar(&o.tokenFile, "upstream-token-file", "", "with --upstream trustbridge: not accepted; a trustbridge upstream signs intermediates only for a caller proving an X509-SVID (use --upstream-prov-cert)")
	f.StringVar(&o.serverID, "upstream-server-spiffe-id", "", "with --upstream trustbridge: SPIFFE ID the upstream must present (default spiffe://<upstream trust domain>"+caclient.ServerPath+")")
	f.DurationVar(&o.Timeout, "upstream-timeout", trustbridge.DefaultTimeout, "with --upstream trustbridge: deadline of one request to the upstream")
}

// newTrustbridgeUpstreamClient builds the client of --upstream
// trustbridge from its flags.
func newTrustbridgeUpstreamClient(o TrustbridgeUpstreamConfig) (*trustbridge.Client, error) {
	if o.tokenFile != "" {
		return nil, errors.New("--upstream-token-file: a trustbridge upstream does not sign intermediates for a bearer token; authenticate with --upstream-prov-cert DIR, an SVID it issued for an ID in its --downstream-allow (see docs/upstream-trustbridge.md)")
	}
	if o.RootCert == "" {
		return nil, errors.New("--upstream trustbridge needs --upstream-root-cert, the upstream trust domain's roots (PEM)")
	}
	roots, err := caclient.ReadPEMCerts(o.RootCert)
	if err != nil {
		return nil, fmt.Errorf("--upstream-root-cert: %w", err)
	}
	var serverID spiffeid.ID
	if o.serverID != "" {
		if serverID, err = spiffeid.FromString(o.serverID); err != nil {
			return nil, fmt.Errorf("--upstream-server-spiffe-id %q: %w", o.serverID, err)
		}
	}
	return trustbridge.New(trustbridge.Config{Address: o.Address, Roots: roots, ServerID: serverID, ProvCertDir: o.ProvCert, Timeout: o.Timeout})
}
