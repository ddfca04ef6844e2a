package authn

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"

	"github.com/trustbridge/trustbridge/internal/testkit/testca"
)

// claimsFor are the claims kube-apiserver writes for default/web, valid at
// epoch for an hour.
func claimsFor(sa string) map[string]any {
	return map[string]any{
		"iss": testIssuer, "sub": "system:serviceaccount:default:" + sa, "aud": []string{"example.org"},
		"exp": epoch.Add(time.Hour).Unix(), "iat": epoch.Unix(), "nbf": epoch.Unix(),
		"kubernetes.io": map[string]any{"namespace": "default", "serviceaccount": map[string]any{"name": sa, "uid": "u-1"}},
	}
}

func with(c map[string]any, kv ...any) map[string]any {
	out := map[string]any{}
	for k, v := range c {
		out[k] = v
	}
	for i := 0; i < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(out, kv[i].(string))
			continue
		}
		out[kv[i].(string)] = kv[i+1]
	}
	return out
}

func withHeader(t *testing.T, header string, claims map[string]any) string {
	t.Helper()
	b, err := json.Marshal(claims)
	require.NoError(t, err)
	return encodeB64(header) + "." + encodeB64(string(b)) + "." + encodeB64("sig")
}

func TestCheckTokenClaims(t *testing.T) {
	base := claimsFor("web")
	rs := `{"alg":"RS256","kid":"k"}`
	tests := []struct {
		name       string
		header     string
		claims     map[string]any
		wantReason string
	}{
		{name: "kube-apiserver token", header: rs, claims: base},
		{name: "ES256", header: `{"alg":"ES256"}`, claims: base},
		{name: "aud as a string", header: rs, claims: with(base, "aud", "example.org")},
		{name: "no kubernetes.io claim", header: rs, claims: with(base, "kubernetes.io", nil)},
		{name: "no iat or nbf", header: rs, claims: with(base, "iat", nil, "nbf", nil)},
		{name: "exp a year away (extended token)", header: rs, claims: with(base, "exp", epoch.Add(365*24*time.Hour).Unix())},
		{name: "iat slightly ahead (clock skew)", header: rs, claims: with(base, "iat", epoch.Add(30*time.Second).Unix())},
		{name: "alg none", header: `{"alg":"none"}`, claims: base, wantReason: localRefusedAlg},
		{name: "alg HS256", header: `{"alg":"HS256"}`, claims: base, wantReason: localRefusedAlg},
		{name: "alg lowercase", header: `{"alg":"rs256"}`, claims: base, wantReason: localRefusedAlg},
		{name: "crit header", header: `{"alg":"RS256","crit":["b64"]}`, claims: base, wantReason: localRefusedClaims},
		{name: "no iss", header: rs, claims: with(base, "iss", nil), wantReason: localRefusedClaims},
		{name: "iss not a string", header: rs, claims: with(base, "iss", 7), wantReason: localRefusedClaims},
		{name: "no exp", header: rs, claims: with(base, "exp", nil), wantReason: localRefusedTime},
		{name: "expired", header: rs, claims: with(base, "exp", epoch.Unix()), wantReason: localRefusedTime},
		{name: "exp too far", header: rs, claims: with(base, "exp", epoch.Add(400*24*time.Hour).Unix()), wantReason: localRefusedTime},
		{name: "exp not a number", header: rs, claims: with(base, "exp", "soon"), wantReason: localRefusedClaims},
		{name: "nbf in the future", header: rs, claims: with(base, "nbf", epoch.Add(time.Hour).Unix()), wantReason: localRefusedTime},
		{name: "iat in the future", header: rs, claims: with(base, "iat", epoch.Add(time.Hour).Unix()), wantReason: localRefusedTime},
		{name: "iat negative", header: rs, claims: with(base, "iat", -5), wantReason: localRefusedClaims},
		{name: "other audience", header: rs, claims: with(base, "aud", []string{"istio-ca"}), wantReason: localRefusedAudience},
		{name: "no audience", header: rs, claims: with(base, "aud", nil), wantReason: localRefusedAudience},
		{name: "aud of numbers", header: rs, claims: with(base, "aud", []int{1}), wantReason: localRefusedClaims},
		{name: "user subject", header: rs, claims: with(base, "sub", "alice"), wantReason: localRefusedSubject},
		{name: "bad namespace", header: rs, claims: with(base, "sub", "system:serviceaccount:Default:web"), wantReason: localRefusedSubject},
		{name: "subject with extra colon", header: rs, claims: with(base, "sub", "system:serviceaccount:default:web:x"), wantReason: localRefusedSubject},
		{name: "kubernetes.io names another namespace", header: rs, claims: with(base, "kubernetes.io", map[string]any{"namespace": "kube-system", "serviceaccount": map[string]any{"name": "web"}}), wantReason: localRefusedSubject},
		{name: "kubernetes.io names another account", header: rs, claims: with(base, "kubernetes.io", map[string]any{"namespace": "default", "serviceaccount": map[string]any{"name": "admin"}}), wantReason: localRefusedSubject},
		{name: "kubernetes.io without serviceaccount", header: rs, claims: with(base, "kubernetes.io", map[string]any{"namespace": "default"}), wantReason: localRefusedSubject},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lt, ref := checkTokenClaims(withHeader(t, tt.header, tt.claims), "example.org", epoch)
			if tt.wantReason == "" {
				require.Nil(t, ref)
				assert.Equal(t, "default", lt.ns)
				assert.Equal(t, "web", lt.sa)
				assert.Equal(t, tt.claims["exp"], lt.exp.Unix(), "exp kept for Identity.NotAfter")
				return
			}
			require.NotNil(t, ref)
			assert.Equal(t, tt.wantReason, ref.reason, ref.err)
		})
	}
}

