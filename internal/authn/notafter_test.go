package authn

import (
	"context"
	"crypto/x509"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// Every authenticator says when the credential it verified stops proving
// the identity (Identity.NotAfter), so that a service holding a caller
// (a bundle stream) ends it then without parsing the credential again.

func TestX509SVIDNotAfter(t *testing.T) {
	local := testca.New(t, "example.org")
	leaf, _ := local.Issue(t, workloadID)
	clk := clocktesting.NewFakePassiveClock(leaf.NotBefore.Add(time.Minute))
	a := NewX509SVID(localTD, local.Bundle().X509Bundle(), clk)
	r := Request{PeerCertificates: []*x509.Certificate{leaf}, Peer: "127.0.0.1:1"}
	for _, pass := range []string{"verified", "cached"} {
		id, err := a.Authenticate(context.Background(), r)
		require.NoError(t, err, pass)
		assert.Equal(t, leaf.NotAfter, id.NotAfter, pass)
	}
}

func TestTokenReviewNotAfter(t *testing.T) {
	const user = "system:serviceaccount:default:web"
	exp := epoch.Add(time.Hour)

	t.Run("reviewed, then cached", func(t *testing.T) {
		f := newReviewFixture(t, nil)
		tok := saToken(t, "web", exp)
		f.api.set(tok, accept(user, "example.org"))
		for _, pass := range []string{"reviewed", "cached"} {
			id, err := f.auth(tok)
			require.NoError(t, err, pass)
			assert.True(t, exp.Equal(id.NotAfter), "%s: NotAfter %s, want the token's exp %s", pass, id.NotAfter, exp)
		}
		require.EqualValues(t, 1, f.api.calls.Load(), "the second answer came from the cache")
	})

	t.Run("callers joining one review", func(t *testing.T) {
		f := newReviewFixture(t, nil)
		tok := saToken(t, "web", exp)
		release := make(chan struct{})
		f.api.set(tok, func(spec authenticationv1.TokenReviewSpec) (authenticationv1.TokenReviewStatus, error) {
			<-release
			return accept(user, "example.org")(spec)
		})
		const n = 4
		var wg sync.WaitGroup
		got := make([]Identity, n)
		for i := range n {
			wg.Go(func() {
				id, err := f.auth(tok)
				assert.NoError(t, err)
				got[i] = id
			})
		}
		require.Eventually(t, func() bool {
			f.a.mu.Lock()
			defer f.a.mu.Unlock()
			for _, c := range f.a.inflight {
				return c.waiters == n-1
			}
			return false
		}, 5*time.Second, time.Millisecond)
		close(release)
		wg.Wait()
		require.EqualValues(t, 1, f.api.calls.Load())
		for i, id := range got {
			assert.True(t, exp.Equal(id.NotAfter), "caller %d: NotAfter %s", i, id.NotAfter)
		}
	})

	t.Run("fractional exp as the local check read it", func(t *testing.T) {
		f := newReviewFixture(t, nil)
		tok := makeJWT(t, map[string]any{"iss": testIssuer, "sub": user, "aud": []string{"example.org"}, "exp": float64(exp.Unix()) + 0.5})
		f.api.set(tok, accept(user, "example.org"))
		id, err := f.auth(tok)
		require.NoError(t, err)
		assert.True(t, exp.Add(500*time.Millisecond).Equal(id.NotAfter), "NotAfter %s", id.NotAfter)
	})
}

func TestBootstrapTokensNotAfter(t *testing.T) {
	expires := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	path := filepath.Join(t.TempDir(), "tokens.csv")
	writeTokens(t, path, tokLaptop+",spiffe://example.org/laptop/alice,expires=2026-12-01T11:00:00+01:00,reusable\n"+
		tokVM+",spiffe://example.org/vm/build,reusable\n", 0o600)
	b, err := NewBootstrapTokens(BootstrapTokensConfig{Path: path, TrustDomain: localTD, Clock: clocktesting.NewFakeClock(expires.Add(-time.Hour))})
	require.NoError(t, err)
	for _, tt := range []struct {
		name, token string
		want        time.Time
	}{
		{name: "expires= set", token: tokLaptop, want: expires},
		{name: "no expires=: unknown", token: tokVM},
	} {
		t.Run(tt.name, func(t *testing.T) {
			id, err := b.Authenticate(context.Background(), Request{BearerToken: tt.token})
			require.NoError(t, err)
			assert.True(t, tt.want.Equal(id.NotAfter), "NotAfter %s, want %s", id.NotAfter, tt.want)
		})
	}
}

// The wrappers in front of the authenticators hand NotAfter on.
func TestWrappersKeepNotAfter(t *testing.T) {
	notAfter := epoch.Add(time.Hour)
	g := Grant{Method: GrantMethodLegacy, GrantedAt: epoch}
	inner := AuthenticatorFunc(func(context.Context, Request) (Identity, error) {
		return Identity{ID: workloadID, Method: MethodX509SVID, Grant: &g, NotAfter: notAfter}, nil
	})
	policy := &GrantPolicy{MaxLifetime: 24 * time.Hour, Clock: clocktesting.NewFakePassiveClock(epoch)}
	for name, a := range map[string]Authenticator{
		"Chain":        Chain{inner},
		"ReusableOnly": ReusableOnly(inner),
		"RequireGrant": RequireGrant(inner, policy),
	} {
		t.Run(name, func(t *testing.T) {
			id, err := a.Authenticate(context.Background(), Request{})
			require.NoError(t, err)
			assert.Equal(t, notAfter, id.NotAfter)
		})
	}
}
