package trustbridge_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/ca/upstream/trustbridge"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/caclient"
)

// TestNestedTrust runs a real corp CA behind its certificate service, and
// a region CA whose intermediate corp signs through this client: the
// region's workload certificates verify against corp's roots, which the
// region publishes instead of its intermediate.
func TestNestedTrust(t *testing.T) {
	corp, err := ca.New(ca.Config{TrustDomain: td, DataDir: t.TempDir(), SignsIntermediates: true})
	require.NoError(t, err)
	u := &upstream{authority: corp, ttls: make(chan time.Duration, 8)}
	svc, err := certservice.New(certservice.Config{Signer: corp, Intermediates: corp, DownstreamAllow: []spiffeid.ID{regionEU}, TrustDomain: td,
		Authenticator: authn.Chain{authn.NewX509SVID(td, x509bundle.FromX509Authorities(td, corp.Bundle().X509Authorities()), nil)}})
	require.NoError(t, err)
	sc, err := corp.ServingCert(spiffeid.RequireFromPath(td, caclient.ServerPath), time.Hour)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	u.addr = ln.Addr().String()
	srv := certservice.NewServer(svc, certservice.TLSConfig(sc.GetCertificate), ln)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})

	client, err := trustbridge.New(trustbridge.Config{Address: u.addr, Roots: corp.Bundle().X509Authorities(), ProvCertDir: u.provCert(t, regionEU)})
	require.NoError(t, err)
	region, err := ca.New(ca.Config{TrustDomain: td, DataDir: t.TempDir(), Upstream: client, UpstreamTTL: 24 * time.Hour})
	require.NoError(t, err)
	require.NoError(t, region.Reconcile())

	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	require.NoError(t, err)
	csr, err := ca.ParseCSR(der)
	require.NoError(t, err)
	workload := spiffeid.RequireFromString("spiffe://corp.example/ns/shop/sa/web")
	issued, err := region.SignX509SVID(ca.X509SVIDParams{PublicKey: csr.PublicKey, SPIFFEID: workload, TTL: time.Hour})
	require.NoError(t, err)

	corpBundle := x509bundle.FromX509Authorities(td, corp.Bundle().X509Authorities())
	id, _, err := x509svid.Verify(caclient.LeafChain(issued.Chain), corpBundle)
	require.NoError(t, err)
	assert.Equal(t, workload, id)
	leafChain := caclient.LeafChain(issued.Chain)
	require.Len(t, leafChain, 2, "leaf, then the region's intermediate")
	inter := leafChain[1]
	assert.True(t, inter.IsCA)
	assert.True(t, inter.MaxPathLenZero)
	assert.Equal(t, []string{"spiffe://corp.example"}, uriStrings(inter))
	assert.ElementsMatch(t, rawOf(corp.Bundle().X509Authorities()), rawOf(region.Bundle().X509Authorities()),
		"the region publishes corp's roots, not its intermediate")
}

func uriStrings(c *x509.Certificate) []string {
	var out []string
	for _, u := range c.URIs {
		out = append(out, u.String())
	}
	return out
}

func rawOf(certs []*x509.Certificate) [][]byte {
	var out [][]byte
	for _, c := range certs {
		out = append(out, c.Raw)
	}
	return out
}
