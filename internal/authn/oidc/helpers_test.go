package oidc

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/require"
	clocktesting "k8s.io/utils/clock/testing"
)

const (
	testIssuerURL  = "https://issuer.test/tenant"
	testIssuerName = "ci"
	testAudience   = "spiffe://example.org"
	testTemplate   = "spiffe://{{.TrustDomain}}/ci/{{.Claims.repository_owner}}/{{ .Claims.workflow }}"
	kubeIssuerURL  = "https://kube.test"
	kubeIssuerName = "west"
)

var (
	testTD  = spiffeid.RequireTrustDomainFromString("example.org")
	testNow = time.Date(2027, 3, 1, 12, 0, 0, 0, time.UTC)
)

// testKeys are generated once per test binary: RSA generation is slow.
var testKeys = sync.OnceValue(func() struct {
	rsa  *rsa.PrivateKey
	ec   *ecdsa.PrivateKey
	rsa2 *rsa.PrivateKey // not published
} {
	r, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	r2, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	e, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return struct {
		rsa  *rsa.PrivateKey
		ec   *ecdsa.PrivateKey
		rsa2 *rsa.PrivateKey
	}{r, e, r2}
})

// fakeKeys is a keySource over fixed public keys.
type fakeKeys struct {
	mu    sync.Mutex
	keys  []jose.JSONWebKey
	err   error // returned by every call when set
	calls int
	kids  []string // the key ids asked for, in order
}

func (f *fakeKeys) Keys(_ context.Context, kid string) ([]jose.JSONWebKey, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	f.kids = append(f.kids, kid)
	if f.err != nil {
		return nil, f.err
	}
	if kid == "" {
		return f.keys, nil
	}
	var out []jose.JSONWebKey
	for _, k := range f.keys {
		if k.KeyID == kid {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("key id %q: %w", kid, ErrUnknownKey)
	}
	return out, nil
}

func (f *fakeKeys) Status() keySetStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := keySetStatus{Keys: len(f.keys), LastFetch: testNow, LastSuccess: testNow}
	if f.err != nil {
		st.LastError = f.err.Error()
	}
	return st
}

func publicKeys() []jose.JSONWebKey {
	k := testKeys()
	return []jose.JSONWebKey{
		{Key: &k.rsa.PublicKey, KeyID: "rsa-1", Use: "sig"},
		{Key: &k.ec.PublicKey, KeyID: "ec-1", Use: "sig"},
		// A key that names its algorithm: only PS256 tokens may use it.
		{Key: &k.rsa.PublicKey, KeyID: "rsa-ps", Algorithm: "PS256", Use: "sig"},
	}
}

// fixture is an Authenticator over fake keys, with its clock and metrics.
type fixture struct {
	a    *Authenticator
	clk  *clocktesting.FakeClock
	reg  *prometheus.Registry
	keys map[string]*fakeKeys
}

func oidcIssuer() IssuerConfig {
	return IssuerConfig{
		Name: testIssuerName, Issuer: testIssuerURL, Audiences: []string{testAudience, "other"},
		Algorithms: []string{"RS256", "ES256", "PS256"},
		Claims:     []ClaimRule{{Claim: "repository_owner", Values: []string{"acme", "umbrella"}}},
		SPIFFEID:   testTemplate,
	}
}

func kubeIssuer() IssuerConfig {
	return IssuerConfig{Name: kubeIssuerName, Kind: KindKubernetes, Issuer: kubeIssuerURL, Audiences: []string{"trustbridge"}}
}

func newFixture(t testing.TB, issuers ...IssuerConfig) *fixture {
	t.Helper()
	if len(issuers) == 0 {
		issuers = []IssuerConfig{oidcIssuer(), kubeIssuer()}
	}
	f := &fixture{clk: clocktesting.NewFakeClock(testNow), reg: prometheus.NewRegistry(), keys: map[string]*fakeKeys{}}
	a, err := New(Config{
		TrustDomain: testTD, Issuers: issuers, Clock: f.clk, Registerer: f.reg,
		newKeys: func(ic IssuerConfig) (keySource, error) {
			k := &fakeKeys{keys: publicKeys()}
			f.keys[ic.Name] = k
			return k, nil
		},
	})
	require.NoError(t, err)
	f.a = a
	return f
}

func (f *fixture) count(issuer, result string) float64 {
	return testutil.ToFloat64(f.a.tokens.WithLabelValues(issuer, result))
}

// ciClaims are valid claims of the OIDC test issuer at testNow.
func ciClaims() map[string]any {
	return map[string]any{
		"iss": testIssuerURL, "sub": "repo:acme/app:ref:refs/heads/main", "aud": testAudience,
		"exp": testNow.Add(10 * time.Minute).Unix(), "iat": testNow.Unix(), "nbf": testNow.Unix(),
		"repository_owner": "acme", "workflow": "build",
	}
}

// kubeClaims are valid claims of a projected service account token.
func kubeClaims(ns, sa string) map[string]any {
	return map[string]any{
		"iss": kubeIssuerURL, "sub": "system:serviceaccount:" + ns + ":" + sa, "aud": []any{"trustbridge"},
		"exp": testNow.Add(time.Hour).Unix(), "iat": testNow.Unix(), "nbf": testNow.Unix(),
		"kubernetes.io": map[string]any{
			"namespace":      ns,
			"serviceaccount": map[string]any{"name": sa, "uid": "0b6b1e2c"},
			"pod":            map[string]any{"name": sa + "-0", "uid": "9a7d"},
		},
	}
}

// sign makes a compact JWS of payload (a map is JSON-encoded, a string
// used as is) with alg, the key for it, kid and extra header fields.
func sign(t testing.TB, alg, kid string, extra map[string]any, payload any) string {
	t.Helper()
	k := testKeys()
	var key any
	switch alg {
	case "RS256", "RS384", "RS512", "PS256", "PS384", "PS512":
		key = k.rsa
	case "ES256":
		key = k.ec
	default:
		t.Fatalf("no test key for %s", alg)
	}
	return signWith(t, jose.SignatureAlgorithm(alg), key, kid, extra, payload)
}

func signWith(t testing.TB, alg jose.SignatureAlgorithm, key any, kid string, extra map[string]any, payload any) string {
	t.Helper()
	opts := &jose.SignerOptions{}
	for name, v := range extra {
		opts.WithHeader(jose.HeaderKey(name), v)
	}
	if kid != "" {
		opts.WithHeader("kid", kid)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: key}, opts)
	require.NoError(t, err)
	jws, err := s.Sign(payloadBytes(t, payload))
	require.NoError(t, err)
	out, err := jws.CompactSerialize()
	require.NoError(t, err)
	return out
}

func payloadBytes(t testing.TB, payload any) []byte {
	t.Helper()
	if s, ok := payload.(string); ok {
		return []byte(s)
	}
	b, err := json.Marshal(payload)
	require.NoError(t, err)
	return b
}

// unsigned builds header.payload.signature from raw JSON parts, for
// tokens no signer makes (alg none).
func unsigned(header, payload string, sig []byte) string {
	e := base64.RawURLEncoding.EncodeToString
	return e([]byte(header)) + "." + e([]byte(payload)) + "." + e(sig)
}
