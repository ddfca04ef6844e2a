package oidctest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func get(t *testing.T, iss *Issuer, url string) (*http.Response, []byte) {
	t.Helper()
	resp, err := iss.Client().Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, b
}

func jwks(t *testing.T, iss *Issuer) jose.JSONWebKeySet {
	t.Helper()
	var doc struct {
		JWKSURI string `json:"jwks_uri"`
	}
	_, b := get(t, iss, iss.URL()+DiscoveryPath)
	require.NoError(t, json.Unmarshal(b, &doc))
	resp, b := get(t, iss, doc.JWKSURI)
	assert.Equal(t, "public, max-age=300", resp.Header.Get("Cache-Control"))
	var set jose.JSONWebKeySet
	require.NoError(t, json.Unmarshal(b, &set))
	return set
}

func verify(t *testing.T, token string, set jose.JSONWebKeySet, alg jose.SignatureAlgorithm) map[string]any {
	t.Helper()
	jws, err := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{alg})
	require.NoError(t, err)
	keys := set.Key(jws.Signatures[0].Header.KeyID)
	require.Len(t, keys, 1)
	payload, err := jws.Verify(keys[0])
	require.NoError(t, err)
	var claims map[string]any
	require.NoError(t, json.Unmarshal(payload, &claims))
	return claims
}

func TestIssuerServesVerifiableTokensAcrossRotation(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	iss := New(t, WithPath("tenant"), WithNow(func() time.Time { return now }))
	assert.True(t, strings.HasSuffix(iss.URL(), "/tenant"))

	claims := iss.StandardClaims("sub-1", "aud-1")
	got := verify(t, iss.Mint(claims), jwks(t, iss), jose.RS256)
	assert.Equal(t, iss.URL(), got["iss"])
	assert.Equal(t, "aud-1", got["aud"])
	assert.EqualValues(t, now.Unix()+TokenLifetime, got["exp"])

	old := iss.KeyID()
	iss.Rotate()
	assert.NotEqual(t, old, iss.KeyID())
	assert.Len(t, jwks(t, iss).Keys, 2)
	verify(t, iss.Mint(claims), jwks(t, iss), jose.RS256)
	iss.DropOldKeys()
	assert.Len(t, jwks(t, iss).Keys, 1)
	assert.Equal(t, 4, iss.Hits()[iss.Path(JWKSPath)])
}

func TestIssuerES256(t *testing.T) {
	t.Parallel()
	iss := New(t, WithAlgorithm(jose.ES256))
	verify(t, iss.Mint(iss.StandardClaims("s", "a", "b")), jwks(t, iss), jose.ES256)
}

func TestMintWithHeaderAndKey(t *testing.T) {
	t.Parallel()
	iss := New(t)
	tok := iss.MintWith(map[string]any{"kid": nil, "crit": []string{"exp"}, "typ": "at+jwt"}, iss.StandardClaims("s", "a"))
	h := header(t, tok)
	assert.NotContains(t, h, "kid")
	assert.Equal(t, "at+jwt", h["typ"])
	assert.Equal(t, []any{"exp"}, h["crit"])

	stranger, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tok = iss.MintWith(map[string]any{"alg": "ES256"}, iss.StandardClaims("s", "a"), stranger)
	assert.Equal(t, iss.KeyID(), header(t, tok)["kid"])
	jws, err := jose.ParseSignedCompact(tok, []jose.SignatureAlgorithm{jose.ES256})
	require.NoError(t, err)
	_, err = jws.Verify(&stranger.PublicKey)
	assert.NoError(t, err)
}

func TestHostileTokens(t *testing.T) {
	t.Parallel()
	iss := New(t)
	claims := iss.StandardClaims("s", "a")

	none := iss.NoneAlg(claims)
	assert.True(t, strings.HasSuffix(none, "."))
	assert.Equal(t, "none", header(t, none)["alg"])

	hmac := iss.HMACWithPublicKey(claims)
	assert.Equal(t, "HS256", header(t, hmac)["alg"])
	set := jwks(t, iss)
	der, err := x509.MarshalPKIXPublicKey(set.Keys[0].Key)
	require.NoError(t, err)
	jws, err := jose.ParseSignedCompact(hmac, []jose.SignatureAlgorithm{jose.HS256})
	require.NoError(t, err)
	_, err = jws.Verify(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	assert.NoError(t, err, "keyed with the published key's PEM")
}

func TestFaults(t *testing.T) {
	t.Parallel()
	iss := New(t, WithMaxAge(-1))
	iss.SetJWKSBody([]byte(`{"keys":[]}`))
	resp, b := get(t, iss, iss.URL()+JWKSPath)
	assert.Empty(t, resp.Header.Get("Cache-Control"))
	assert.JSONEq(t, `{"keys":[]}`, string(b))

	iss.SetDiscoveryBody([]byte(`{}`))
	_, b = get(t, iss, iss.URL()+DiscoveryPath)
	assert.Equal(t, `{}`, string(b))

	iss.SetStatus(http.StatusTeapot)
	resp, _ = get(t, iss, iss.URL()+DiscoveryPath)
	assert.Equal(t, http.StatusTeapot, resp.StatusCode)
	iss.SetStatus(0)

	iss.SetHandler(iss.Path(JWKSPath), http.RedirectHandler("http://127.0.0.1/", http.StatusFound))
	req, err := http.NewRequest(http.MethodGet, iss.URL()+JWKSPath, nil)
	require.NoError(t, err)
	resp, err = iss.Client().Transport.RoundTrip(req)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusFound, resp.StatusCode)
	assert.Equal(t, 2, iss.Hits()[iss.Path(JWKSPath)])
}

func header(t *testing.T, token string) map[string]any {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(strings.Split(token, ".")[0])
	require.NoError(t, err)
	var h map[string]any
	require.NoError(t, json.Unmarshal(b, &h))
	return h
}