// issuer is a service account issuer: its signing keys and the discovery
// documents of an API server publishing them.
type issuer struct {
	mu      sync.Mutex
	keys    map[string]crypto.Signer // by kid
	fail    error                    // returned by fetch when set
	fetches atomic.Int32
}

func newIssuer(t *testing.T, kids ...string) *issuer {
	is := &issuer{keys: map[string]crypto.Signer{}}
	for _, k := range kids {
		is.addKey(t, k)
	}
	return is
}

func (is *issuer) addKey(t *testing.T, kid string) {
	// Fresh keys: testca caches RSA keys per size, and two issuers must
	// not share one.
	var k crypto.Signer
	var err error
	if strings.HasPrefix(kid, "ec") {
		k, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	} else {
		k, err = rsa.GenerateKey(rand.Reader, 2048)
	}
	require.NoError(t, err)
	is.mu.Lock()
	defer is.mu.Unlock()
	is.keys[kid] = k
}

func (is *issuer) fetch(_ context.Context, path string, limit int64) ([]byte, error) {
	is.fetches.Add(1)
	is.mu.Lock()
	defer is.mu.Unlock()
	if is.fail != nil {
		return nil, is.fail
	}
	switch path {
	case discoveryPath:
		return []byte(`{"issuer":"` + testIssuer + `","jwks_uri":"https://10.0.0.1:6443/openid/v1/jwks"}`), nil
	case defaultJWKSPath:
		var set jose.JSONWebKeySet
		for kid, k := range is.keys {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: k.Public(), KeyID: kid, Use: "sig"})
		}
		return json.Marshal(set)
	}
	return nil, fmt.Errorf("404 %s", path)
}

// sign makes a token signed by the issuer's key kid, naming kid (unless
// noKid).
func (is *issuer) sign(t testing.TB, kid string, claims map[string]any, noKid bool) string {
	t.Helper()
	is.mu.Lock()
	k := is.keys[kid]
	is.mu.Unlock()
	alg := jose.RS256
	if strings.HasPrefix(kid, "ec") {
		alg = jose.ES256
	}
	opts := &jose.SignerOptions{}
	if !noKid {
		opts = opts.WithHeader("kid", kid)
	}
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: alg, Key: k}, opts)
	require.NoError(t, err)
	payload, err := json.Marshal(claims)
	require.NoError(t, err)
	jws, err := s.Sign(payload)
	require.NoError(t, err)
	tok, err := jws.CompactSerialize()
	require.NoError(t, err)
	return tok
}

