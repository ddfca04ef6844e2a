package distribution

import (
	"crypto/x509"
	"slices"
	"testing"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/federation/trust"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

func TestRender(t *testing.T) {
	local := testca.New(t, localTD)
	localNext := testca.New(t, localTD)
	peerB := testca.New(t, "b.example")
	peerC := testca.New(t, "c.example")
	reserved := testca.New(t, "root-cert")
	broken := testca.New(t, "broken.example")
	leaf, _ := broken.Issue(t, spiffeid.RequireFromString("spiffe://broken.example/workload"))
	jwtKey := testca.New(t, "jwt.example")

	withJWT := peerC.Bundle()
	require.NoError(t, withJWT.AddJWTAuthority("kid-1", jwtKey.Key.Public()))
	jwtOnly := spiffebundle.New(spiffeid.RequireTrustDomainFromString("jwt.example"))
	require.NoError(t, jwtOnly.AddJWTAuthority("kid-2", jwtKey.Key.Public()))

	type want struct {
		keys  []string
		roots map[string][]*x509.Certificate // key -> certificates in PEM
		inMap map[string][]*x509.Certificate // trust domain -> X.509 authorities in bundle.spiffe.json
		skips []string                       // "td:reason"
	}
	tests := []struct {
		name    string
		bundles []*spiffebundle.Bundle
		want    want
	}{
		{
			name:    "local only",
			bundles: []*spiffebundle.Bundle{local.Bundle()},
			want: want{
				keys:  []string{KeyBundleMap, KeyRootCert},
				roots: map[string][]*x509.Certificate{KeyRootCert: {local.Cert}},
				inMap: map[string][]*x509.Certificate{localTD: {local.Cert}},
			},
		},
		{
			name:    "local roots during rotation, in bundle order",
			bundles: []*spiffebundle.Bundle{bundleOf(localTD, local.Cert, localNext.Cert)},
			want: want{
				keys:  []string{KeyBundleMap, KeyRootCert},
				roots: map[string][]*x509.Certificate{KeyRootCert: {local.Cert, localNext.Cert}},
				inMap: map[string][]*x509.Certificate{localTD: {local.Cert, localNext.Cert}},
			},
		},
		{
			name:    "federated trust domains kept apart",
			bundles: []*spiffebundle.Bundle{local.Bundle(), peerB.Bundle(), withJWT},
			want: want{
				keys: []string{"b.example.pem", KeyBundleMap, "c.example.pem", KeyRootCert},
				roots: map[string][]*x509.Certificate{
					KeyRootCert:     {local.Cert},
					"b.example.pem": {peerB.Cert},
					"c.example.pem": {peerC.Cert},
				},
				inMap: map[string][]*x509.Certificate{
					localTD: {local.Cert}, "b.example": {peerB.Cert}, "c.example": {peerC.Cert},
				},
			},
		},
		{
			name:    "JWT-only federated trust domain gets an empty PEM",
			bundles: []*spiffebundle.Bundle{local.Bundle(), jwtOnly},
			want: want{
				keys:  []string{KeyBundleMap, "jwt.example.pem", KeyRootCert},
				roots: map[string][]*x509.Certificate{KeyRootCert: {local.Cert}, "jwt.example.pem": nil},
				inMap: map[string][]*x509.Certificate{localTD: {local.Cert}, "jwt.example": {}},
			},
		},
		{
			name:    "trust domain whose key is reserved stays in the bundle map only",
			bundles: []*spiffebundle.Bundle{local.Bundle(), reserved.Bundle()},
			want: want{
				keys:  []string{KeyBundleMap, KeyRootCert},
				roots: map[string][]*x509.Certificate{KeyRootCert: {local.Cert}},
				inMap: map[string][]*x509.Certificate{localTD: {local.Cert}, "root-cert": {reserved.Cert}},
				skips: []string{"root-cert:" + reasonReservedKey},
			},
		},
		{
			name:    "unrenderable federated bundle is left out, the rest goes on",
			bundles: []*spiffebundle.Bundle{local.Bundle(), bundleOf("broken.example", leaf), peerB.Bundle()},
			want: want{
				keys:  []string{"b.example.pem", KeyBundleMap, KeyRootCert},
				roots: map[string][]*x509.Certificate{KeyRootCert: {local.Cert}, "b.example.pem": {peerB.Cert}},
				inMap: map[string][]*x509.Certificate{localTD: {local.Cert}, "b.example": {peerB.Cert}},
				skips: []string{"broken.example:" + reasonUnrenderable},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := trust.NewStore()
			for _, b := range tt.bundles {
				store.Set("test", b)
			}
			data, skips, err := render(store.Snapshot(), local.TrustDomain, maxConfigMapBytes)
			require.NoError(t, err)

			keys := slices.Sorted(func(yield func(string) bool) {
				for k := range data {
					if !yield(k) {
						return
					}
				}
			})
			assert.Equal(t, tt.want.keys, keys)
			for key, certs := range tt.want.roots {
				assert.Equal(t, certs, parsePEM(t, data[key]), "key %s", key)
			}

			bundles, warnings, err := bundledoc.ParseMap([]byte(data[KeyBundleMap]))
			require.NoError(t, err)
			assert.Empty(t, warnings)
			got := map[string][]*x509.Certificate{}
			for _, b := range bundles {
				got[b.TrustDomain().Name()] = b.X509Authorities()
				orig, ok := store.Bundle(b.TrustDomain())
				require.True(t, ok)
				assert.Equal(t, orig.JWTAuthorities(), b.JWTAuthorities(), "JWT authorities of %s", b.TrustDomain())
			}
			assert.Equal(t, tt.want.inMap, got)

			var gotSkips []string
			for _, s := range skips {
				assert.Error(t, s.err)
				gotSkips = append(gotSkips, s.trustDomain+":"+s.reason)
			}
			assert.Equal(t, tt.want.skips, gotSkips)
		})
	}
}

func TestRenderDeterministic(t *testing.T) {
	local := testca.New(t, localTD)
	peers := []*testca.CA{testca.New(t, "b.example"), testca.New(t, "a.example"), testca.New(t, "c.example")}

	build := func(order []int) map[string]string {
		store := trust.NewStore()
		store.Set("ca", local.Bundle())
		for _, i := range order {
			store.Set("federation", peers[i].Bundle())
		}
		data, _, err := render(store.Snapshot(), local.TrustDomain, maxConfigMapBytes)
		require.NoError(t, err)
		return data
	}
	first := build([]int{0, 1, 2})
	assert.Equal(t, first, build([]int{0, 1, 2}), "same snapshot, same bytes")
	assert.Equal(t, first, build([]int{2, 0, 1}), "update order does not matter")
}

func TestRenderErrors(t *testing.T) {
	local := testca.New(t, localTD)
	leaf, _ := local.Issue(t, spiffeid.RequireFromString("spiffe://"+localTD+"/workload"))
	peer := testca.New(t, "b.example")

	tests := []struct {
		name    string
		bundles []*spiffebundle.Bundle
		limit   int
		wantErr string
	}{
		{
			name:    "no local bundle yet",
			bundles: []*spiffebundle.Bundle{peer.Bundle()},
			limit:   maxConfigMapBytes,
			wantErr: "no bundle for the local trust domain",
		},
		{
			name:    "local bundle cannot be rendered",
			bundles: []*spiffebundle.Bundle{bundleOf(localTD, leaf), peer.Bundle()},
			limit:   maxConfigMapBytes,
			wantErr: `render bundle.spiffe.json`,
		},
		{
			name:    "over the ConfigMap size limit",
			bundles: []*spiffebundle.Bundle{local.Bundle(), peer.Bundle()},
			limit:   1000,
			wantErr: "over the ConfigMap limit of 1000",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := trust.NewStore()
			for _, b := range tt.bundles {
				store.Set("test", b)
			}
			data, skips, err := render(store.Snapshot(), local.TrustDomain, tt.limit)
			require.ErrorContains(t, err, tt.wantErr)
			assert.Nil(t, data)
			assert.Nil(t, skips)
		})
	}
}

