package ca

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// authorityUpstream makes an Authority the upstream of another, as the
// nested trustbridge client does over gRPC.
type authorityUpstream struct{ a *Authority }

func (u authorityUpstream) String() string { return "trustbridge upstream (in process)" }

func (u authorityUpstream) SignIntermediate(_ context.Context, csrDER []byte, ttl time.Duration) (*UpstreamChain, error) {
	csr, err := ParseCSR(csrDER)
	if err != nil {
		return nil, err
	}
	return u.a.SignIntermediate(csr, ttl)
}

func intermediateCSR(t testing.TB, key crypto.Signer, tmpl *x509.CertificateRequest) *x509.CertificateRequest {
	t.Helper()
	if tmpl == nil {
		tmpl = &x509.CertificateRequest{URIs: []*url.URL{tdExample.ID().URL()}}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	require.NoError(t, err)
	csr, err := ParseCSR(der)
	require.NoError(t, err)
	return csr
}

func TestSignIntermediateNestsTwoLevels(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	tcfg := testConfig(t, clk)
	tcfg.SignsIntermediates = true
	top, err := New(tcfg)
	require.NoError(t, err)

	cfg := testConfig(t, clk)
	cfg.Upstream = authorityUpstream{top}
	mid, err := New(cfg)
	require.NoError(t, err)
	require.NoError(t, mid.Ready())
	assert.Equal(t, top.Bundle().X509Authorities(), mid.Bundle().X509Authorities(), "the nested CA publishes the top's roots")
	issued := leafVerifies(t, mid)
	require.Len(t, issued.Chain, 3, "leaf, the nested intermediate, the top root")

	// A third level: the nested CA signs with path length 0 and can hand
	// out no CA certificate that verifies.
	cfg3 := testConfig(t, clk)
	cfg3.Upstream = authorityUpstream{mid}
	cfg3.Registerer = prometheus.NewRegistry()
	third, err := New(cfg3)
	require.NoError(t, err)
	require.ErrorContains(t, third.Ready(), "cannot have an intermediate 1 level(s) below it")
	inter := mid.Roots()[0].Cert
	assert.True(t, inter.MaxPathLenZero)
	assert.Equal(t, []string{"example.org"}, inter.PermittedURIDomains)
}

func TestSignIntermediateRefusals(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk)
	cfg.SignsIntermediates = true
	a, err := New(cfg)
	require.NoError(t, err)
	key := testca.NewKey(t, testca.ECP256)
	for name, tc := range map[string]struct {
		tmpl *x509.CertificateRequest
		ttl  time.Duration
		want error
	}{
		"other trust domain": {tmpl: &x509.CertificateRequest{URIs: []*url.URL{{Scheme: "spiffe", Host: "other.org"}}}, want: ErrIdentityNotAllowed},
		"workload id":        {tmpl: &x509.CertificateRequest{URIs: []*url.URL{{Scheme: "spiffe", Host: "example.org", Path: "/w"}}}, want: ErrIdentityNotAllowed},
		"dns":                {tmpl: &x509.CertificateRequest{DNSNames: []string{"ca.example.org"}}, want: ErrInvalidCSR},
		"ip":                 {tmpl: &x509.CertificateRequest{IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}, want: ErrInvalidCSR},
		"email":              {tmpl: &x509.CertificateRequest{EmailAddresses: []string{"a@example.org"}}, want: ErrInvalidCSR},
		"negative ttl":       {ttl: -time.Second, want: ErrInvalidTTL},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := a.SignIntermediate(intermediateCSR(t, key, tc.tmpl), tc.ttl)
			require.ErrorIs(t, err, tc.want)
		})
	}
	_, err = a.SignIntermediate(nil, 0)
	require.ErrorIs(t, err, ErrInvalidCSR)

	// A root made without room for intermediates refuses clearly.
	plain, err := New(testConfig(t, clk))
	require.NoError(t, err)
	_, err = plain.SignIntermediate(intermediateCSR(t, key, nil), 0)
	require.ErrorIs(t, err, ErrInvalidSigningMaterial)
	require.ErrorContains(t, err, "path length 0")
}

func TestSignIntermediateClampsLifetime(t *testing.T) {
	clk := clocktesting.NewFakeClock(t0)
	cfg := testConfig(t, clk) // max workload TTL 2h
	cfg.SignsIntermediates = true
	a, err := New(cfg)
	require.NoError(t, err)
	key := testca.NewKey(t, testca.ECP256)
	got, err := a.SignIntermediate(intermediateCSR(t, key, nil), 100*time.Hour)
	require.NoError(t, err)
	assert.Equal(t, t0.Add(2*time.Hour), got.Chain[0].NotAfter, "no longer than a retired root of ours stays published")
	require.NoError(t, CheckUpstreamChain(t0, tdExample, key.Public(), "test", got))

	clk.Step(23*time.Hour + 30*time.Minute) // the root expires in 30m
	got, err = a.SignIntermediate(intermediateCSR(t, key, nil), time.Hour)
	require.NoError(t, err)
	assert.False(t, got.Chain[0].NotAfter.After(a.Roots()[0].Cert.NotAfter), "never past our own chain")
}