// A token whose signature does not verify against the issuer's keys never
// reaches TokenReview; one that does is still reviewed. Unknown key ids
// make at most one fetch per interval.
func TestTokenReviewIssuerKeys(t *testing.T) {
	const user = "system:serviceaccount:default:web"
	is := newIssuer(t, "rsa-1", "ec-1")
	other := newIssuer(t, "rsa-1") // same kid, another key
	f := newReviewFixture(t, func(c *TokenReviewConfig) { c.IssuerKeys = is.fetch })
	local := func(result string) float64 { return testutil.ToFloat64(f.a.m.local.WithLabelValues(result)) }

	good := is.sign(t, "rsa-1", claimsFor("web"), false)
	f.api.set(good, accept(user, "example.org"))
	_, err := f.auth(good)
	require.NoError(t, err)
	assert.EqualValues(t, 1, f.api.calls.Load(), "a verified token is still reviewed")
	assert.Equal(t, 1.0, local(localVerified))
	assert.EqualValues(t, 2, is.fetches.Load(), "discovery, then the key set")
	assert.Equal(t, 2.0, testutil.ToFloat64(collector(t, f.reg, "trustbridge_authn_token_issuer_keys")))

	ec := is.sign(t, "ec-1", claimsFor("web"), true)
	f.api.set(ec, accept(user, "example.org"))
	_, err = f.auth(ec)
	require.NoError(t, err, "no kid: every key is tried")

	forged := other.sign(t, "rsa-1", claimsFor("web"), false)
	f.api.set(forged, accept(user, "example.org"))
	_, err = f.auth(forged)
	require.ErrorIs(t, err, ErrInvalidCredentials)
	assert.Contains(t, err.Error(), "does not verify")
	assert.Equal(t, 1.0, local(localRefusedSignature))

	parts := strings.Split(good, ".")
	tampered := parts[0] + "." + encodeB64(mustJSON(t, with(claimsFor("web"), "sub", "system:serviceaccount:default:admin", "kubernetes.io", nil))) + "." + parts[2]
	_, err = f.auth(tampered)
	require.ErrorIs(t, err, ErrInvalidCredentials)
	assert.Equal(t, 2.0, local(localRefusedSignature))
	assert.EqualValues(t, 2, f.api.calls.Load(), "neither forged token was reviewed")

	// Unknown kids: one refresh per interval however many arrive (the
	// keys were fetched just now: none before the interval is over).
	_, err = f.auth(withKid(t, other, "early"))
	require.ErrorIs(t, err, ErrInvalidCredentials)
	assert.EqualValues(t, 2, is.fetches.Load())
	f.clk.Step(DefaultKeysRefreshInterval)
	for i := range 20 {
		_, err := f.auth(withKid(t, other, fmt.Sprintf("rotated-%d", i)))
		require.ErrorIs(t, err, ErrInvalidCredentials)
	}
	assert.EqualValues(t, 4, is.fetches.Load(), "one refresh for twenty unknown kids")
	assert.Equal(t, 21.0, local(localRefusedKey))

	// A key rotated in is found at the next refresh after the interval.
	// Until then a token it signed, issued after the keys held were
	// fetched, is refused as retryable, not as invalid: junk kids that keep
	// a fetch recent cannot lock a rotation out for good. (The tokens above
	// were issued before the keys were fetched: their kids are not keys.)
	// A token issued a second before the fetch (whole-second iat, skewed
	// clocks) counts as possibly newer too.
	is.addKey(t, "rsa-2")
	rotated := is.sign(t, "rsa-2", with(claimsFor("web"), "iat", f.clk.Now().Add(-time.Second).Unix()), false)
	f.api.set(rotated, accept(user, "example.org"))
	_, err = f.auth(rotated)
	require.ErrorIs(t, err, ErrUnavailable, "within the interval the new kid is not known yet")
	assert.NotErrorIs(t, err, ErrInvalidCredentials)
	f.clk.Step(DefaultKeysRefreshInterval)
	_, err = f.auth(rotated)
	require.NoError(t, err)
	assert.EqualValues(t, 6, is.fetches.Load())
}