// TestRenderOverLimitDropsLargestPeer: a federated peer may publish a
// bundle as large as the fetch limit allows, which alone can exceed a
// ConfigMap. That peer is left out (and reported) rather than freezing the
// whole rendering, which would hold back every later local root rotation
// and every removal of a trust domain.
func TestRenderOverLimitDropsLargestPeer(t *testing.T) {
	local := testca.New(t, localTD)
	small := testca.New(t, "b.example")
	var bigCerts []*x509.Certificate
	for range 20 {
		bigCerts = append(bigCerts, testca.New(t, "big.example").Cert)
	}
	big := bundleOf("big.example", bigCerts...)

	without := trust.NewStore()
	without.Set("ca", local.Bundle())
	without.Set("federation", small.Bundle())
	want, _, err := render(without.Snapshot(), local.TrustDomain, maxConfigMapBytes)
	require.NoError(t, err)
	size := 0
	for k, v := range want {
		size += len(k) + len(v)
	}

	store := trust.NewStore()
	store.Set("ca", local.Bundle())
	store.Set("federation", small.Bundle())
	store.Set("federation", big)
	data, skips, err := render(store.Snapshot(), local.TrustDomain, size+100)
	require.NoError(t, err)
	assert.Equal(t, want, data, "the local roots and the peers that fit go out")
	require.Len(t, skips, 1)
	assert.Equal(t, "big.example", skips[0].trustDomain)
	assert.Equal(t, reasonTooLarge, skips[0].reason)
	assert.ErrorContains(t, skips[0].err, "over the ConfigMap limit")

	// Still deterministic, and the local trust domain alone over the limit
	// is still an error.
	again, _, err := render(store.Snapshot(), local.TrustDomain, size+100)
	require.NoError(t, err)
	assert.Equal(t, data, again)
	_, _, err = render(store.Snapshot(), local.TrustDomain, 100)
	assert.ErrorContains(t, err, "over the ConfigMap limit of 100")
}
