package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/testca"
)

func TestAudienceKey(t *testing.T) {
	assert.Equal(t, audienceKey([]string{"b", "a", "b"}), audienceKey([]string{"a", "b"}))
	assert.NotEqual(t, audienceKey([]string{"a,b"}), audienceKey([]string{"a", "b"}))
}

func TestJWTMinterCache(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	clk := clocktesting.NewFakeClock(now)
	m := newJWTMinter("unused", nil, clk)
	m.store(audienceKey([]string{"x"}), cachedJWT{token: "t1", refreshAt: now.Add(time.Minute), expAt: now.Add(2 * time.Minute)}, now)
	tok, err := m.MintJWTSVID(context.Background(), []string{"x", "x"})
	require.NoError(t, err)
	assert.Equal(t, "t1", tok, "reused in the first half of its lifetime")

	t.Run("bounded", func(t *testing.T) {
		for i := range maxCachedJWTs + 10 {
			m.store(fmt.Sprint(i), cachedJWT{token: "t", refreshAt: now.Add(time.Minute), expAt: now.Add(2 * time.Minute)}, now)
		}
		assert.LessOrEqual(t, len(m.cache), maxCachedJWTs)
	})
	t.Run("expired entries go first", func(t *testing.T) {
		later := now.Add(3 * time.Minute)
		m.store("fresh", cachedJWT{token: "t", refreshAt: later.Add(time.Minute), expAt: later.Add(2 * time.Minute)}, later)
		assert.Len(t, m.cache, 1)
	})
}

func TestParseWatchBundles(t *testing.T) {
	caA, caB := testca.New(t, tdA.Name()), testca.New(t, tdB.Name())
	doc := func(bs ...*spiffebundle.Bundle) []byte {
		b, err := bundledoc.MarshalMap(bs)
		require.NoError(t, err)
		return b
	}
	tests := []struct {
		name string
		doc  []byte
		want string
	}{
		{"local and federated", doc(caA.Bundle(), caB.Bundle()), ""},
		{"no local trust domain", doc(caB.Bundle()), "without the local trust domain"},
		{"not JSON", []byte("{"), "bundle map"},
		{"too large", make([]byte, maxBundleMap+1), "at most"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseWatchBundles(&identityapi.WatchBundlesResponse{BundleMap: tt.doc}, tdA)
			if tt.want == "" {
				require.NoError(t, err)
				assert.Len(t, got, 2)
				return
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
}

func FuzzParseWatchBundles(f *testing.F) {
	caA := testca.New(f, tdA.Name())
	seed, err := bundledoc.MarshalMap([]*spiffebundle.Bundle{caA.Bundle()})
	require.NoError(f, err)
	f.Add(seed)
	f.Add([]byte(`{"trust_domains":{"a.test":{"keys":[]}}}`))
	f.Add([]byte(`{"trust_domains":{"a.test":{"keys":[]},"a.test":{"keys":[]}}}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		bundles, err := parseWatchBundles(&identityapi.WatchBundlesResponse{BundleMap: doc}, tdA)
		if err != nil {
			return
		}
		seen := map[string]bool{}
		for _, b := range bundles {
			require.False(t, seen[b.TrustDomain().Name()], "a trust domain twice")
			seen[b.TrustDomain().Name()] = true
		}
		require.True(t, seen[tdA.Name()])
	})
}
