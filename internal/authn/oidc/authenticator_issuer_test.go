package oidc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/authn/oidc/oidctest"
)

// issuerFixture is an Authenticator over a local OIDC issuer (discovery
// and JWKS over TLS on 127.0.0.1) with the real key set.
type issuerFixture struct {
	a   *Authenticator
	iss *oidctest.Issuer
	clk *clocktesting.FakeClock
	reg *prometheus.Registry
}

const issuerAudience = "spiffe://example.org"

func newIssuerFixture(t *testing.T) *issuerFixture {
	t.Helper()
	f := &issuerFixture{clk: clocktesting.NewFakeClock(testNow), reg: prometheus.NewRegistry()}
	f.iss = oidctest.New(t, oidctest.WithNow(f.clk.Now))
	a, err := New(Config{
		TrustDomain: testTD,
		Issuers: []IssuerConfig{{
			Name: "ci", Issuer: f.iss.URL(), Audiences: []string{issuerAudience},
			Roots: f.iss.Roots(), AllowPrivateAddresses: true,
			Claims:   []ClaimRule{{Claim: "repository_owner", Values: []string{"acme"}}},
			SPIFFEID: "spiffe://{{.TrustDomain}}/ci/{{.Claims.repository_owner}}/{{.Claims.sub}}",
		}},
		Clock: f.clk, Registerer: f.reg,
	})
	require.NoError(t, err)
	f.a = a
	return f
}

func (f *issuerFixture) claims() map[string]any {
	c := f.iss.StandardClaims("build-1", issuerAudience)
	c["repository_owner"] = "acme"
	return c
}

func (f *issuerFixture) authenticate(t *testing.T, token string) (authn.Identity, error) {
	t.Helper()
	return f.a.Authenticate(context.Background(), bearer(token))
}

func (f *issuerFixture) tokens(result string) float64 {
	return testutil.ToFloat64(f.a.tokens.WithLabelValues("ci", result))
}

func (f *issuerFixture) keyFetches(t *testing.T, result string) float64 {
	t.Helper()
	return metricValue(t, f.reg, "trustbridge_authn_oidc_key_fetches_total", map[string]string{"issuer": "ci", "result": result})
}

// metricValue reads one counter or gauge sample from reg.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			if m.GetCounter() != nil {
				return m.GetCounter().GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	t.Fatalf("no sample of %s with %v", name, labels)
	return 0
}

func TestIssuerDiscoveryAndAccept(t *testing.T) {
	f := newIssuerFixture(t)
	ident, err := f.authenticate(t, f.iss.Mint(f.claims()))
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/ci/acme/build-1", ident.ID.String())
	assert.Equal(t, authn.MethodOIDC, ident.Method)
	assert.Equal(t, testNow.Add(oidctest.TokenLifetime*time.Second), ident.NotAfter)
	assert.Equal(t, 1.0, f.tokens(resultAccepted))

	hits := f.iss.Hits()
	assert.Equal(t, 1, hits[f.iss.Path(oidctest.DiscoveryPath)])
	assert.Equal(t, 1, hits[f.iss.Path(oidctest.JWKSPath)])
	assert.Equal(t, 1.0, f.keyFetches(t, "ok"))

	// The keys are fresh (max-age 5m): a second token costs no fetch.
	_, err = f.authenticate(t, f.iss.Mint(f.claims()))
	require.NoError(t, err)
	assert.Equal(t, 1, f.iss.Hits()[f.iss.Path(oidctest.JWKSPath)])

	st := f.a.Status()
	require.Len(t, st, 1)
	assert.Equal(t, 1, st[0].Keys)
	assert.Equal(t, testNow, st[0].LastSuccess)
	assert.Empty(t, st[0].LastError)
}

func TestIssuerRotation(t *testing.T) {
	f := newIssuerFixture(t)
	_, err := f.authenticate(t, f.iss.Mint(f.claims()))
	require.NoError(t, err)

	f.iss.Rotate()
	rotated := f.iss.Mint(f.claims())
	// Within RefreshInterval of the last fetch, an unknown kid causes no
	// fetch: a stream of junk kids cannot hammer the issuer.
	_, err = f.authenticate(t, rotated)
	require.ErrorIs(t, err, authn.ErrInvalidCredentials)
	assert.Contains(t, err.Error(), "is not one of the issuer's keys")
	assert.Equal(t, 1.0, f.tokens(resultRefusedKey))
	assert.Equal(t, 1, f.iss.Hits()[f.iss.Path(oidctest.JWKSPath)])

	// Once the interval has passed, the new kid is accepted after one
	// refetch.
	f.clk.Step(DefaultRefreshInterval)
	ident, err := f.authenticate(t, f.iss.Mint(f.claims()))
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/ci/acme/build-1", ident.ID.String())
	assert.Equal(t, 2, f.iss.Hits()[f.iss.Path(oidctest.JWKSPath)])
	assert.Equal(t, 2.0, f.keyFetches(t, "ok"))
	assert.Equal(t, 2, f.a.Status()[0].Keys)
}