// withKid is a token of other's key rsa-1 that names kid.
func withKid(t *testing.T, other *issuer, kid string) string {
	other.mu.Lock()
	other.keys[kid] = other.keys["rsa-1"]
	other.mu.Unlock()
	// Issued well before any key fetch: an unknown kid is then no key.
	return other.sign(t, kid, with(claimsFor("web"), "iat", epoch.Add(-time.Minute).Unix()), false)
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

// Without issuer discovery (RBAC, an old cluster) tokens are left to
// TokenReview, the failure is logged once, and the last keys are kept
// when a refresh fails.
func TestTokenReviewIssuerDiscoveryUnavailable(t *testing.T) {
	const user = "system:serviceaccount:default:web"
	is := newIssuer(t, "rsa-1")
	is.fail = errors.New(`forbidden: User "system:serviceaccount:tb:tb" cannot get path "/.well-known/openid-configuration"`)
	f := newReviewFixture(t, func(c *TokenReviewConfig) { c.IssuerKeys = is.fetch })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, f.a.Run(ctx))

	for i := range 3 {
		tok := is.sign(t, "rsa-1", with(claimsFor("web"), "jti", i), false)
		f.api.set(tok, accept(user, "example.org"))
		_, err := f.auth(tok)
		require.NoError(t, err)
		f.clk.Step(DefaultKeysRefreshInterval)
	}
	assert.Equal(t, 3.0, testutil.ToFloat64(f.a.m.local.WithLabelValues(localUnverified)))
	assert.Equal(t, 1, strings.Count(f.log.String(), "level=WARN msg=\"service account issuer discovery unavailable"), f.log.String())

	// Back: keys known, and kept through a later failure.
	is.mu.Lock()
	is.fail = nil
	is.mu.Unlock()
	tok := is.sign(t, "rsa-1", with(claimsFor("web"), "jti", "x"), false)
	f.api.set(tok, accept(user, "example.org"))
	_, err := f.auth(tok)
	require.NoError(t, err)
	assert.Equal(t, 1.0, testutil.ToFloat64(f.a.m.local.WithLabelValues(localVerified)))
	is.mu.Lock()
	is.fail = errors.New("connection refused")
	is.mu.Unlock()
	f.clk.Step(DefaultKeysRefreshInterval)
	_, err = f.auth(withKid(t, newIssuer(t, "rsa-1"), "unknown"))
	require.ErrorIs(t, err, ErrInvalidCredentials, "refresh failed: the kept keys still decide")
	assert.Equal(t, 1, f.a.keys.count())
}

func TestParseIssuerJWKS(t *testing.T) {
	rsaKey := testca.NewKey(t, testca.RSA2048)
	ecKey := testca.NewKey(t, testca.ECP256)
	small := testca.NewKey(t, testca.RSA1024)
	jwk := func(k any, kid, use string) string {
		b, err := json.Marshal(jose.JSONWebKey{Key: k, KeyID: kid, Use: use})
		require.NoError(t, err)
		return string(b)
	}
	tests := []struct {
		name    string
		body    string
		want    []string // kids
		wantErr bool
	}{
		{name: "rsa and ec", body: `{"keys":[` + jwk(rsaKey.Public(), "a", "sig") + `,` + jwk(ecKey.Public(), "b", "") + `]}`, want: []string{"a", "b"}},
		{name: "unknown kty ignored", body: `{"keys":[{"kty":"AKP","alg":"ML-DSA-44","pub":"AAAA"},` + jwk(rsaKey.Public(), "a", "sig") + `]}`, want: []string{"a"}},
		{name: "encryption key ignored", body: `{"keys":[` + jwk(rsaKey.Public(), "a", "enc") + `,` + jwk(ecKey.Public(), "b", "sig") + `]}`, want: []string{"b"}},
		{name: "private key ignored", body: `{"keys":[` + jwk(ecKey, "p", "sig") + `,` + jwk(ecKey.Public(), "b", "sig") + `]}`, want: []string{"b"}},
		{name: "small RSA ignored", body: `{"keys":[` + jwk(small.Public(), "s", "sig") + `,` + jwk(ecKey.Public(), "b", "sig") + `]}`, want: []string{"b"}},
		{name: "no usable key", body: `{"keys":[` + jwk(small.Public(), "s", "sig") + `]}`, wantErr: true},
		{name: "empty", body: `{"keys":[]}`, wantErr: true},
		{name: "not JSON", body: `<html>`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			keys, err := ParseJWKS([]byte(tt.body))
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			var kids []string
			for _, k := range keys {
				kids = append(kids, k.KeyID)
			}
			assert.Equal(t, tt.want, kids)
		})
	}
	t.Run("bounded", func(t *testing.T) {
		var b strings.Builder
		b.WriteString(`{"keys":[`)
		for i := range maxIssuerKeys + 5 {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(jwk(ecKey.Public(), fmt.Sprint(i), "sig"))
		}
		b.WriteString(`]}`)
		keys, err := ParseJWKS([]byte(b.String()))
		require.NoError(t, err)
		assert.Len(t, keys, maxIssuerKeys)
	})
}

