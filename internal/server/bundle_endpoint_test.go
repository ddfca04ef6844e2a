package server

import (
	"context"
	"crypto/x509"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/loop"
	"github.com/trustbridge/trustbridge/internal/server/servertest"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// caRoots reads the published roots from the data directory.
func caRoots(t *testing.T, dataDir string) []*x509.Certificate {
	t.Helper()
	_, roots, err := ca.NewStore(dataDir).Load("example.org")
	require.NoError(t, err)
	var certs []*x509.Certificate
	for _, r := range roots {
		certs = append(certs, r.Cert)
	}
	return certs
}

func TestServerBundleEndpointSPIFFEProfile(t *testing.T) {
	dataDir := t.TempDir()
	_, out := startServer(t, dataDir, func(o *Config) {
		o.Bundle = BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE, ServeOthers: true}
	})
	url := servertest.EndpointURL(t, out.String())
	assert.Equal(t, "example.org|"+url+"|spiffe://example.org/trustbridge/bundle-endpoint|example.org.json",
		servertest.LogAttr(t, out.String(), servertest.BundleEndpointStarted, "tuple"))

	td := spiffeid.RequireTrustDomainFromString("example.org")
	roots := x509bundle.FromX509Authorities(td, caRoots(t, dataDir))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	got, err := federation.FetchBundle(ctx, td, url,
		federation.WithSPIFFEAuth(roots, spiffeid.RequireFromString("spiffe://example.org/trustbridge/bundle-endpoint")))
	require.NoError(t, err)
	assert.Len(t, got.X509Authorities(), 1)
	assert.True(t, got.X509Authorities()[0].Equal(caRoots(t, dataDir)[0]), "the CA's root")
	seq, ok := got.SequenceNumber()
	assert.True(t, ok)
	j, _, err := ca.NewStore(dataDir).Load("example.org")
	require.NoError(t, err)
	assert.Equal(t, j.Sequence, seq, "the sequence in the CA state")
	hint, _ := got.RefreshHint()
	assert.Equal(t, 5*time.Minute, hint)

	// The wrong endpoint ID is refused: the server proves exactly its own.
	_, err = federation.FetchBundle(ctx, td, url,
		federation.WithSPIFFEAuth(roots, spiffeid.RequireFromString("spiffe://example.org/someone-else")))
	assert.Error(t, err)
}

func TestServerBundleEndpointRefusesBadFlags(t *testing.T) {
	tests := []struct {
		name string
		b    BundleConfig
		want string
	}{
		{"web without certificate", BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileWeb}, "needs --bundle-tls-cert and --bundle-tls-key, or --acme-domain"},
		{"certificate files with https_spiffe", BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE, TLSCert: "x"}, "need --bundle-profile https_web"},
		{"endpoint ID of another trust domain", BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE, EndpointID: "spiffe://other.org/x"}, "our CA signs only example.org identities"},
		{"unknown profile", BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: "https_magic"}, `--bundle-profile "https_magic"`},
		{"ACME without accepting the terms", BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileWeb, ACMEDomains: []string{"bundle.example.com"}}, "tos"},
		{"bad bundle file", BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE, Files: []string{"a.org=/nonexistent.json"}, ServeOthers: true}, "--bundle-file"},
		{"static mode with https_spiffe", BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE, Files: []string{"/x.json"}}, "needs --bundle-profile https_web"},
		{"relay without serving others", BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE, Files: []string{"a.org=/x.json"}}, "--serve-federated=false serves none"},
		{"ACME flags without a domain", BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileWeb, acmeTOS: true}, "need --acme-domain"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := Config{
				TrustDomain: "example.org", DataDir: t.TempDir(), AdminListen: "127.0.0.1:0", KeyType: "ec-p256",
				CATTL: 8760 * time.Hour, MaxWorkloadTTL: 90 * 24 * time.Hour, RefreshHint: 5 * time.Minute,
				LogFormat: "json", LogLevel: "info", Bundle: tt.b,
			}
			var out, logs strings.Builder
			err := runServer(context.Background(), env{in: strings.NewReader(""), out: &out, err: &logs, now: time.Now}, o, nil)
			require.Error(t, err)
			assert.Contains(t, strings.ToLower(err.Error()), strings.ToLower(tt.want))
		})
	}
}

// TestBundleEndpointFollowsRotation wires the CA and the endpoint as the
// server does: a rotation is visible to go-spiffe at the next fetch.
func TestBundleEndpointFollowsRotation(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	dataDir := t.TempDir()
	a, err := ca.New(ca.Config{TrustDomain: td, DataDir: dataDir, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	ep, err := setupBundleEndpoint(BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE, ServeOthers: true},
		td, "", dataDir, 0, 0, a, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	ctx := runEndpoint(t, ep)

	fetch := func() (*spiffebundle.Bundle, error) {
		fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
		defer fcancel()
		return federation.FetchBundle(fctx, td, ep.url,
			federation.WithSPIFFEAuth(x509bundle.FromX509Authorities(td, a.Bundle().X509Authorities()), ep.id))
	}
	first, err := fetch()
	require.NoError(t, err)
	assert.True(t, a.Bundle().Equal(first), "exactly the CA's bundle")

	require.NoError(t, prepareRoot(a))
	require.Eventually(t, func() bool {
		b, err := fetch()
		return err == nil && b.Equal(a.Bundle())
	}, 5*time.Second, 10*time.Millisecond, "the rotation reaches the endpoint")
	b, err := fetch()
	require.NoError(t, err)
	assert.Len(t, b.X509Authorities(), 2, "the prepared root is published before it signs")
}

func TestReadyzReportsABadBundleFileChange(t *testing.T) {
	dir := t.TempDir()
	peer := testca.New(t, "peer.example")
	b := peer.Bundle()
	b.SetSequenceNumber(3)
	doc, err := bundledoc.Marshal(b)
	require.NoError(t, err)
	file := filepath.Join(dir, "peer.json")
	require.NoError(t, os.WriteFile(file, doc, 0o600))
	a, err := ca.New(ca.Config{TrustDomain: spiffeid.RequireTrustDomainFromString("example.org"), DataDir: t.TempDir(), Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	ep, err := setupBundleEndpoint(BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE, ServeOthers: true, Files: []string{"peer.example=" + file}},
		a.TrustDomain(), "", t.TempDir(), 0, 0, a, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ep.ln.Close() })
	admin := httptest.NewServer(adminHandler(a, prometheus.NewRegistry(), nil, nil, ep, nil, nil))
	t.Cleanup(admin.Close)
	code, _ := servertest.Get(t, admin.URL+"/readyz")
	assert.Equal(t, http.StatusOK, code)

	// A broken change, as the file's poll loop would find it.
	require.NoError(t, os.WriteFile(file, []byte("{broken"), 0o600))
	require.Error(t, ep.endpoint.Files()[0].Check())
	code, body := servertest.Get(t, admin.URL+"/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, body, "serving the last good bundle")
}

// runEndpoint runs ep's runners until the test ends, and returns the
// context they run in.
func runEndpoint(t *testing.T, ep *bundleEndpoint) context.Context {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- loop.RunAll(ctx, ep.runners...) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return ctx
}

// prepareRoot publishes a successor root now, as `ca authority prepare`
// does (a no-op while one waits).
func prepareRoot(a *ca.Authority) error {
	_, err := a.ChangeAuthority(ca.AuthorityChange{Action: "prepare"})
	return err
}
