package bundleserver_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/bundleserver"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
)

// jwtKey is a JWT authority with its kid.
type jwtKey struct {
	kid string
	key crypto.Signer
}

func newJWTKey(t testing.TB, kid string) jwtKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	return jwtKey{kid, k}
}

// withJWT is a bundle of trustDomain with one root and keys as its JWT
// authorities.
func withJWT(t testing.TB, trustDomain spiffeid.TrustDomain, seq uint64, keys ...jwtKey) *spiffebundle.Bundle {
	t.Helper()
	b := newBundle(t, trustDomain, 1, seq, time.Minute)
	for _, k := range keys {
		require.NoError(t, b.AddJWTAuthority(k.kid, k.key.Public()))
	}
	return b
}

func (k jwtKey) mint(t testing.TB, iss string, sub spiffeid.ID, aud string) string {
	t.Helper()
	now := time.Now().Truncate(time.Second)
	tok, err := jwtsvid.Mint(k.key, k.kid, jwtsvid.Claims{Issuer: iss, Subject: sub, Audience: []string{aud}, IssuedAt: now, Expiry: now.Add(5 * time.Minute)})
	require.NoError(t, err)
	return tok
}

func get(t testing.TB, h http.Handler, path string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

const issuerURL = "https://127.0.0.1/oidc"

// The discovery document has every field OpenID Connect Discovery 1.0 §3
// requires of an issuer that only signs (authorization_endpoint aside:
// there is none), with values taken from the keys published, and the
// JWKS names each key's kid, alg and use.
func TestIssuerDocuments(t *testing.T) {
	k1 := newJWTKey(t, "kid-1")
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	k2 := jwtKey{"kid-2", rsaKey}
	src := newSource(withJWT(t, td, 1, k1, k2))
	reg := prometheus.NewRegistry()
	s := newServer(t, bundleserver.Config{Local: src, Registerer: reg,
		Issuers: []bundleserver.Issuer{{URL: issuerURL, TrustDomain: td, Source: src}}})
	h := s.Handler()

	rec := get(t, h, "/oidc/.well-known/openid-configuration")
	require.Equal(t, http.StatusOK, rec.Code, rec.Body.String())
	assert.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	assert.Equal(t, "max-age=30", rec.Header().Get("Cache-Control"), "half the refresh hint, as the bundle")
	var disc map[string]any
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &disc))
	// OIDC Discovery §3: REQUIRED issuer, jwks_uri,
	// response_types_supported, subject_types_supported,
	// id_token_signing_alg_values_supported; nothing else but the
	// claims JWT-SVIDs carry.
	assert.Equal(t, map[string]any{
		"issuer":                                issuerURL,
		"jwks_uri":                              issuerURL + "/keys",
		"response_types_supported":              []any{"id_token"},
		"subject_types_supported":               []any{"public"},
		"id_token_signing_alg_values_supported": []any{"ES256", "RS256"},
		"claims_supported":                      []any{"sub", "aud", "exp", "iat", "iss"},
	}, disc)

	rec = get(t, h, "/oidc/keys")
	require.Equal(t, http.StatusOK, rec.Code)
	var jwks struct {
		Keys []map[string]any `json:"keys"`
	}
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &jwks))
	require.Len(t, jwks.Keys, 2)
	for i, want := range []struct{ kid, kty, alg string }{{"kid-1", "EC", "ES256"}, {"kid-2", "RSA", "RS256"}} {
		assert.Equal(t, want.kid, jwks.Keys[i]["kid"])
		assert.Equal(t, want.kty, jwks.Keys[i]["kty"])
		assert.Equal(t, want.alg, jwks.Keys[i]["alg"])
		assert.Equal(t, "sig", jwks.Keys[i]["use"], "Kafka/Strimzi and others refuse keys without use")
		assert.NotContains(t, jwks.Keys[i], "d", "a public key only")
	}

	// Conditional requests as on the bundle routes.
	etag := rec.Header().Get("Etag")
	require.NotEmpty(t, etag)
	assert.Equal(t, http.StatusNotModified, get(t, h, "/oidc/keys", "If-None-Match", etag).Code)
	rec = get(t, h, "/oidc/keys", "If-None-Match", `"other"`)
	assert.Equal(t, http.StatusOK, rec.Code)
	req := httptest.NewRequest(http.MethodPost, "/oidc/keys", nil)
	post := httptest.NewRecorder()
	h.ServeHTTP(post, req)
	assert.Equal(t, http.StatusMethodNotAllowed, post.Code)
	assert.Equal(t, http.StatusNotFound, get(t, h, "/oidc").Code, "the issuer URL itself serves nothing")
	assert.Equal(t, 2.0, testutil.ToFloat64(mustCounter(t, reg, "oidc_jwks", "200")))
	assert.Equal(t, 1.0, testutil.ToFloat64(mustCounter(t, reg, "oidc_jwks", "304")))

	st := s.IssuerStates()
	require.Len(t, st, 1)
	assert.Equal(t, issuerURL+"/.well-known/openid-configuration", st[0].DiscoveryURL)
	assert.Equal(t, []bundleserver.IssuerKey{{KeyID: "kid-1", Algorithm: "ES256", Use: "sig"}, {KeyID: "kid-2", Algorithm: "RS256", Use: "sig"}}, st[0].Keys)
	assert.NoError(t, st[0].Err)
}

