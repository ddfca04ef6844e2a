package crd

import (
	"fmt"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// judgeResource is a decoded resource as judge sees it, created age ago.
func judgeResource(name string, generation int64, age time.Duration, spec Spec) resource {
	u := &unstructured.Unstructured{}
	u.SetName(name)
	u.SetGeneration(generation)
	u.SetCreationTimestamp(metav1.NewTime(time.Unix(1_800_000_000, 0).Add(-age)))
	return resource{obj: u, cr: ClusterFederatedTrustDomain{Spec: spec}}
}

func webSpec(td string) Spec {
	return Spec{TrustDomain: td, BundleEndpointURL: "https://" + td + "/bundle", BundleEndpointProfile: Profile{Type: "https_web"}}
}

// TestJudge decides without an API server what sync applies: a valid spec,
// the last valid spec of a resource edited into an invalid one, conflicts
// with a flag-configured trust domain and with an older resource, the
// server's own trust domain, and a resource whose spec does not decode.
func TestJudge(t *testing.T) {
	local := spiffeid.RequireTrustDomainFromString("example.org")
	reserved := map[spiffeid.TrustDomain]string{spiffeid.RequireTrustDomainFromString("flag.test"): "--federation"}
	broken := judgeResource("broken", 1, 9*time.Hour, Spec{})
	broken.err = assert.AnError

	edited := webSpec("edited.test")
	edited.BundleEndpointURL = "http://edited.test/" // not https: invalid
	prev := map[string]validSpec{
		"edited": {ep: mustEndpoint(t, webSpec("edited.test")), generation: 3},
		"gone":   {ep: mustEndpoint(t, webSpec("gone.test")), generation: 1},
	}
	rs := []resource{
		broken,
		judgeResource("older", 1, 8*time.Hour, webSpec("a.test")),
		judgeResource("newer", 1, 7*time.Hour, webSpec("a.test")),
		judgeResource("edited", 4, 6*time.Hour, edited),
		judgeResource("flagged", 1, 5*time.Hour, webSpec("flag.test")),
		judgeResource("self", 1, 4*time.Hour, webSpec("example.org")),
	}
	j := judge(rs, prev, local, reserved, nil, nil)
	require.Len(t, j.verdicts, len(rs))

	states := map[string]string{}
	for i, r := range rs {
		states[r.obj.GetName()] = j.verdicts[i].state()
	}
	assert.Equal(t, map[string]string{
		"broken":  "invalid",
		"older":   "applied",
		"newer":   "conflict",
		"edited":  "invalid_last_valid_applied",
		"flagged": "conflict",
		"self":    "invalid",
	}, states)
	assert.Contains(t, j.verdicts[0].msg, "spec does not decode")
	assert.Contains(t, j.verdicts[2].conflict, "ClusterFederatedTrustDomain older, which is older")
	assert.Equal(t, int64(3), j.verdicts[3].generation, "the last valid generation stays applied")
	assert.Contains(t, j.verdicts[4].conflict, "already configured by --federation")
	assert.Contains(t, j.verdicts[5].msg, "this server's own trust domain")

	var tds []string
	for _, ep := range j.endpoints {
		tds = append(tds, ep.TrustDomain.Name())
	}
	assert.Equal(t, []string{"a.test", "edited.test"}, tds)
	assert.Equal(t, map[spiffeid.TrustDomain]string{
		spiffeid.RequireTrustDomainFromString("a.test"):      "crd:older",
		spiffeid.RequireTrustDomainFromString("edited.test"): "crd:edited",
	}, j.origins)
	assert.NotContains(t, j.valid, "gone", "a deleted resource's endpoint goes")
	assert.NotContains(t, j.valid, "broken")
	assert.Contains(t, j.valid, "edited")
	assert.Len(t, prev, 2, "judge leaves the previous valid specs alone")
}

func mustEndpoint(t *testing.T, spec Spec) federation.Endpoint {
	t.Helper()
	ep, _, err := Endpoint(spec)
	require.NoError(t, err)
	return ep
}

// A self-serving https_spiffe resource without trustDomainBundle is
// refused as InvalidSpec with federation.CheckFirstFetch's message, the one
// every other path gives, unless a bundle of its trust domain is held; an
// edit that drops the bundle of an endpoint already held stays applied
// (issue 21 item 5).
func TestJudgeRefusesUnanchoredPeer(t *testing.T) {
	local := spiffeid.RequireTrustDomainFromString("example.org")
	peer := spiffeid.RequireTrustDomainFromString("peer.test")
	spec := Spec{TrustDomain: "peer.test", BundleEndpointURL: "https://peer.test/",
		BundleEndpointProfile: Profile{Type: "https_spiffe", EndpointSPIFFEID: "spiffe://peer.test/bundle-endpoint"}}
	want := federation.CheckFirstFetch(mustEndpoint(t, spec), nil)
	require.ErrorIs(t, want, federation.ErrNoBootstrapBundle)

	withBundle := spec
	doc, err := bundledoc.Marshal(testca.New(t, "peer.test").Bundle())
	require.NoError(t, err)
	withBundle.TrustDomainBundle = string(doc)
	prev := map[string]validSpec{"peer": {ep: mustEndpoint(t, withBundle), generation: 1}}
	held := func(d spiffeid.TrustDomain) bool { return d == peer }

	tests := []struct {
		name  string
		prev  map[string]validSpec
		held  func(spiffeid.TrustDomain) bool
		state string
	}{
		{"new, nothing held", nil, nil, "invalid"},
		{"new, held in the store", nil, held, "applied"},
		{"edited to drop the bundle, never fetched", prev, nil, "invalid_last_valid_applied"},
		{"edited to drop the bundle, held", prev, held, "applied"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := judge([]resource{judgeResource("peer", 2, time.Hour, spec)}, tt.prev, local, nil, nil, tt.held)
			v := j.verdicts[0]
			assert.Equal(t, tt.state, v.state())
			if tt.state != "applied" {
				assert.Equal(t, ReasonInvalidSpec, v.reason)
				assert.Equal(t, want.Error(), v.msg, "the same message as every other path")
			}
		})
	}
}

