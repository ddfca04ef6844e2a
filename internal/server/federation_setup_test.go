package server

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	gofederation "github.com/spiffe/go-spiffe/v2/federation"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// startNamedServer runs a server for td with its bundle endpoint on
// loopback and returns its admin address, banner and data dir.
func startNamedServer(t *testing.T, td string, mutate func(*Config)) (admin, banner, dataDir string) {
	t.Helper()
	dataDir = t.TempDir()
	o := baseServerOptions(td, dataDir)
	o.Bundle = BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE, ServeOthers: true}
	o.Federation.AllowPrivate = true
	if mutate != nil {
		mutate(&o)
	}
	admin, banner, _ = launchServer(t, o)
	return admin, banner, dataDir
}

func TestServerRefusesFederatingWithItself(t *testing.T) {
	o := Config{
		TrustDomain: "example.org", DataDir: t.TempDir(), AdminListen: "127.0.0.1:0", KeyType: "ec-p256",
		CATTL: 8760 * time.Hour, MaxWorkloadTTL: 90 * 24 * time.Hour, RefreshHint: 5 * time.Minute,
		LogFormat: "json", LogLevel: "info",
		Federation: FederationConfig{Federate: "example.org|https://example.org/"},
	}
	var out, logs strings.Builder
	err := runServer(context.Background(), env{in: strings.NewReader(""), out: &out, err: &logs, now: time.Now}, o, nil)
	assert.ErrorContains(t, err, "is for our own trust domain")

	o.Federation = FederationConfig{Federate: "a.org|http://a.org/"}
	err = runServer(context.Background(), env{in: strings.NewReader(""), out: &out, err: &logs, now: time.Now}, o, nil)
	assert.ErrorContains(t, err, "--federate")
}

func TestBundleFilesJoinTheTrustStore(t *testing.T) {
	dir := t.TempDir()
	peer := testca.New(t, "relay.example")
	doc, err := bundledoc.Marshal(peer.Bundle())
	require.NoError(t, err)
	file := filepath.Join(dir, "relay.json")
	require.NoError(t, os.WriteFile(file, doc, 0o600))
	td := spiffeid.RequireTrustDomainFromString("example.org")
	a, err := ca.New(ca.Config{TrustDomain: td, DataDir: t.TempDir(), Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	fed, err := setupFederation(FederationConfig{}, td, federation.NewLKGStore(t.TempDir()), nil, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	ep, err := setupBundleEndpoint(BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE, ServeOthers: true, Files: []string{"relay.example=" + file}},
		td, "", t.TempDir(), 0, 0, a, fed, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	t.Cleanup(func() { _ = ep.ln.Close() })
	b, ok := fed.store.Bundle(peer.TrustDomain)
	require.True(t, ok, "the relayed bundle is a trust source")
	assert.True(t, b.X509Authorities()[0].Equal(peer.Cert))
}

// TestRelayServesTheStore: the bundle endpoint relays federated bundles
// from the trust store, the one source every consumer reads, as their
// endpoints published them: a new sequence on the same keys (no change to
// the trust the store computes) reaches /bundles/{td} too.
func TestRelayServesTheStore(t *testing.T) {
	td := spiffeid.RequireTrustDomainFromString("example.org")
	peer := testca.New(t, "peer.example")
	a, err := ca.New(ca.Config{TrustDomain: td, DataDir: t.TempDir(), Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	fed, err := setupFederation(FederationConfig{}, td, federation.NewLKGStore(t.TempDir()), nil, nil, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	published := func(seq uint64) {
		b := peer.Bundle()
		b.SetSequenceNumber(seq)
		fed.store.Set(federation.SourceName(peer.TrustDomain), b)
	}
	published(5)
	fed.store.Set("file:/elsewhere.json", peer.Bundle()) // another source: not what the endpoint published
	ep, err := setupBundleEndpoint(BundleConfig{Listen: "127.0.0.1:0", Path: "/", Profile: ProfileSPIFFE, ServeOthers: true},
		td, "", t.TempDir(), 0, 0, a, fed, prometheus.NewRegistry(), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	ctx := runEndpoint(t, ep)

	served := func() (uint64, bool) {
		fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
		defer fcancel()
		b, err := gofederation.FetchBundle(fctx, peer.TrustDomain, strings.TrimSuffix(ep.url, "/")+"/bundles/peer.example",
			gofederation.WithSPIFFEAuth(x509bundle.FromX509Authorities(td, a.Bundle().X509Authorities()), ep.id))
		if err != nil {
			return 0, false
		}
		return b.SequenceNumber()
	}
	seq, ok := served()
	require.True(t, ok)
	assert.Equal(t, uint64(5), seq, "the federation source's document, sequence included")

	union := fed.store.Snapshot()
	published(6)
	require.Same(t, union, fed.store.Snapshot(), "the trust the store computes did not change")
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		seq, ok := served()
		assert.True(c, ok)
		assert.Equal(c, uint64(6), seq)
	}, 5*time.Second, 10*time.Millisecond, "the new sequence reaches the relay")

	fed.store.Remove(federation.SourceName(peer.TrustDomain), peer.TrustDomain)
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		_, ok := served()
		assert.False(c, ok, "no longer relayed once the federation source is gone, whatever else holds the trust domain")
	}, 5*time.Second, 10*time.Millisecond)
}
