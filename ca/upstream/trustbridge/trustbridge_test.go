package trustbridge_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	caupstream "github.com/trustbridge/trustbridge/ca/upstream"
	"github.com/trustbridge/trustbridge/ca/upstream/trustbridge"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/caclient"
)

var (
	td       = spiffeid.RequireTrustDomainFromString("corp.example")
	regionEU = spiffeid.RequireFromString("spiffe://corp.example/region/eu")
	regionUS = spiffeid.RequireFromString("spiffe://corp.example/region/us")
)

// upstream is a certificate service of corp.example on loopback whose
// intermediates come from a fake signer: a CA certificate for the CSR's
// key, signed by a test root of its own, recording the lifetime.
type upstream struct {
	authority *ca.Authority
	addr      string
	ttls      chan time.Duration
}

func startUpstream(t *testing.T, allow ...spiffeid.ID) *upstream {
	t.Helper()
	a, err := ca.New(ca.Config{TrustDomain: td, DataDir: t.TempDir()})
	require.NoError(t, err)
	u := &upstream{authority: a, ttls: make(chan time.Duration, 8)}
	rootKey, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	rootTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fake root"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	rootDER, err := x509.CreateCertificate(rand.Reader, rootTmpl, rootTmpl, rootKey.Public(), rootKey)
	require.NoError(t, err)
	root, err := x509.ParseCertificate(rootDER)
	require.NoError(t, err)
	signer := certservice.IntermediateSignerFunc(func(csr *x509.CertificateRequest, ttl time.Duration) (*ca.UpstreamChain, error) {
		u.ttls <- ttl
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), NotBefore: time.Now(), NotAfter: time.Now().Add(ttl),
			IsCA: true, BasicConstraintsValid: true, MaxPathLenZero: true, KeyUsage: x509.KeyUsageCertSign}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, root, csr.PublicKey, rootKey)
		if err != nil {
			return nil, err
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, err
		}
		return &ca.UpstreamChain{Chain: []*x509.Certificate{c}, Roots: []*x509.Certificate{root}}, nil
	})
	svc, err := certservice.New(certservice.Config{Signer: a, Intermediates: signer, DownstreamAllow: allow, TrustDomain: td,
		Authenticator: authn.Chain{authn.NewX509SVID(td, x509bundle.FromX509Authorities(td, a.Bundle().X509Authorities()), nil)}})
	require.NoError(t, err)
	sc, err := a.ServingCert(spiffeid.RequireFromPath(td, caclient.ServerPath), time.Hour)
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
	return u
}

// provCert writes an SVID for id, issued by the upstream, into a fresh
// directory, as `trustbridge ca request` would.
func (u *upstream) provCert(t *testing.T, id spiffeid.ID) string {
	t.Helper()
	dir := t.TempDir()
	u.writeProvCert(t, dir, id)
	return dir
}

func (u *upstream) writeProvCert(t *testing.T, dir string, id spiffeid.ID) {
	t.Helper()
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	require.NoError(t, err)
	csr, err := ca.ParseCSR(der)
	require.NoError(t, err)
	issued, err := u.authority.SignX509SVID(ca.X509SVIDParams{PublicKey: csr.PublicKey, SPIFFEID: id, TTL: time.Hour})
	require.NoError(t, err)
	roots := u.authority.Bundle().X509Authorities()
	require.NoError(t, caclient.WriteCredentials(dir, key, caclient.LeafChain(issued.Chain), caclient.Trust{TrustDomain: td, Local: roots}))
}

func csrDER(t *testing.T) []byte {
	t.Helper()
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	require.NoError(t, err)
	return der
}

func TestSignIntermediate(t *testing.T) {
	u := startUpstream(t, regionEU)
	c, err := trustbridge.New(trustbridge.Config{Address: u.addr, Roots: u.authority.Bundle().X509Authorities(), ProvCertDir: u.provCert(t, regionEU)})
	require.NoError(t, err)
	assert.Equal(t, "trustbridge upstream "+u.addr, c.String())
	chain, err := c.SignIntermediate(context.Background(), csrDER(t), 10*time.Hour)
	require.NoError(t, err)
	assert.Equal(t, 10*time.Hour, <-u.ttls)
	require.Len(t, chain.Chain, 1)
	require.Len(t, chain.Roots, 1)
	assert.True(t, chain.Chain[0].IsCA)
	require.NoError(t, chain.Chain[0].CheckSignatureFrom(chain.Roots[0]))
}

