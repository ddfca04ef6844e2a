package federation

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testca"
)

func TestCheckFirstFetch(t *testing.T) {
	ca := testca.New(t, "peer.example")
	selfServing := spiffe(t, "peer.example", "https://peer.example/", "spiffe://peer.example/bundle-endpoint")
	withBundle := selfServing
	withBundle.BootstrapBundle = ca.Bundle()
	heldPeer := func(d spiffeid.TrustDomain) bool { return d == td("peer.example") }
	heldOther := func(d spiffeid.TrustDomain) bool { return d == td("other.example") }
	tests := []struct {
		name string
		ep   Endpoint
		held func(spiffeid.TrustDomain) bool
		ok   bool
	}{
		{"https_web needs nothing", web(t, "peer.example", "https://peer.example/"), nil, true},
		{"self-serving with a bootstrap bundle", withBundle, nil, true},
		{"self-serving, bundle held", selfServing, heldPeer, true},
		{"self-serving, nothing given or held", selfServing, nil, false},
		{"self-serving, another trust domain held", selfServing, heldOther, false},
		{"served by another trust domain: its bundle comes from the store", spiffe(t, "peer.example", "https://hub/", "spiffe://hub.example/bundle-server"), nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckFirstFetch(tt.ep, tt.held)
			if tt.ok {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrNoBootstrapBundle)
			for _, fix := range []string{"trustDomainBundleFile", "trustDomainBundle", "ClusterFederatedTrustDomain", "--federate",
				`"peer.example|https://peer.example/|spiffe://peer.example/bundle-endpoint|peer.example.json"`} {
				assert.Contains(t, err.Error(), fix, "the message names how to fix it")
			}
		})
	}
}

// The fourth field reads the bootstrap bundle as trustDomainBundleFile
// does; inputs without one parse as before (issue 21 item 5).
func TestParseEndpointsConfigBundleFile(t *testing.T) {
	ca := testca.New(t, "bar")
	doc := bundleJSON(t, ca.Bundle())
	read := files(map[string]string{
		"/etc/bar.json": doc, "ignored.json": withIgnoredKey(t, doc), "jwt.json": jwtOnlyBundle(t, "bar"),
		"foo.json": bundleJSON(t, testca.New(t, "foo").Bundle()), "big.json": strings.Repeat(" ", bundledoc.DefaultMaxSize+1),
	})

	cfg, err := ParseEndpointsConfig("a|https://a/||bar|https://bar:8443/|spiffe://bar/s|/etc/bar.json", read)
	require.NoError(t, err)
	require.Len(t, cfg.Endpoints, 2)
	assert.Equal(t, web(t, "a", "https://a/"), cfg.Endpoints[0])
	ep := cfg.Endpoints[1]
	assert.Equal(t, "/etc/bar.json", ep.BootstrapBundleFile)
	require.NotNil(t, ep.BootstrapBundle)
	assert.True(t, ep.BootstrapBundle.Equal(ca.Bundle()))
	assert.Equal(t, "bar|https://bar:8443/|spiffe://bar/s", ep.String(), "the file is no part of the name")
	assert.NoError(t, CheckFirstFetch(ep, nil))
	assert.Empty(t, cfg.Warnings)

	cfg, err = ParseEndpointsConfig("bar|https://bar/|spiffe://bar/s|ignored.json", read)
	require.NoError(t, err)
	require.Len(t, cfg.Warnings, 1)
	assert.Contains(t, cfg.Warnings[0], `endpoint 0 ("bar|https://bar/|spiffe://bar/s|ignored.json"): bundle file "ignored.json": keys[1]`)

	refusals := []struct{ in, want string }{
		{"bar|https://bar/|spiffe://bar/s|nope.json", `bootstrap bundle file "nope.json": open nope.json: file does not exist`},
		{"bar|https://bar/|spiffe://bar/s|", `bootstrap bundle file "": is empty`},
		{"bar|https://bar/|spiffe://bar/s|my file.json", `contains ' '; a path in a tuple cannot hold whitespace`},
		{"bar|https://bar/|spiffe://bar/s|a\x01.json", `contains '\x01'`},
		{"bar|https://bar/|spiffe://bar/s|jwt.json", "bootstrap bundle has no X.509 authorities"},
		{"bar|https://bar/|spiffe://bar/s|big.json", "larger than 1048576 bytes"},
		{"bar|https://bar/|spiffe://bar/s|x.json|y", "has 5 field(s), want trust-domain|url, trust-domain|url|endpoint-spiffe-id or trust-domain|url|endpoint-spiffe-id|bundle-file"},
		{"bar|https://bar/|spiffe://bar|x.json", "has no path"},
	}
	for _, r := range refusals {
		t.Run(r.in, func(t *testing.T) {
			cfg, err := ParseEndpointsConfig(r.in, read)
			assert.Nil(t, cfg)
			assert.ErrorContains(t, err, r.want)
		})
	}

	// ParseEndpoints reads no files: a fourth field is refused as before.
	_, err = ParseEndpoints("bar|https://bar/|spiffe://bar/s|/etc/bar.json")
	assert.EqualError(t, err, `federation: endpoint 0 ("bar|https://bar/|spiffe://bar/s|/etc/bar.json"): has 4 field(s), want trust-domain|url or trust-domain|url|endpoint-spiffe-id`)
}

// Holds is what the CRD controller asks: a fetched or restored bundle, or
// a last-known-good entry, counts; the bootstrap bundle alone does not,
// since an edit may take it away.
func TestPollerHolds(t *testing.T) {
	pf := newPollFixture(t)
	d := pf.ep.TrustDomain
	withBootstrap := pf.ep
	withBootstrap.BootstrapBundle = pf.fx.bundle
	p, err := NewPoller(PollerConfig{
		Endpoints: []Endpoint{withBootstrap},
		Fetcher:   FetcherConfig{AllowPrivate: true, WebRoots: pf.pool, Timeout: 5 * time.Second},
		LKG:       NewLKGStore(pf.dataDir), Sink: &memSink{}, Registerer: prometheus.NewRegistry(),
	})
	require.NoError(t, err)
	require.Empty(t, p.LoadLastKnownGood())
	assert.False(t, p.Holds(d), "only the bootstrap bundle")
	assert.False(t, p.Holds(td("other.example")))

	require.NoError(t, p.Refresh(t.Context(), d))
	assert.True(t, p.Holds(d), "fetched")

	// A poller that does not follow d yet finds it in the store.
	fresh, err := NewPoller(PollerConfig{LKG: NewLKGStore(pf.dataDir), Sink: &memSink{}, Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	assert.True(t, fresh.Holds(d), "stored")
	assert.True(t, StoreHolds(NewLKGStore(pf.dataDir), d))
	assert.False(t, StoreHolds(NewLKGStore(t.TempDir()), d))
	assert.False(t, StoreHolds(nil, d))
}