// TestIssuerRefusals: each hostile or wrong token against the real key
// set, with its error kind and metric result.
func TestIssuerRefusals(t *testing.T) {
	stranger, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tests := []struct {
		name    string
		token   func(f *issuerFixture) string
		wantErr error
		result  string // "" for ErrNoCredentials: no issuer's metric moves
		errHas  string
		noKeys  bool // refused before any key fetch
	}{
		{name: "expired", token: func(f *issuerFixture) string {
			c := f.claims()
			c["exp"] = testNow.Add(-time.Second).Unix()
			return f.iss.Mint(c)
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedTime, errHas: "token expired"},
		{name: "nbf in the future", token: func(f *issuerFixture) string {
			c := f.claims()
			c["nbf"] = testNow.Add(5 * time.Minute).Unix()
			return f.iss.Mint(c)
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedTime, errHas: "token nbf"},
		{name: "wrong aud", token: func(f *issuerFixture) string {
			c := f.claims()
			c["aud"] = "spiffe://other.org"
			return f.iss.Mint(c)
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedAudience},
		{name: "iss no issuer is configured for", token: func(f *issuerFixture) string {
			c := f.claims()
			c["iss"] = "https://elsewhere.test"
			return f.iss.Mint(c)
		}, wantErr: authn.ErrNoCredentials, noKeys: true},
		{name: "alg none", token: func(f *issuerFixture) string { return f.iss.NoneAlg(f.claims()) },
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedAlg, errHas: `"none"`, noKeys: true},
		{name: "HMAC keyed with the public key", token: func(f *issuerFixture) string { return f.iss.HMACWithPublicKey(f.claims()) },
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedAlg, errHas: `"HS256"`, noKeys: true},
		{name: "unknown kid", token: func(f *issuerFixture) string {
			return f.iss.MintWith(map[string]any{"kid": "not-a-key"}, f.claims())
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedKey, errHas: `"not-a-key"`},
		{name: "signed by a stranger", token: func(f *issuerFixture) string {
			return f.iss.MintWith(map[string]any{"alg": "ES256"}, f.claims(), stranger)
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedSignature},
		{name: "claim rule", token: func(f *issuerFixture) string {
			c := f.claims()
			c["repository_owner"] = "evil"
			return f.iss.Mint(c)
		}, wantErr: authn.ErrPermissionDenied, result: resultRefusedRules},
		{name: "sub with a slash", token: func(f *issuerFixture) string {
			c := f.claims()
			c["sub"] = "build/../../admin"
			return f.iss.Mint(c)
		}, wantErr: authn.ErrPermissionDenied, result: resultRefusedTemplate},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newIssuerFixture(t)
			token := tt.token(f)
			ident, err := f.authenticate(t, token)
			require.Error(t, err)
			assert.True(t, ident.ID.IsZero())
			assert.ErrorIs(t, err, tt.wantErr)
			assert.Contains(t, err.Error(), tt.errHas)
			assertNoTokenBytes(t, err, token)
			if tt.result != "" {
				assert.Equal(t, 1.0, f.tokens(tt.result), "result %s", tt.result)
				assert.NotErrorIs(t, err, authn.ErrNoCredentials)
			}
			for _, r := range allResults() {
				if r != tt.result {
					assert.Zero(t, f.tokens(r), "result %s", r)
				}
			}
			if tt.noKeys {
				assert.Empty(t, f.iss.Hits(), "no key work for a token refused on its header or issuer")
			}
		})
	}
}

// TestIssuerDiscoveryMismatch: an issuer whose discovery document names
// another issuer is not trusted (OpenID Connect Discovery §4.3).
func TestIssuerDiscoveryMismatch(t *testing.T) {
	f := newIssuerFixture(t)
	disc := f.iss.Discovery()
	disc["issuer"] = "https://impostor.test"
	body, err := json.Marshal(disc)
	require.NoError(t, err)
	f.iss.SetDiscoveryBody(body)
	_, err = f.authenticate(t, f.iss.Mint(f.claims()))
	require.ErrorIs(t, err, authn.ErrUnavailable)
	assert.NotErrorIs(t, err, authn.ErrInvalidCredentials)
	assert.Equal(t, 1.0, f.tokens(resultUnavailable))
	assert.Equal(t, 1.0, f.keyFetches(t, "error"))
	assert.NotEmpty(t, f.a.Status()[0].LastError)
	assert.Zero(t, f.iss.Hits()[f.iss.Path(oidctest.JWKSPath)], "the keys of an issuer that says it is another are never fetched")
}

// TestIssuerOversizedJWKS: an oversized key set is an error, not a
// truncation: on first use tokens get ErrUnavailable; after a success the
// last good keys are kept, with the failure visible in metrics and status.
func TestIssuerOversizedJWKS(t *testing.T) {
	big := []byte(`{"keys":[],"pad":"` + strings.Repeat("a", 300<<10) + `"}`)

	t.Run("first use", func(t *testing.T) {
		f := newIssuerFixture(t)
		f.iss.SetJWKSBody(big)
		_, err := f.authenticate(t, f.iss.Mint(f.claims()))
		require.ErrorIs(t, err, authn.ErrUnavailable)
		assert.Equal(t, 1.0, f.tokens(resultUnavailable))
		assert.Equal(t, 1.0, f.keyFetches(t, "error"))
		st := f.a.Status()[0]
		assert.Zero(t, st.Keys)
		assert.NotEmpty(t, st.LastError)
	})

	t.Run("last good kept", func(t *testing.T) {
		f := newIssuerFixture(t)
		token := f.iss.Mint(f.claims())
		_, err := f.authenticate(t, token)
		require.NoError(t, err)
		f.iss.SetJWKSBody(big)
		f.clk.Step(6 * time.Minute) // past the JWKS max-age: the next use refetches
		_, err = f.authenticate(t, f.iss.Mint(f.claims()))
		require.NoError(t, err)
		assert.Equal(t, 2, f.iss.Hits()[f.iss.Path(oidctest.JWKSPath)])
		assert.Equal(t, 2.0, f.tokens(resultAccepted))
		assert.Equal(t, 1.0, f.keyFetches(t, "error"))
		st := f.a.Status()[0]
		assert.Equal(t, 1, st.Keys)
		assert.Equal(t, testNow, st.LastSuccess)
		assert.NotEmpty(t, st.LastError)
	})
}

// TestIssuerOutage: a failing issuer keeps its last good keys, logged and
// counted, and the same token works again when it is back.
func TestIssuerOutage(t *testing.T) {
	f := newIssuerFixture(t)
	_, err := f.authenticate(t, f.iss.Mint(f.claims()))
	require.NoError(t, err)
	f.iss.SetStatus(http.StatusBadGateway)
	f.clk.Step(6 * time.Minute)
	_, err = f.authenticate(t, f.iss.Mint(f.claims()))
	require.NoError(t, err, "last good keys kept")
	assert.Equal(t, 1.0, f.keyFetches(t, "error"))
	assert.Contains(t, f.a.Status()[0].LastError, "502")

	f.iss.SetStatus(0)
	f.clk.Step(DefaultRefreshInterval)
	_, err = f.authenticate(t, f.iss.Mint(f.claims()))
	require.NoError(t, err)
	assert.Empty(t, f.a.Status()[0].LastError)
}

// One fetch of an issuer's keys is one "issuer keys fetched" record: the
// key set logs it, the warm-up that asked for it does not log it again.
func TestWarmUpLogsFetchOnce(t *testing.T) {
	var logs strings.Builder
	iss := oidctest.New(t, oidctest.WithNow(func() time.Time { return testNow }))
	a, err := New(Config{
		TrustDomain: testTD,
		Issuers: []IssuerConfig{{
			Name: "ci", Issuer: iss.URL(), Audiences: []string{issuerAudience}, Roots: iss.Roots(), AllowPrivateAddresses: true,
			Claims:   []ClaimRule{{Claim: "repository_owner", Values: []string{"acme"}}},
			SPIFFEID: "spiffe://{{.TrustDomain}}/ci/{{.Claims.sub}}",
		}},
		Clock: clocktesting.NewFakeClock(testNow), Registerer: prometheus.NewRegistry(),
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	require.NoError(t, err)
	a.warmUp(context.Background(), a.issuers[0])
	assert.Equal(t, 1, strings.Count(logs.String(), `msg="issuer keys fetched"`), logs.String())
	assert.Contains(t, logs.String(), `level=INFO msg="issuer keys fetched"`)
}
