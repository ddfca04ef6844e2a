package agent

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/trustbridge/trustbridge/internal/caclient"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/sds"
)

// TestTrustOf: the trust that comes with a certificate is exactly ROOTCA
// (the local roots) and ALL (per trust domain), each once, consistent.
func TestTrustOf(t *testing.T) {
	caA, caB, other := testca.New(t, tdA.Name()), testca.New(t, tdB.Name()), testca.New(t, tdA.Name())
	all := allAny(t, tdEntry("a.test", pemCerts(caA.Cert)), tdEntry("b.test", pemCerts(caB.Cert)))
	rootCA := rootCAAny(t, pemCerts(caA.Cert))
	resp := func(res ...*anypb.Any) *discoveryv3.DiscoveryResponse {
		return &discoveryv3.DiscoveryResponse{TypeUrl: resourcev3.SecretType, Resources: res}
	}

	got, err := trustOf(resp(all, rootCA), tdA)
	require.NoError(t, err)
	assert.Equal(t, caclient.Trust{TrustDomain: tdA, Local: []*x509.Certificate{caA.Cert},
		Bundles: map[spiffeid.TrustDomain][]*x509.Certificate{tdA: {caA.Cert}, tdB: {caB.Cert}}}, got)

	// A trust domain the server limits to some peers is left out: a
	// bundle file cannot carry the limit.
	cfg, err := anypb.New(&tlsv3.SPIFFECertValidatorConfig{TrustDomains: []*tlsv3.SPIFFECertValidatorConfig_TrustDomain{
		tdEntry("a.test", pemCerts(caA.Cert)), tdEntry("b.test", pemCerts(caB.Cert))}})
	require.NoError(t, err)
	limited := secretAny(t, &tlsv3.Secret{Name: sds.AllName, Type: &tlsv3.Secret_ValidationContext{
		ValidationContext: &tlsv3.CertificateValidationContext{
			CustomValidatorConfig:     &corev3.TypedExtensionConfig{Name: sds.SPIFFEValidatorName, TypedConfig: cfg},
			MatchTypedSubjectAltNames: []*tlsv3.SubjectAltNameMatcher{uriMatcher("spiffe://a.test/", true), uriMatcher("spiffe://b.test/ns/billing/sa/api", false)},
		},
	}})
	got, err = trustOf(resp(limited, rootCA), tdA)
	require.NoError(t, err)
	assert.Equal(t, caclient.Trust{TrustDomain: tdA, Local: []*x509.Certificate{caA.Cert},
		Bundles:  map[spiffeid.TrustDomain][]*x509.Certificate{tdA: {caA.Cert}},
		Withheld: []spiffeid.TrustDomain{tdB}}, got)

	for name, tt := range map[string]struct {
		resp *discoveryv3.DiscoveryResponse
		err  string
	}{
		"no ROOTCA":    {resp(all), "no ROOTCA"},
		"no ALL":       {resp(rootCA), "no ALL"},
		"ROOTCA twice": {resp(rootCA, all, rootCA), "ROOTCA twice"},
		"another type": {&discoveryv3.DiscoveryResponse{TypeUrl: "x"}, "response type"},
		"disagreement": {resp(all, rootCAAny(t, pemCerts(other.Cert))), "disagree"},
		"too many":     {resp(all, rootCA, all, all, all, all, all, all, all), "resources in one response"},
		"invalid ALL":  {resp(allAny(t, tdEntry("spiffe://a.test", pemCerts(caA.Cert))), rootCA), "resource 0"},
		"empty answer": {resp(), "no ROOTCA"},
		"unasked name": {resp(secretAny(t, &tlsv3.Secret{Name: "default", Type: &tlsv3.Secret_ValidationContext{
			ValidationContext: &tlsv3.CertificateValidationContext{TrustedCa: inlineBytes(pemCerts(caA.Cert))},
		}}), rootCA, all), "resource 0"},
		"local outside": {resp(allAny(t, tdEntry("b.test", pemCerts(caB.Cert))), rootCA), ""},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := trustOf(tt.resp, tdA)
			if tt.err == "" {
				require.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tt.err)
		})
	}
}

// TestRotatorWritesTrustPerTrustDomain: the Rotator's --output-certs hold
// the local roots in root-cert.pem and a federated peer's root (one that
// names no trust domain, as Istio's do) only in bundle.spiffe.json, under
// the peer's trust domain; the agent serves the same split.
func TestRotatorWritesTrustPerTrustDomain(t *testing.T) {
	f := newRotFixture(t)
	peer := testca.New(t, "peer.example", testca.Options{Mutate: func(c *x509.Certificate) { c.URIs = nil }})
	require.NoError(t, f.svc.trust.Set([]*x509bundle.Bundle{
		x509bundle.FromX509Authorities(rotTD, []*x509.Certificate{f.svc.ca.Cert}),
		x509bundle.FromX509Authorities(peer.TrustDomain, []*x509.Certificate{peer.Cert}),
	}))
	out := filepath.Join(t.TempDir(), "out")
	r := f.rotator(t, func(c *RotatorConfig) { c.OutputCertsDir = out })
	require.NoError(t, r.Init(t.Context()))

	roots, err := caclient.ReadPEMCerts(filepath.Join(out, caclient.RootsFile))
	require.NoError(t, err)
	assert.Equal(t, []*x509.Certificate{f.svc.ca.Cert}, roots)
	doc, err := os.ReadFile(filepath.Join(out, caclient.BundleMapFile))
	require.NoError(t, err)
	byTD, err := caclient.ParseBundleMap(doc)
	require.NoError(t, err)
	assert.Equal(t, map[spiffeid.TrustDomain][]*x509.Certificate{rotTD: {f.svc.ca.Cert}, peer.TrustDomain: {peer.Cert}}, byTD)
	assert.Equal(t, map[spiffeid.TrustDomain][]*x509.Certificate{rotTD: {f.svc.ca.Cert}, peer.TrustDomain: {peer.Cert}}, trustMap(r.Trust()))

	// The files it wrote load as a credentials directory, with the same
	// split.
	set, err := readCredentialSet(out)
	require.NoError(t, err)
	assert.Equal(t, []*x509.Certificate{f.svc.ca.Cert}, set.roots[rotTD])
	assert.Equal(t, []*x509.Certificate{peer.Cert}, set.roots[peer.TrustDomain])
}
