package agent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	secretv3 "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/sds"
)

// FetchTrust asks the SDS server on the certificate service's listener at
// addr, over a connection configured by tlsCfg (caclient.ServerTLS with
// the caller's new certificate), for ROOTCA and ALL in one FetchSecrets,
// and returns them per trust domain: ROOTCA as id's trust domain's roots,
// ALL as every trust domain the server lets id trust. This is how `ca
// request` and the agent's Rotator learn which trust domain each root
// belongs to: the roots a CA appends to a certificate chain are a flat
// list that cannot say so.
func FetchTrust(ctx context.Context, addr string, tlsCfg *tls.Config, id spiffeid.ID) (caclient.Trust, error) {
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRelayResponse)))
	if err != nil {
		return caclient.Trust{}, err
	}
	defer conn.Close()
	resp, err := secretv3.NewSecretDiscoveryServiceClient(conn).FetchSecrets(ctx, &discoveryv3.DiscoveryRequest{
		Node:          &corev3.Node{Id: id.String(), Cluster: "trustbridge-ca-request", UserAgentName: "trustbridge"},
		TypeUrl:       resourcev3.SecretType,
		ResourceNames: []string{sds.AllName, sds.RootCAName},
	})
	if err != nil {
		return caclient.Trust{}, err
	}
	trust, err := trustOf(resp, id.TrustDomain())
	if err != nil {
		return caclient.Trust{}, fmt.Errorf("the server's trust (SDS %s and %s): %w", sds.RootCAName, sds.AllName, err)
	}
	return trust, nil
}

// trustOf checks a FetchSecrets answer: exactly ROOTCA and ALL, each
// valid, and ALL's entry for td, when there is one, the same roots as
// ROOTCA (both come from one snapshot of the server's trust store).
func trustOf(resp *discoveryv3.DiscoveryResponse, td spiffeid.TrustDomain) (caclient.Trust, error) {
	if resp.GetTypeUrl() != "" && resp.GetTypeUrl() != resourcev3.SecretType {
		return caclient.Trust{}, fmt.Errorf("response type %q, want %q", resp.GetTypeUrl(), resourcev3.SecretType)
	}
	if n := len(resp.GetResources()); n > maxRelayResources {
		return caclient.Trust{}, fmt.Errorf("%d resources in one response; at most %d are accepted", n, maxRelayResources)
	}
	t := caclient.Trust{TrustDomain: td}
	for i, a := range resp.GetResources() {
		v, err := parseValidation(a, td)
		if err != nil {
			return caclient.Trust{}, fmt.Errorf("resource %d: %w", i, err)
		}
		switch {
		case v.name == sds.RootCAName && t.Local == nil:
			t.Local = v.roots
		case v.name == sds.AllName && t.Bundles == nil:
			t.Bundles, t.Withheld = withoutLimited(v.byTD, v.limits)
		default:
			return caclient.Trust{}, fmt.Errorf("resource %d: %s twice", i, v.name)
		}
	}
	switch {
	case t.Local == nil:
		return caclient.Trust{}, fmt.Errorf("no %s in the answer", sds.RootCAName)
	case t.Bundles == nil:
		return caclient.Trust{}, fmt.Errorf("no %s in the answer", sds.AllName)
	}
	if all, ok := t.Bundles[td]; ok && !slices.EqualFunc(all, t.Local, func(a, b *x509.Certificate) bool { return a.Equal(b) }) {
		return caclient.Trust{}, errors.New("ALL and ROOTCA disagree on the local trust domain's roots")
	}
	return t, nil
}

// withoutLimited is byTD without the trust domains the server limits to
// some peers, and those trust domains, sorted: files (bundle.spiffe.json,
// a trust bundle) cannot say which peers, and trusting every member would
// widen what the server decided.
func withoutLimited(byTD map[spiffeid.TrustDomain][]*x509.Certificate, limits peerLimits) (map[spiffeid.TrustDomain][]*x509.Certificate, []spiffeid.TrustDomain) {
	var withheld []spiffeid.TrustDomain
	out := make(map[spiffeid.TrustDomain][]*x509.Certificate, len(byTD))
	for td, roots := range byTD {
		if len(limits[td]) > 0 {
			withheld = append(withheld, td)
			continue
		}
		out[td] = roots
	}
	slices.SortFunc(withheld, func(a, b spiffeid.TrustDomain) int { return strings.Compare(a.Name(), b.Name()) })
	return out, withheld
}

// Issued is a certificate obtained with Obtain and the trust that came
// with it.
type Issued struct {
	ID spiffeid.ID
	// Chain is the leaf and intermediates, to present.
	Chain []*x509.Certificate
	Trust caclient.Trust
}

// Obtain asks the certificate service at addr for a certificate for req
// (authenticated by clientCert or req.Token), verifying the server as
// serverID against roots (caclient.ServerTLS), then fetches the trust that
// goes with it (FetchTrust, authenticated by the new certificate) and
// checks the leaf against the server's roots of its own trust domain
// (caclient.CheckIssued). opts go to x509svid.Verify.
func Obtain(ctx context.Context, addr string, roots []*x509.Certificate, serverID spiffeid.ID, clientCert *tls.Certificate,
	req caclient.Request, opts ...x509svid.VerifyOption) (*Issued, error) {
	answer, err := caclient.CreateCertificate(ctx, addr, caclient.ServerTLS(roots, serverID, clientCert), req)
	if err != nil {
		return nil, err
	}
	chain := caclient.LeafChain(answer)
	id, err := x509svid.IDFromCert(chain[0])
	if err != nil {
		return nil, fmt.Errorf("unusable certificate: %w", err)
	}
	der := make([][]byte, len(chain))
	for i, c := range chain {
		der[i] = c.Raw
	}
	fresh := &tls.Certificate{Certificate: der, PrivateKey: req.Key, Leaf: chain[0]}
	trust, err := FetchTrust(ctx, addr, caclient.ServerTLS(roots, serverID, fresh), id)
	if err != nil {
		return nil, err
	}
	if _, err := caclient.CheckIssued(chain, req.Key, serverID.TrustDomain(), req.ID, trust.Local, opts...); err != nil {
		return nil, fmt.Errorf("unusable certificate: %w", err)
	}
	return &Issued{ID: id, Chain: chain, Trust: trust}, nil
}