func mustCounter(t *testing.T, reg *prometheus.Registry, route, code string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "trustbridge_bundleserver_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["route"] == route && labels["code"] == code {
				return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x"}, func() float64 { return m.GetCounter().GetValue() })
			}
		}
	}
	t.Fatalf("no requests_total{route=%q,code=%q}", route, code)
	return nil
}

// A bundle with no JWT authority publishes no issuer documents (503, not
// the last keys: the CA removed them), says why, and counts it; a key no
// relying party takes is left out and named, the others published.
func TestIssuerWithoutPublishableKeys(t *testing.T) {
	k1 := newJWTKey(t, "kid-1")
	src := newSource(withJWT(t, td, 1, k1))
	reg := prometheus.NewRegistry()
	s := newServer(t, bundleserver.Config{Local: src, Registerer: reg,
		Issuers: []bundleserver.Issuer{{URL: issuerURL, TrustDomain: td, Source: src}}})
	h := s.Handler()
	require.Equal(t, http.StatusOK, get(t, h, "/oidc/keys").Code)

	src.Set(withJWT(t, td, 2))
	err := s.Update()
	require.ErrorContains(t, err, `OIDC issuer "https://127.0.0.1/oidc": no JWT authority to publish`)
	for _, p := range []string{"/oidc/keys", "/oidc/.well-known/openid-configuration"} {
		rec := get(t, h, p)
		assert.Equal(t, http.StatusServiceUnavailable, rec.Code, p)
		assert.Equal(t, "10", rec.Header().Get("Retry-After"))
		assert.Contains(t, rec.Body.String(), "no JWT authority published")
	}
	assert.Equal(t, http.StatusOK, get(t, h, "/").Code, "the bundle itself is still served")
	assert.ErrorContains(t, s.IssuerStates()[0].Err, "no JWT authority to publish")
	assert.Empty(t, s.IssuerStates()[0].Keys)
	assert.Equal(t, 1.0, testutil.ToFloat64(counter(t, reg, "trustbridge_bundleserver_update_errors_total")))
	require.ErrorContains(t, s.Update(), "no JWT authority", "the same bundle stays refused")
	assert.Equal(t, 1.0, testutil.ToFloat64(counter(t, reg, "trustbridge_bundleserver_update_errors_total")), "and is counted once")

	p224, err := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	require.NoError(t, err)
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	require.NoError(t, err)
	k2 := newJWTKey(t, "kid-2")
	src.Set(withJWT(t, td, 3, k2, jwtKey{"p224", p224}, jwtKey{"rsa1024", small}))
	err = s.Update()
	require.ErrorContains(t, err, `JWT authority "p224": ECDSA curve P-224 has no JWS algorithm`)
	require.ErrorContains(t, err, `JWT authority "rsa1024": RSA key of 1024 bits`)
	rec := get(t, h, "/oidc/keys")
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Contains(t, rec.Body.String(), `"kid-2"`)
	assert.NotContains(t, rec.Body.String(), "p224")

	src.Set(withJWT(t, td, 4, k2))
	require.NoError(t, s.Update())
	assert.NoError(t, s.IssuerStates()[0].Err, "a good bundle clears the error")
}