func TestJWKSPath(t *testing.T) {
	tests := []struct{ doc, want string }{
		{`{"jwks_uri":"https://kubernetes.default.svc.cluster.local/openid/v1/jwks"}`, "/openid/v1/jwks"},
		{`{"jwks_uri":"https://oidc.example.com/custom/keys"}`, "/custom/keys"},
		{`{"jwks_uri":""}`, defaultJWKSPath},
		{`{"jwks_uri":"https://x/../../api"}`, defaultJWKSPath},
		{`{}`, defaultJWKSPath},
	}
	for _, tt := range tests {
		got, err := jwksPath([]byte(tt.doc))
		require.NoError(t, err)
		assert.Equal(t, tt.want, got, tt.doc)
	}
	_, err := jwksPath([]byte(`nope`))
	assert.Error(t, err)
}

// A flood of tokens from one address gets that address's share of the
// review slots and its rate, refused with ErrUnavailable at once beyond
// them, while another address is still served; refusals are counted and
// their log lines bounded.
func TestTokenReviewPeerShare(t *testing.T) {
	const user = "system:serviceaccount:default:web"
	f := newReviewFixture(t, func(c *TokenReviewConfig) { c.MaxReviewsPerPeer, c.PeerReviewRate, c.PeerReviewBurst = 2, 1, 3 })
	release := make(chan struct{})
	var toks []string
	for i := range 8 {
		tok := makeJWT(t, with(claimsFor("web"), "jti", i))
		toks = append(toks, tok)
		f.api.set(tok, func(spec authenticationv1.TokenReviewSpec) (authenticationv1.TokenReviewStatus, error) {
			<-release
			return accept(user, "example.org")(spec)
		})
	}
	attacker := func(tok string) error {
		_, err := f.a.Authenticate(context.Background(), Request{BearerToken: tok, Peer: "198.51.100.7:4000"})
		return err
	}
	var wg sync.WaitGroup
	for _, tok := range toks[:2] {
		wg.Go(func() { assert.NoError(t, attacker(tok)) })
	}
	require.Eventually(t, func() bool {
		f.a.mu.Lock()
		defer f.a.mu.Unlock()
		return f.a.perPeer["198.51.100.7"] == 2
	}, 5*time.Second, time.Millisecond)
	for range 5 {
		require.ErrorIs(t, attacker(toks[2]), ErrUnavailable)
	}
	assert.Equal(t, 5.0, f.reviews(reviewPeerBusy))

	// Another address gets a review slot meanwhile. (The fake client
	// serializes calls, so its review completes after the blocked ones.)
	legit := makeJWT(t, with(claimsFor("web"), "jti", "legit"))
	f.api.set(legit, accept(user, "example.org"))
	wg.Go(func() {
		_, err := f.a.Authenticate(context.Background(), Request{BearerToken: legit, Peer: "203.0.113.9:1"})
		assert.NoError(t, err)
	})
	require.Eventually(t, func() bool {
		f.a.mu.Lock()
		defer f.a.mu.Unlock()
		return f.a.perPeer["203.0.113.9"] == 1
	}, 5*time.Second, time.Millisecond)

	close(release)
	wg.Wait()
	// The share is free again, the rate (burst 3, two spent) is not.
	var err error
	require.NoError(t, attacker(toks[3]))
	require.ErrorIs(t, attacker(toks[4]), ErrUnavailable)
	assert.Equal(t, 1.0, f.reviews(reviewPeerRateLimited))
	f.clk.Step(time.Second)
	require.NoError(t, attacker(toks[4]), "one more a second")
	assert.EqualValues(t, 5, f.api.calls.Load(), "refused tokens never reached the API server")
	_ = err
	warns := strings.Count(f.log.String(), `level=WARN msg="token review refused: no room"`)
	assert.Equal(t, 6, warns+strings.Count(f.log.String(), `level=DEBUG msg="token review refused: no room"`), "every refusal logged at some level")
}

// Random JWT-shaped tokens (issue 14 item 3) are refused by their claims
// and never take a review slot or reach the API server; the refusals log
// at Debug only.
func TestTokenReviewJunkTokens(t *testing.T) {
	f := newReviewFixture(t, nil)
	for i := range 200 {
		junk := makeJWT(t, map[string]any{"sub": fmt.Sprintf("junk-%d", i), "exp": epoch.Add(time.Hour).Unix()})
		_, err := f.auth(junk)
		require.ErrorIs(t, err, ErrInvalidCredentials)
	}
	assert.Zero(t, f.api.calls.Load())
	assert.Equal(t, 200.0, testutil.ToFloat64(f.a.m.local.WithLabelValues(localRefusedClaims)))
	assert.NotContains(t, f.log.String(), "level=WARN")
	assert.NotContains(t, f.log.String(), "level=ERROR")
}
