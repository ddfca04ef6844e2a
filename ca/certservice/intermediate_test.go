package certservice_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/identityapi"
)

var downstreamID = spiffeid.RequireFromString("spiffe://example.org/region/eu")

// fakeIntermediates signs a CA certificate for the CSR's key with a test
// root of its own, recording the lifetime asked for. err, when set, is
// returned instead.
type fakeIntermediates struct {
	root    *x509.Certificate
	rootKey any

	mu    sync.Mutex
	calls int
	ttl   time.Duration
	err   error
}

func newFakeIntermediates(tb testing.TB) *fakeIntermediates {
	tb.Helper()
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(tb, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fake upstream root"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	require.NoError(tb, err)
	root, err := x509.ParseCertificate(der)
	require.NoError(tb, err)
	return &fakeIntermediates{root: root, rootKey: key}
}

func (f *fakeIntermediates) SignIntermediate(csr *x509.CertificateRequest, ttl time.Duration) (*ca.UpstreamChain, error) {
	f.mu.Lock()
	f.calls++
	f.ttl = ttl
	err := f.err
	f.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return f.issue(csr, ttl, &x509.Certificate{SerialNumber: big.NewInt(42), NotBefore: time.Now()})
}

// issue signs an intermediate for csr's key and SPIFFE ID under the fake
// root, lasting ttl, on tmpl's serial, subject and NotBefore.
func (f *fakeIntermediates) issue(csr *x509.CertificateRequest, ttl time.Duration, tmpl *x509.Certificate) (*ca.UpstreamChain, error) {
	tmpl.NotAfter = time.Now().Add(ttl)
	tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.MaxPathLenZero = true, true, true
	tmpl.KeyUsage, tmpl.URIs = x509.KeyUsageCertSign, csr.URIs
	der, err := x509.CreateCertificate(rand.Reader, tmpl, f.root, csr.PublicKey, f.rootKey)
	if err != nil {
		return nil, err
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &ca.UpstreamChain{Chain: []*x509.Certificate{c}, Roots: []*x509.Certificate{f.root}}, nil
}

func (f *fakeIntermediates) state() (int, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls, f.ttl
}

// intermediateFixture serves SignIntermediate for downstreamID through the
// fake signer; client SVIDs and goodToken (as tokenID) authenticate.
func intermediateFixture(t *testing.T, mutate func(*certservice.Config)) (*fixture, *fakeIntermediates) {
	t.Helper()
	signer := newFakeIntermediates(t)
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.Intermediates = signer
		cfg.DownstreamAllow = []spiffeid.ID{downstreamID, tokenID}
		cfg.TrustDomain = td
		cfg.Authenticator = authn.Chain{authn.NewX509SVID(td, localRoots{a}, nil), fakeTokens}
		if mutate != nil {
			mutate(cfg)
		}
	})
	return f, signer
}

func derCSR(t testing.TB, uri string) []byte {
	t.Helper()
	block, _ := pem.Decode([]byte(freshCSR(t, uri)))
	require.NotNil(t, block)
	return block.Bytes
}

func TestSignIntermediateAllowed(t *testing.T) {
	f, signer := intermediateFixture(t, nil)
	c := f.identityClient(t, svid(t, f.authority, downstreamID), "")
	for _, tc := range []struct {
		ask  int64
		want time.Duration
	}{
		{0, certservice.DefaultMaxDownstreamTTL},
		{3600, time.Hour},
		{int64(1000 * time.Hour / time.Second), certservice.DefaultMaxDownstreamTTL},
	} {
		resp, err := c.SignIntermediate(context.Background(), &identityapi.SignIntermediateRequest{Csr: derCSR(t, "spiffe://example.org"), TtlSeconds: tc.ask})
		require.NoError(t, err)
		_, ttl := signer.state()
		assert.Equal(t, tc.want, ttl, "asked for %ds", tc.ask)
		require.Len(t, resp.GetCertChain(), 1)
		require.Len(t, resp.GetRoots(), 1)
		assert.Equal(t, signer.root.Raw, resp.GetRoots()[0])
		leaf, err := x509.ParseCertificate(resp.GetCertChain()[0])
		require.NoError(t, err)
		assert.True(t, leaf.IsCA)
	}
	assert.Equal(t, 3.0, testutil.ToFloat64(f.svc.IntermediatesForTest("OK", authn.MethodX509SVID)))
	assert.Contains(t, f.logs.String(), `"msg":"intermediate issued"`)
	assert.Contains(t, f.logs.String(), downstreamID.String())
	assert.Contains(t, f.logs.String(), `"serial":"2a"`)
}

