package federation

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckFirstFetch(tt.ep, &Anchors{Local: td("example.org"), Endpoints: []Endpoint{tt.ep}, Held: tt.held})
			if tt.ok {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrNoBootstrapBundle)
			assert.Equal(t, CheckFirstFetch(tt.ep, nil).Error(), err.Error(), "our trust domain and the set change nothing for a self-serving endpoint")
			for _, fix := range []string{"trustDomainBundleFile", "trustDomainBundle", "ClusterFederatedTrustDomain", "--federate",
				`"peer.example|https://peer.example/|spiffe://peer.example/bundle-endpoint|peer.example.json"`} {
				assert.Contains(t, err.Error(), fix, "the message names how to fix it")
			}
		})
	}
}

// An endpoint served by another trust domain (a hub) is authenticated with
// the trust store's roots of that trust domain, so that trust domain must
// be ours, held, or federated in the same set by an endpoint that brings
// its roots in; the endpoint's own bootstrap bundle does not count, and a
// cycle of endpoints serving each other brings nothing (issue 21 item 5).
func TestCheckFirstFetchServedByAnotherTrustDomain(t *testing.T) {
	local := td("example.org")
	hubCA, aCA, bCA := testca.New(t, "hub.example"), testca.New(t, "a.example"), testca.New(t, "b.example")
	withBundle := func(ep Endpoint, b *testca.CA) Endpoint {
		ep.BootstrapBundle = b.Bundle()
		return ep
	}
	viaHub := spiffe(t, "peer.example", "https://hub.example/peer", "spiffe://hub.example/bundle-server")
	viaLocal := spiffe(t, "peer.example", "https://bundles.example.org/peer", "spiffe://example.org/bundle-server")
	hubSelf := spiffe(t, "hub.example", "https://hub.example/", "spiffe://hub.example/bundle-server")
	hubWeb := web(t, "hub.example", "https://hub.example/")
	// a.example is served by b.example's server and b.example by a.example's.
	aViaB := spiffe(t, "a.example", "https://b.example/a", "spiffe://b.example/bundle-server")
	bViaA := spiffe(t, "b.example", "https://a.example/b", "spiffe://a.example/bundle-server")
	// hub.example is served by a.example's server.
	hubViaA := spiffe(t, "hub.example", "https://a.example/hub", "spiffe://a.example/bundle-server")
	heldHub := func(d spiffeid.TrustDomain) bool { return d == td("hub.example") }
	heldPeer := func(d spiffeid.TrustDomain) bool { return d == td("peer.example") }

	tests := []struct {
		name string
		ep   Endpoint
		set  []Endpoint
		held func(spiffeid.TrustDomain) bool
		ok   bool
		// configured: the refusal names the endpoint federating with the
		// server's trust domain rather than asking for a new one.
		configured bool
	}{
		{"served by our trust domain", viaLocal, []Endpoint{viaLocal}, nil, true, false},
		{"hub federated with its bootstrap bundle", viaHub, []Endpoint{viaHub, withBundle(hubSelf, hubCA)}, nil, true, false},
		{"hub federated with its bootstrap bundle, listed after", viaHub, []Endpoint{withBundle(hubSelf, hubCA), viaHub}, nil, true, false},
		{"hub federated over https_web", viaHub, []Endpoint{viaHub, hubWeb}, nil, true, false},
		{"hub held", viaHub, []Endpoint{viaHub}, heldHub, true, false},
		{"hub federated and held", viaHub, []Endpoint{viaHub, hubSelf}, heldHub, true, false},
		{"hub not federated", viaHub, []Endpoint{viaHub}, nil, false, false},
		{"hub not federated, nothing in the set", viaHub, nil, nil, false, false},
		{"hub not federated, own bootstrap bundle", withBundle(viaHub, testca.New(t, "peer.example")), nil, nil, false, false},
		{"hub not federated, own bundle held", viaHub, []Endpoint{viaHub}, heldPeer, false, false},
		{"hub federated without a bundle", viaHub, []Endpoint{viaHub, hubSelf}, nil, false, true},
		{"cycle without a bundle", aViaB, []Endpoint{aViaB, bViaA}, nil, false, true},
		{"cycle without a bundle, the other way", bViaA, []Endpoint{aViaB, bViaA}, nil, false, true},
		{"cycle, b.example bootstrapped: a.example", aViaB, []Endpoint{aViaB, withBundle(bViaA, bCA)}, nil, true, false},
		{"cycle, b.example bootstrapped: b.example", withBundle(bViaA, bCA), []Endpoint{aViaB, withBundle(bViaA, bCA)}, nil, true, false},
		{"chain ending in a bootstrap bundle", viaHub, []Endpoint{viaHub, hubViaA, withBundle(aViaB, aCA), bViaA}, nil, true, false},
		{"chain ending in a cycle", viaHub, []Endpoint{viaHub, hubViaA, aViaB, bViaA}, nil, false, true},
		{"the first endpoint of a trust domain counts", viaHub, []Endpoint{viaHub, hubSelf, withBundle(hubSelf, hubCA)}, nil, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckFirstFetch(tt.ep, &Anchors{Local: local, Endpoints: tt.set, Held: tt.held})
			if tt.ok {
				assert.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrNoServerBundle)
			assert.NotErrorIs(t, err, ErrNoBootstrapBundle)
			server := tt.ep.EndpointSPIFFEID.TrustDomain().Name()
			assert.Contains(t, err.Error(), fmt.Sprintf("%q is served as %s, an identity of %s", tt.ep.String(), tt.ep.EndpointSPIFFEID, server))
			for _, fix := range []string{"trustDomainBundleFile", "trustDomainBundle", "ClusterFederatedTrustDomain", "--federate", server + ".json"} {
				assert.Contains(t, err.Error(), fix, "the message names how to fix it")
			}
			if tt.configured {
				assert.Contains(t, err.Error(), server+" is federated here by")
			} else {
				assert.Contains(t, err.Error(), server+" is neither this server's trust domain nor federated here")
				assert.Contains(t, err.Error(), fmt.Sprintf("%q", server+"|https://<"+server+" bundle endpoint>|<"+server+" endpoint SPIFFE ID>|"+server+".json"))
			}
			if tt.ep.BootstrapBundle != nil {
				assert.Contains(t, err.Error(), "does not help")
			}
		})
	}

	// Named: the fix for a configured hub is its own entry's fourth field.
	err := CheckFirstFetch(viaHub, &Anchors{Local: local, Endpoints: []Endpoint{viaHub, hubSelf}})
	assert.ErrorContains(t, err, `as the fourth field of its --federate (SPIFFE_BUNDLE_ENDPOINTS) tuple: "hub.example|https://hub.example/|spiffe://hub.example/bundle-server|hub.example.json"`)
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

// One Anchors asks Held once per trust domain, however many endpoints of
// its set depend on it: Held may be an API call.
func TestAnchorsAskHeldOnce(t *testing.T) {
	asked := map[string]int{}
	a := &Anchors{Local: td("example.org"), Held: func(d spiffeid.TrustDomain) bool {
		asked[d.Name()]++
		return d == td("hub.example")
	}}
	for _, ep := range []Endpoint{
		spiffe(t, "a.example", "https://hub.example/a", "spiffe://hub.example/bundle-server"),
		spiffe(t, "b.example", "https://hub.example/b", "spiffe://hub.example/bundle-server"),
		spiffe(t, "c.example", "https://c.example/", "spiffe://c.example/bundle-server"),
		spiffe(t, "d.example", "https://c.example/d", "spiffe://c.example/bundle-server"),
	} {
		err := CheckFirstFetch(ep, a)
		if ep.EndpointSPIFFEID.TrustDomain() == td("hub.example") {
			assert.NoError(t, err)
		} else {
			assert.Error(t, err)
		}
	}
	assert.Equal(t, map[string]int{"hub.example": 1, "c.example": 1}, asked)
}
