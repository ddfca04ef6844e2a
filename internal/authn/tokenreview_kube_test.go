package authn

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/testkit/kubetest"
)

// TestMain checks for leaked goroutines once kubetest.Main has run the
// tests and stopped the shared API server, whose connections would
// otherwise still be open.
func TestMain(m *testing.M) { goleak.VerifyTestMain(kubeTestMain{m}) }

// kubeTestMain is m run through kubetest.Main, for goleak.VerifyTestMain.
type kubeTestMain struct{ m *testing.M }

func (k kubeTestMain) Run() int { return kubetest.Main(k.m) }

// TestTokenReviewRealAPIServer checks TokenReview against a real
// kube-apiserver: tokens minted by its TokenRequest API, for the right and
// wrong audiences, for deleted service accounts, tampered and garbage.
func TestTokenReviewRealAPIServer(t *testing.T) {
	env := kubetest.Shared(t)
	ns := env.Namespace(t)
	const aud = "example.org"

	right := env.ServiceAccountToken(t, ns, "web", []string{aud}, time.Hour)
	several := env.ServiceAccountToken(t, ns, "web", []string{"istio-ca", aud}, time.Hour)
	wrong := env.ServiceAccountToken(t, ns, "web", []string{"istio-ca"}, time.Hour)
	deleted := env.ServiceAccountToken(t, ns, "gone", []string{aud}, time.Hour)
	ctx := context.Background()
	require.NoError(t, env.Client.CoreV1().ServiceAccounts(ns).Delete(ctx, "gone", metav1.DeleteOptions{}))

	parts := strings.Split(right, ".")
	require.Len(t, parts, 3)
	// Another service account's name in a token signed for "web".
	otherClaims := strings.Replace(decodeB64(t, parts[1]), "serviceaccount:"+ns+":web", "serviceaccount:"+ns+":admin", 1)
	tamperedPayload := parts[0] + "." + encodeB64(otherClaims) + "." + parts[2]
	tamperedSig := parts[0] + "." + parts[1] + "." + flipMiddle(parts[2])
	garbageJWT := makeJWT(t, map[string]any{"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:" + ns + ":web", "aud": []string{aud}, "exp": time.Now().Add(time.Hour).Unix()})

	webID := spiffeid.RequireFromString("spiffe://example.org/ns/" + ns + "/sa/web")
	tests := []struct {
		name    string
		token   string
		want    spiffeid.ID
		wantErr error
	}{
		{name: "right audience", token: right, want: webID},
		{name: "several audiences including ours", token: several, want: webID},
		{name: "wrong audience", token: wrong, wantErr: ErrInvalidCredentials},
		{name: "deleted service account", token: deleted, wantErr: ErrInvalidCredentials},
		{name: "tampered payload", token: tamperedPayload, wantErr: ErrInvalidCredentials},
		{name: "tampered signature", token: tamperedSig, wantErr: ErrInvalidCredentials},
		{name: "garbage JWT", token: garbageJWT, wantErr: ErrInvalidCredentials},
		{name: "garbage, not a JWT", token: "not-a-jwt-0123456789abcdef", wantErr: ErrNoCredentials},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := NewTokenReview(TokenReviewConfig{Client: env.Client, TrustDomain: localTD})
			require.NoError(t, err)
			id, err := a.Authenticate(ctx, Request{BearerToken: tt.token})
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				assert.NotContains(t, err.Error(), tt.token)
				t.Logf("refused: %v", err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, Identity{ID: tt.want, Method: MethodKubernetesJWT}, idOnly(id))
		})
	}

	t.Run("audience other than the trust domain", func(t *testing.T) {
		a, err := NewTokenReview(TokenReviewConfig{Client: env.Client, TrustDomain: localTD, Audience: "istio-ca"})
		require.NoError(t, err)
		id, err := a.Authenticate(ctx, Request{BearerToken: wrong})
		require.NoError(t, err)
		assert.Equal(t, webID, id.ID)
		_, err = a.Authenticate(ctx, Request{BearerToken: right})
		require.ErrorIs(t, err, ErrInvalidCredentials)
	})

	// With the API server's issuer discovery, a token whose signature does
	// not verify is refused before any review; genuine tokens still are
	// reviewed (a deleted service account is only known to the API server).
	t.Run("issuer keys from discovery", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		a, err := NewTokenReview(TokenReviewConfig{Client: env.Client, TrustDomain: localTD, Registerer: reg,
			IssuerKeys: RESTFetch(env.Client.Discovery().RESTClient())})
		require.NoError(t, err)
		_, err = a.Authenticate(ctx, Request{BearerToken: right})
		require.NoError(t, err)
		assert.Positive(t, a.keys.count(), "keys read through the REST client")
		// The payload naming another account is caught by its
		// kubernetes.io claim even before its signature.
		_, err = a.Authenticate(ctx, Request{BearerToken: tamperedPayload})
		require.ErrorIs(t, err, ErrInvalidCredentials)
		_, err = a.Authenticate(ctx, Request{BearerToken: tamperedSig})
		require.ErrorIs(t, err, ErrInvalidCredentials)
		assert.ErrorContains(t, err, "signature")
		_, err = a.Authenticate(ctx, Request{BearerToken: deleted})
		require.ErrorIs(t, err, ErrInvalidCredentials, "signed by the issuer, refused by the review")
		assert.Equal(t, 1.0, testutil.ToFloat64(a.m.local.WithLabelValues(localRefusedSignature)))
		assert.Equal(t, 1.0, testutil.ToFloat64(a.m.local.WithLabelValues(localRefusedSubject)))
		assert.Equal(t, 2.0, testutil.ToFloat64(a.m.local.WithLabelValues(localVerified)))
		assert.Equal(t, 1.0, testutil.ToFloat64(a.m.reviews.WithLabelValues(reviewAuthenticated)))
		assert.Equal(t, 1.0, testutil.ToFloat64(a.m.reviews.WithLabelValues(reviewUnauthenticated)))
	})

	// The API server minimum lifetime is 10 minutes, so an expired token is
	// shown by moving our clock past its exp: refused without a review.
	t.Run("expired token", func(t *testing.T) {
		tok := env.ServiceAccountToken(t, ns, "web", []string{aud}, 10*time.Minute)
		clk := clocktesting.NewFakeClock(time.Now().Add(11 * time.Minute))
		a, err := NewTokenReview(TokenReviewConfig{Client: env.Client, TrustDomain: localTD, Clock: clk})
		require.NoError(t, err)
		_, err = a.Authenticate(ctx, Request{BearerToken: tok})
		require.ErrorIs(t, err, ErrInvalidCredentials)
		assert.ErrorContains(t, err, "expired")
	})

	// A cached review outlives its service account by at most CacheTTL.
	t.Run("deletion seen after the cache TTL", func(t *testing.T) {
		tok := env.ServiceAccountToken(t, ns, "short-lived", []string{aud}, time.Hour)
		clk := clocktesting.NewFakeClock(time.Now())
		a, err := NewTokenReview(TokenReviewConfig{Client: env.Client, TrustDomain: localTD, Clock: clk, CacheTTL: time.Second})
		require.NoError(t, err)
		_, err = a.Authenticate(ctx, Request{BearerToken: tok})
		require.NoError(t, err)
		require.NoError(t, env.Client.CoreV1().ServiceAccounts(ns).Delete(ctx, "short-lived", metav1.DeleteOptions{}))
		_, err = a.Authenticate(ctx, Request{BearerToken: tok})
		require.NoError(t, err, "cached")
		// Each attempt starts past our cache TTL. The API server keeps its
		// own cache of successful token authentications (10s by default),
		// so the refusal comes once that has expired too.
		require.Eventually(t, func() bool {
			clk.Step(time.Second)
			_, err := a.Authenticate(ctx, Request{BearerToken: tok})
			return errors.Is(err, ErrInvalidCredentials)
		}, 30*time.Second, 250*time.Millisecond)
		_, err = a.Authenticate(ctx, Request{BearerToken: tok})
		require.ErrorContains(t, err, "not found")
	})
}

func decodeB64(t *testing.T, s string) string {
	t.Helper()
	var out map[string]any
	require.NoError(t, decodeSegment(s, &out))
	b, err := jsonMarshal(out)
	require.NoError(t, err)
	return string(b)
}

// flipMiddle changes a character in the middle of s. The last base64
// character may carry only padding bits, which decoders ignore.
func flipMiddle(s string) string {
	b := []byte(s)
	i := len(b) / 2
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}