func spiffeSpec(td, endpointID string) Spec {
	return Spec{TrustDomain: td, BundleEndpointURL: "https://" + td + "/bundle",
		BundleEndpointProfile: Profile{Type: "https_spiffe", EndpointSPIFFEID: endpointID}}
}

func withBundleSpec(t *testing.T, spec Spec) Spec {
	t.Helper()
	doc, err := bundledoc.Marshal(testca.New(t, spec.TrustDomain).Bundle())
	require.NoError(t, err)
	spec.TrustDomainBundle = string(doc)
	return spec
}

// A resource served by another trust domain (a hub) is valid only when
// that trust domain's roots will be in the trust store: ours, held, or
// brought in by a flag, a file or another resource for it, younger or
// older; a cycle of resources serving each other brings none. The
// refusal is federation.CheckFirstFetch's message, the one every other
// path gives (issue 21 item 5).
func TestJudgeServedByAnotherTrustDomain(t *testing.T) {
	local := spiffeid.RequireTrustDomainFromString("example.org")
	hub := spiffeid.RequireTrustDomainFromString("hub.test")
	viaHub := spiffeSpec("peer.test", "spiffe://hub.test/bundle-server")
	viaLocal := spiffeSpec("peer.test", "spiffe://example.org/bundle-server")
	hubSelf := spiffeSpec("hub.test", "spiffe://hub.test/bundle-server")
	aViaB := spiffeSpec("a.test", "spiffe://b.test/bundle-server")
	bViaA := spiffeSpec("b.test", "spiffe://a.test/bundle-server")
	staticHub := mustEndpoint(t, withBundleSpec(t, hubSelf))
	staticHub.BootstrapBundleFile = "hub.json"
	unconfigured := federation.CheckFirstFetch(mustEndpoint(t, viaHub), nil)
	require.ErrorIs(t, unconfigured, federation.ErrNoServerBundle)

	tests := []struct {
		name   string
		specs  []Spec // oldest first; the first is judged
		static []federation.Endpoint
		held   func(spiffeid.TrustDomain) bool
		states []string
	}{
		{"served by our trust domain", []Spec{viaLocal}, nil, nil, []string{"applied"}},
		{"hub configured by a flag with its bundle", []Spec{viaHub}, []federation.Endpoint{staticHub}, nil, []string{"applied"}},
		{"hub configured by a younger resource with its bundle", []Spec{viaHub, withBundleSpec(t, hubSelf)}, nil, nil, []string{"applied", "applied"}},
		{"hub held", []Spec{viaHub}, nil, func(d spiffeid.TrustDomain) bool { return d == hub }, []string{"applied"}},
		{"hub not configured", []Spec{viaHub}, nil, nil, []string{"invalid"}},
		{"hub configured without its bundle", []Spec{viaHub, hubSelf}, nil, nil, []string{"invalid", "invalid"}},
		{"cycle without a bundle", []Spec{aViaB, bViaA}, nil, nil, []string{"invalid", "invalid"}},
		{"cycle, b.test with its bundle", []Spec{aViaB, withBundleSpec(t, bViaA)}, nil, nil, []string{"applied", "applied"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rs []resource
			for i, spec := range tt.specs {
				rs = append(rs, judgeResource(fmt.Sprintf("r%d", i), 1, time.Duration(len(tt.specs)-i)*time.Hour, spec))
			}
			j := judge(rs, nil, local, nil, tt.static, tt.held)
			var states []string
			for _, v := range j.verdicts {
				states = append(states, v.state())
			}
			assert.Equal(t, tt.states, states)
			if tt.name == "hub not configured" {
				assert.Equal(t, ReasonInvalidSpec, j.verdicts[0].reason)
				assert.Equal(t, unconfigured.Error(), j.verdicts[0].msg, "the same message as every other path")
			}
			for _, v := range j.verdicts {
				if v.state() == "invalid" {
					assert.Contains(t, v.msg, "trustDomainBundle")
				}
			}
		})
	}
}