func TestSignIntermediateRefusals(t *testing.T) {
	other := spiffeid.RequireFromString("spiffe://example.org/region/us")
	for _, tc := range []struct {
		name   string
		mutate func(*certservice.Config)
		caller spiffeid.ID // zero: no client certificate
		token  string
		csr    []byte
		want   codes.Code
		method string
		msg    string
	}{
		{name: "no credentials", want: codes.Unauthenticated, method: "none", msg: "no valid credentials"},
		{name: "not in the allow-list", caller: other, want: codes.PermissionDenied, method: authn.MethodX509SVID,
			msg: "spiffe://example.org/region/us is not in this server's --downstream-allow; add it there"},
		{name: "empty allow-list", caller: downstreamID, mutate: func(c *certservice.Config) { c.DownstreamAllow = nil },
			want: codes.PermissionDenied, method: authn.MethodX509SVID, msg: "add the downstream's SPIFFE ID with --downstream-allow"},
		{name: "token, not an SVID", token: goodToken, want: codes.PermissionDenied, method: "fake-token", msg: "only for a caller authenticated by an X509-SVID"},
		{name: "bad CSR", caller: downstreamID, csr: []byte("not a csr"), want: codes.InvalidArgument, method: authn.MethodX509SVID, msg: "csr is not a valid PKCS#10 request"},
		{name: "truncated CSR", caller: downstreamID, csr: derCSR(t, "spiffe://example.org")[:40], want: codes.InvalidArgument, method: authn.MethodX509SVID, msg: "PKCS#10"},
		{name: "not configured", caller: downstreamID, mutate: func(c *certservice.Config) { c.Intermediates = nil; c.JWT = newFakeJWTSigner(t) },
			want: codes.FailedPrecondition, method: "none", msg: "does not sign intermediates"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, signer := intermediateFixture(t, tc.mutate)
			var cert = svidOrNil(t, f, tc.caller)
			csr := tc.csr
			if csr == nil {
				csr = derCSR(t, "spiffe://example.org")
			}
			_, err := f.identityClient(t, cert, tc.token).SignIntermediate(context.Background(), &identityapi.SignIntermediateRequest{Csr: csr})
			require.Equal(t, tc.want, status.Code(err), "%v", err)
			assert.Contains(t, status.Convert(err).Message(), tc.msg)
			calls, _ := signer.state()
			assert.Zero(t, calls, "the signer must not be reached")
			assert.Equal(t, 1.0, testutil.ToFloat64(f.svc.IntermediatesForTest(tc.want.String(), tc.method)))
			assert.Contains(t, f.logs.String(), `"msg":"intermediate request refused"`)
		})
	}
}

func svidOrNil(t *testing.T, f *fixture, id spiffeid.ID) *tls.Certificate {
	if id.IsZero() {
		return nil
	}
	return svid(t, f.authority, id)
}

func TestSignIntermediateSignerFault(t *testing.T) {
	f, signer := intermediateFixture(t, nil)
	signer.err = errors.New("disk /secret/ca-key.pem unreadable")
	_, err := f.identityClient(t, svid(t, f.authority, downstreamID), "").SignIntermediate(context.Background(),
		&identityapi.SignIntermediateRequest{Csr: derCSR(t, "spiffe://example.org")})
	require.Equal(t, codes.Internal, status.Code(err))
	assert.NotContains(t, status.Convert(err).Message(), "/secret")
	assert.Contains(t, f.logs.String(), "/secret/ca-key.pem")
}

func TestSignIntermediateRateLimited(t *testing.T) {
	f, _ := intermediateFixture(t, func(c *certservice.Config) { c.RateLimit, c.RateBurst = 0.001, 1 })
	c := f.identityClient(t, svid(t, f.authority, downstreamID), "")
	req := &identityapi.SignIntermediateRequest{Csr: derCSR(t, "spiffe://example.org")}
	_, err := c.SignIntermediate(context.Background(), req)
	require.NoError(t, err)
	_, err = c.SignIntermediate(context.Background(), req)
	require.Equal(t, codes.ResourceExhausted, status.Code(err))
}

func TestDownstreamAllowOutsideTrustDomain(t *testing.T) {
	_, err := certservice.New(certservice.Config{Signer: newAuthority(t, td), Authenticator: fakeTokens, TrustDomain: td,
		DownstreamAllow: []spiffeid.ID{spiffeid.RequireFromString("spiffe://other.org/region/eu")}})
	require.ErrorContains(t, err, "downstream spiffe://other.org/region/eu is not in trust domain example.org")
}