func counter(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			v := mf.GetMetric()[0].GetCounter().GetValue()
			return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "x"}, func() float64 { return v })
		}
	}
	t.Fatalf("no %s", name)
	return nil
}

func TestIssuerConfigRefused(t *testing.T) {
	src := newSource(withJWT(t, td, 1, newJWTKey(t, "k")))
	for _, tc := range []struct {
		name    string
		path    string
		issuers []bundleserver.Issuer
		want    string
	}{
		{"not https", "", []bundleserver.Issuer{{URL: "http://a.example", TrustDomain: td, Source: src}}, "scheme must be https"},
		{"trailing slash", "", []bundleserver.Issuer{{URL: "https://a.example/", TrustDomain: td, Source: src}}, `write "https://a.example"`},
		{"no source", "", []bundleserver.Issuer{{URL: "https://a.example", TrustDomain: td}}, "bundle source are required"},
		{"bundle path", "/keys", []bundleserver.Issuer{{URL: "https://a.example", TrustDomain: td, Source: src}}, "is the local bundle's path"},
		{"bundle routes", "", []bundleserver.Issuer{{URL: "https://a.example/bundles", TrustDomain: td, Source: src}}, "collides with the /bundle-map"},
		{"same path", "", []bundleserver.Issuer{
			{URL: "https://a.example/x", TrustDomain: td, Source: src},
			{URL: "https://b.example/x", TrustDomain: td, Source: src},
		}, `is already issuer "https://a.example/x"'s`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := bundleserver.New(bundleserver.Config{TrustDomain: td, Local: src, Path: tc.path, Issuers: tc.issuers})
			assert.ErrorContains(t, err, tc.want)
		})
	}
}

// An Endpoint serves our own trust domain's keys and a relayed file's,
// each under its issuer; a federated peer's bundle is never an issuer,
// and our issuer never serves a relayed trust domain's keys.
func TestEndpointIssuers(t *testing.T) {
	ours, relayedKey, peerKey := newJWTKey(t, "ours"), newJWTKey(t, "relayed"), newJWTKey(t, "peer")
	dir := t.TempDir()
	file := writeBundleFile(t, dir, withJWT(t, eastTD, 1, relayedKey))
	local := newSource(withJWT(t, td, 1, ours))
	peer := withJWT(t, westTD, 1, peerKey)
	cfg := bundleserver.EndpointConfig{
		Config: bundleserver.Config{TrustDomain: td, Local: local, ServeOthers: true,
			Others: func() []*spiffebundle.Bundle { return []*spiffebundle.Bundle{peer} },
			Issuers: []bundleserver.Issuer{
				{URL: "https://oidc.example.org/ours", TrustDomain: td},
				{URL: "https://oidc.example.org/east", TrustDomain: eastTD},
			}},
		Files: []string{"east.example=" + file},
	}
	e, err := bundleserver.NewEndpoint(cfg)
	require.NoError(t, err)
	h := e.Server().Handler()
	assert.Contains(t, get(t, h, "/ours/keys").Body.String(), `"ours"`)
	assert.NotContains(t, get(t, h, "/ours/keys").Body.String(), `"relayed"`)
	assert.Contains(t, get(t, h, "/east/keys").Body.String(), `"relayed"`)
	assert.Contains(t, get(t, h, "/east/.well-known/openid-configuration").Body.String(), `"issuer":"https://oidc.example.org/east"`)

	cfg.Issuers = []bundleserver.Issuer{{URL: "https://oidc.example.org/west", TrustDomain: westTD}}
	_, err = bundleserver.NewEndpoint(cfg)
	assert.ErrorContains(t, err, `trust domain "west.example" is neither ours nor relayed from a bundle file`)
}