// The credentials are read on every call: a renewer replacing them, or
// fixing a missing directory, needs no restart.
func TestCredentialsReadEachCall(t *testing.T) {
	u := startUpstream(t, regionEU)
	dir := t.TempDir()
	c, err := trustbridge.New(trustbridge.Config{Address: u.addr, Roots: u.authority.Bundle().X509Authorities(), ProvCertDir: dir})
	require.NoError(t, err)
	_, err = c.SignIntermediate(context.Background(), csrDER(t), time.Hour)
	require.ErrorContains(t, err, "--upstream-prov-cert")
	assert.Empty(t, u.ttls)

	u.writeProvCert(t, dir, regionUS)
	_, err = c.SignIntermediate(context.Background(), csrDER(t), time.Hour)
	require.Equal(t, codes.PermissionDenied, status.Code(err))

	u.writeProvCert(t, dir, regionEU)
	_, err = c.SignIntermediate(context.Background(), csrDER(t), time.Hour)
	require.NoError(t, err)
}

func TestNotAllowed(t *testing.T) {
	u := startUpstream(t, regionEU)
	c, err := trustbridge.New(trustbridge.Config{Address: u.addr, Roots: u.authority.Bundle().X509Authorities(), ProvCertDir: u.provCert(t, regionUS)})
	require.NoError(t, err)
	_, err = c.SignIntermediate(context.Background(), csrDER(t), time.Hour)
	require.Equal(t, codes.PermissionDenied, status.Code(err))
	assert.ErrorContains(t, err, "upstream trustbridge at "+u.addr+" refused spiffe://corp.example/region/us: spiffe://corp.example/region/us is not in this server's --downstream-allow; add it there")
	assert.True(t, caupstream.IsRefused(err), "asking again gets the same answer until the upstream's --downstream-allow changes")
	assert.Empty(t, u.ttls)
}

// An upstream that is not up, or credentials not yet written, are no
// refusal: the CA retries those from a few seconds on.
func TestUnreachableIsNoRefusal(t *testing.T) {
	u := startUpstream(t, regionEU)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	down := ln.Addr().String()
	require.NoError(t, ln.Close())
	c, err := trustbridge.New(trustbridge.Config{Address: down, Roots: u.authority.Bundle().X509Authorities(), ProvCertDir: u.provCert(t, regionEU)})
	require.NoError(t, err)
	_, err = c.SignIntermediate(context.Background(), csrDER(t), time.Hour)
	require.Equal(t, codes.Unavailable, status.Code(err))
	assert.False(t, caupstream.IsRefused(err))

	c, err = trustbridge.New(trustbridge.Config{Address: u.addr, Roots: u.authority.Bundle().X509Authorities(), ProvCertDir: t.TempDir()})
	require.NoError(t, err)
	_, err = c.SignIntermediate(context.Background(), csrDER(t), time.Hour)
	require.ErrorContains(t, err, "--upstream-prov-cert")
	assert.False(t, caupstream.IsRefused(err))
}

func TestWrongServerID(t *testing.T) {
	u := startUpstream(t, regionEU)
	c, err := trustbridge.New(trustbridge.Config{Address: u.addr, Roots: u.authority.Bundle().X509Authorities(), ProvCertDir: u.provCert(t, regionEU),
		ServerID: spiffeid.RequireFromString("spiffe://corp.example/other")})
	require.NoError(t, err)
	_, err = c.SignIntermediate(context.Background(), csrDER(t), time.Hour)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "want spiffe://corp.example/other")
	assert.Empty(t, u.ttls)
}

func TestNewRefusesIncompleteConfig(t *testing.T) {
	roots := []*x509.Certificate{{}}
	for _, tc := range []struct {
		cfg  trustbridge.Config
		want string
	}{
		{trustbridge.Config{Roots: roots, ProvCertDir: "d"}, "--upstream-address"},
		{trustbridge.Config{Address: "a:1", ProvCertDir: "d"}, "--upstream-root-cert"},
		{trustbridge.Config{Address: "a:1", Roots: roots}, "--upstream-prov-cert"},
		{trustbridge.Config{Address: "a:1", Roots: roots, ProvCertDir: "d", Timeout: -1}, "negative"},
	} {
		_, err := trustbridge.New(tc.cfg)
		assert.ErrorContains(t, err, tc.want)
	}
}
