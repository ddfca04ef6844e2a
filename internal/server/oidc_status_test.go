package server

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/server/audit"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// writeIPCert writes a Web PKI serving certificate for 127.0.0.1 (an IP
// SAN, no SPIFFE ID) and its key, and returns their files and the pool
// that verifies it.
func writeIPCert(t *testing.T) (certFile, keyFile string, roots *x509.CertPool) {
	t.Helper()
	web := testca.New(t, "web.test")
	leaf, key := web.Issue(t, spiffeid.RequireFromString("spiffe://web.test/x"), testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs, c.IPAddresses = nil, []net.IP{net.IPv4(127, 0, 0, 1)}
	}})
	der, err := x509.MarshalPKCS8PrivateKey(key)
	require.NoError(t, err)
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	require.NoError(t, os.WriteFile(certFile, testca.PEM(leaf), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600))
	roots = x509.NewCertPool()
	roots.AddCert(web.Cert)
	return certFile, keyFile, roots
}

// A server with --jwt-issuer on an https_web bundle endpoint shows its
// issuer in /v1/trust with the keys its JWKS serves (use sig), the
// certificate covering its host; the audit of its snapshot finds nothing
// about it.
func TestOIDCIssuerVisibleAndAudited(t *testing.T) {
	bundleAddr := servertest.ReservePort(t)
	issuer := "https://" + bundleAddr + "/oidc"
	certFile, keyFile, roots := writeIPCert(t)
	admin, _ := startServer(t, t.TempDir(), func(o *Config) {
		o.Bundle = BundleConfig{Listen: bundleAddr, Path: "/", Profile: ProfileWeb, ServeOthers: true, TLSCert: certFile, TLSKey: keyFile}
		o.JWT.Issuer = issuer
	})

	doc := servertest.TrustOf(t, admin)
	require.Len(t, doc.OIDCIssuers, 1)
	iss := doc.OIDCIssuers[0]
	assert.Equal(t, issuer, iss.URL)
	assert.Equal(t, "example.org", iss.TrustDomain)
	assert.True(t, iss.Local)
	assert.True(t, iss.ServedHere)
	assert.Equal(t, issuer+bundleserver.DiscoveryPath, iss.DiscoveryURL)
	assert.Equal(t, issuer+bundleserver.JWKSPath, iss.JWKSURL)
	assert.Empty(t, iss.Error)
	require.NotNil(t, iss.Certificate)
	assert.True(t, iss.Certificate.CoversHost, iss.Certificate.Reason)
	assert.Equal(t, []string{"127.0.0.1"}, iss.Certificate.Names)
	require.NotEmpty(t, iss.Keys)
	kids := map[string]bool{}
	for _, a := range doc.JWTAuthorities {
		kids[a.KID] = true
	}
	for _, k := range iss.Keys {
		assert.Equal(t, "sig", k.Use)
		assert.NotEmpty(t, k.Algorithm)
		assert.True(t, kids[k.KID], "key %q is one of the CA's JWT authorities", k.KID)
	}

	// The keys are those a relying party fetches.
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
	resp, err := c.Get(iss.JWKSURL)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var set jose.JSONWebKeySet
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&set))
	require.Len(t, set.Keys, len(iss.Keys))
	for i, k := range set.Keys {
		assert.Equal(t, iss.Keys[i].KID, k.KeyID)
	}

	snap := servertest.GetSnapshot(t, "http://"+admin)
	require.Len(t, snap.OIDCIssuers, 1)
	assert.Equal(t, iss, snap.OIDCIssuers[0])
	for _, f := range audit.Findings(snap) {
		assert.False(t, strings.HasPrefix(f.Code, "oidc_"), "%s: %s", f.Code, f.Message)
	}
}

// With the bundle endpoint off, our issuer is in /v1/trust as served by
// a relay, with nothing to judge here.
func TestOIDCIssuerServedByARelay(t *testing.T) {
	admin, _ := startServer(t, t.TempDir(), func(o *Config) { o.JWT.Issuer = "https://oidc.example.com" })
	doc := servertest.TrustOf(t, admin)
	require.Len(t, doc.OIDCIssuers, 1)
	iss := doc.OIDCIssuers[0]
	assert.Equal(t, "https://oidc.example.com", iss.URL)
	assert.True(t, iss.Local)
	assert.False(t, iss.ServedHere)
	assert.Nil(t, iss.Certificate)
	assert.Empty(t, iss.Keys)
	for _, f := range audit.Findings(servertest.GetSnapshot(t, "http://"+admin)) {
		assert.False(t, strings.HasPrefix(f.Code, "oidc_"), "%s: %s", f.Code, f.Message)
	}
}

// The serving certificate is checked at every read, not only at start:
// a reloaded --bundle-tls-cert that drops the issuer's host shows as not
// covering it; with ACME the --acme-domain names are what counts.
func TestIssuerStatusesCheckTheCertificateNow(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	dataDir := t.TempDir()
	a, err := ca.New(ca.Config{TrustDomain: td, DataDir: dataDir, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	certFile, keyFile, _ := writeIPCert(t)
	const issuer = "https://127.0.0.1/oidc"
	ep, err := setupBundleEndpoint(BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileWeb, TLSCert: certFile, TLSKey: keyFile},
		td, issuer, dataDir, 0, 0, a, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ep.ln.Close() })
	statuses := jwtIssuerStatuses(issuer, td, ep)

	sts := statuses()
	require.Len(t, sts, 1)
	assert.NoError(t, sts[0].CertErr)
	assert.True(t, sts[0].Local)
	require.NotEmpty(t, sts[0].Keys, "the CA's JWT keys, read from the JWKS served")
	assert.Equal(t, "sig", sts[0].Keys[0].Use)

	other, _ := testca.New(t, "web.test").Issue(t, spiffeid.RequireFromString("spiffe://web.test/x"), testca.Options{Mutate: func(c *x509.Certificate) {
		c.URIs, c.IPAddresses = nil, []net.IP{net.IPv4(10, 0, 0, 1)}
	}})
	ep.getCert = func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &tls.Certificate{Leaf: other}, nil }
	sts = statuses()
	assert.ErrorContains(t, sts[0].CertErr, "127.0.0.1")
	assert.Equal(t, []string{"10.0.0.1"}, sts[0].CertNames)
	assert.False(t, sts[0].ACME)

	ep.acmeDomains = []string{"bundle.example.com"}
	sts = statuses()
	assert.True(t, sts[0].ACME)
	assert.Equal(t, []string{"bundle.example.com"}, sts[0].CertNames)
	assert.ErrorContains(t, sts[0].CertErr, "--acme-domain")
}