// go-oidc's verifier, as a relying party configured with only the issuer
// URL, discovers the JWKS and verifies a JWT-SVID's signature, iss and
// aud over TLS; across a key rotation a token of the new key verifies as
// soon as the key is published, and once the old key left the JWKS a
// relying party that fetched it since refuses the old key's tokens.
func TestGoOIDCVerifiesJWTSVIDs(t *testing.T) {
	oldKey, newKey := newJWTKey(t, "old"), newJWTKey(t, "new")
	src := newSource(withJWT(t, td, 1, oldKey))
	ts := httptest.NewTLSServer(nil)
	t.Cleanup(ts.Close)
	iss := ts.URL + "/oidc"
	s := newServer(t, bundleserver.Config{Local: src, Issuers: []bundleserver.Issuer{{URL: iss, TrustDomain: td, Source: src}}})
	ts.Config.Handler = s.Handler()
	ctx := oidc.ClientContext(context.Background(), ts.Client())
	workload := spiffeid.RequireFromPath(td, "/ns/app/sa/web")
	verifier := func() *oidc.IDTokenVerifier {
		p, err := oidc.NewProvider(ctx, iss)
		require.NoError(t, err)
		return p.Verifier(&oidc.Config{ClientID: "sts.amazonaws.com"})
	}
	v := verifier()
	tok, err := v.Verify(ctx, oldKey.mint(t, iss, workload, "sts.amazonaws.com"))
	require.NoError(t, err)
	assert.Equal(t, workload.String(), tok.Subject)

	_, err = v.Verify(ctx, oldKey.mint(t, "https://other.example", workload, "sts.amazonaws.com"))
	assert.ErrorContains(t, err, "id token issued by a different provider")
	_, err = v.Verify(ctx, oldKey.mint(t, iss, workload, "someone-else"))
	assert.ErrorContains(t, err, "expected audience")
	// On a fresh verifier: a signature that fails makes go-oidc refetch
	// the keys, and its key set hands the next refetch that starts
	// before that fetch's goroutine has let go of it the same, stale,
	// answer (RemoteKeySet.keysFromRemote), which failed the rotation
	// below now and then when v made this check.
	_, err = verifier().Verify(ctx, newJWTKey(t, "old").mint(t, iss, workload, "sts.amazonaws.com"))
	assert.ErrorContains(t, err, "failed to verify signature", "a key with a known kid but not ours")

	// The successor is published before it signs: the verifier, which
	// cached only the old key, refetches on the unknown kid.
	src.Set(withJWT(t, td, 2, oldKey, newKey))
	require.NoError(t, s.Update())
	_, err = v.Verify(ctx, newKey.mint(t, iss, workload, "sts.amazonaws.com"))
	require.NoError(t, err, "a token of the new key verifies as soon as it is minted")

	// The old key is removed once every token it signed expired.
	src.Set(withJWT(t, td, 3, newKey))
	require.NoError(t, s.Update())
	_, err = verifier().Verify(ctx, oldKey.mint(t, iss, workload, "sts.amazonaws.com"))
	assert.ErrorContains(t, err, "failed to verify signature")
	_, err = verifier().Verify(ctx, newKey.mint(t, iss, workload, "sts.amazonaws.com"))
	assert.NoError(t, err)
}

func writeBundleFile(t *testing.T, dir string, b *spiffebundle.Bundle) string {
	t.Helper()
	data, err := b.Marshal()
	require.NoError(t, err)
	path := dir + "/" + b.TrustDomain().Name() + ".json"
	require.NoError(t, os.WriteFile(path, data, 0o644))
	return path
}
