package jwtsvid_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/jwtsvid"
)

var (
	tdA = spiffeid.RequireTrustDomainFromString("a.example")
	tdB = spiffeid.RequireTrustDomainFromString("b.example")
	idA = spiffeid.RequireFromPath(tdA, "/ns/pay/sa/api")
)

func ecKey(t testing.TB, c elliptic.Curve) crypto.Signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(c, rand.Reader)
	require.NoError(t, err)
	return k
}

func claims(now time.Time) jwtsvid.Claims {
	return jwtsvid.Claims{Subject: idA, Audience: []string{"https://api.b.example"}, IssuedAt: now, Expiry: now.Add(5 * time.Minute)}
}

// bundles holds key under kid for td.
func bundles(td spiffeid.TrustDomain, kid string, key crypto.Signer) *jwtbundle.Set {
	b := jwtbundle.New(td)
	_ = b.AddJWTAuthority(kid, key.Public())
	return jwtbundle.NewSet(b)
}

func TestMintValidateRoundTrip(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		key  crypto.Signer
		alg  jose.SignatureAlgorithm
	}{
		{"ES256", ecKey(t, elliptic.P256()), jose.ES256},
		{"ES384", ecKey(t, elliptic.P384()), jose.ES384},
		{"RS256", rsaKey, jose.RS256},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			tok, err := jwtsvid.Mint(tc.key, "k1", claims(now))
			require.NoError(t, err)
			parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{tc.alg})
			require.NoError(t, err)
			h := parsed.Headers[0]
			assert.Equal(t, "k1", h.KeyID)
			assert.Equal(t, "JWT", h.ExtraHeaders[jose.HeaderType])

			svid, err := jwtsvid.Validate(tok, bundles(tdA, "k1", tc.key), []string{"other", "https://api.b.example"}, nil)
			require.NoError(t, err)
			assert.Equal(t, idA, svid.ID)
			assert.Equal(t, []string{"https://api.b.example"}, svid.Audience)
			assert.Equal(t, now.Add(5*time.Minute).Unix(), svid.Expiry.Unix())
			assert.EqualValues(t, now.Unix(), svid.Claims["iat"])
		})
	}
}

func TestMintRefuses(t *testing.T) {
	now := time.Now()
	small, err := rsa.GenerateKey(rand.Reader, 1024)
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		key    crypto.Signer
		kid    string
		mutate func(*jwtsvid.Claims)
		want   error
	}{
		{"no kid", ecKey(t, elliptic.P256()), "", nil, jwtsvid.ErrInvalidKey},
		{"small RSA", small, "k", nil, jwtsvid.ErrInvalidKey},
		{"P-521", ecKey(t, elliptic.P521()), "k", nil, jwtsvid.ErrInvalidKey},
		{"no subject", ecKey(t, elliptic.P256()), "k", func(c *jwtsvid.Claims) { c.Subject = spiffeid.ID{} }, jwtsvid.ErrInvalidClaims},
		{"no audience", ecKey(t, elliptic.P256()), "k", func(c *jwtsvid.Claims) { c.Audience = nil }, jwtsvid.ErrInvalidClaims},
		{"empty audience", ecKey(t, elliptic.P256()), "k", func(c *jwtsvid.Claims) { c.Audience = []string{"a", ""} }, jwtsvid.ErrInvalidClaims},
		{"expiry not after iat", ecKey(t, elliptic.P256()), "k", func(c *jwtsvid.Claims) { c.Expiry = c.IssuedAt }, jwtsvid.ErrInvalidClaims},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := claims(now)
			if tc.mutate != nil {
				tc.mutate(&c)
			}
			_, err := jwtsvid.Mint(tc.key, tc.kid, c)
			assert.ErrorIs(t, err, tc.want)
		})
	}
}

// segment base64url-encodes v as JSON, as a JWS header or payload.
func segment(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return base64.RawURLEncoding.EncodeToString(b)
}

func payload(now time.Time, sub string) map[string]any {
	return map[string]any{"sub": sub, "aud": []string{"https://api.b.example"}, "exp": now.Add(time.Hour).Unix(), "iat": now.Unix()}
}

func TestValidateRefuses(t *testing.T) {
	now := time.Now()
	key := ecKey(t, elliptic.P256())
	good := bundles(tdA, "k1", key)
	mint := func(kid string, c jwtsvid.Claims) string {
		tok, err := jwtsvid.Mint(key, kid, c)
		require.NoError(t, err)
		return tok
	}
	// alg none: an unsigned token that names a kid the bundle holds.
	none := segment(t, map[string]string{"alg": "none", "kid": "k1", "typ": "JWT"}) + "." + segment(t, payload(now, idA.String())) + "."
	// HS256 keyed with the public key's bytes: the classic confusion
	// attack on verifiers that take the algorithm from the header.
	pub, err := json.Marshal(jose.JSONWebKey{Key: key.Public()})
	require.NoError(t, err)
	signingInput := segment(t, map[string]string{"alg": "HS256", "kid": "k1", "typ": "JWT"}) + "." + segment(t, payload(now, idA.String()))
	mac := hmac.New(sha256.New, pub)
	mac.Write([]byte(signingInput))
	hs256 := signingInput + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))

	expired := claims(now.Add(-time.Hour))
	notYet := claims(now.Add(time.Hour))
	for _, tc := range []struct {
		name     string
		token    string
		bundles  *jwtbundle.Set
		audience []string
		want     string
	}{
		{"alg none", none, good, []string{"https://api.b.example"}, "unable to parse"},
		{"HS256 with the public key", hs256, good, []string{"https://api.b.example"}, "unable to parse"},
		{"unknown kid", mint("k2", claims(now)), good, []string{"https://api.b.example"}, "no JWT authority \"k2\""},
		{"expired", mint("k1", expired), good, []string{"https://api.b.example"}, "expired"},
		{"not yet valid", mint("k1", jwtsvid.Claims{Subject: idA, Audience: notYet.Audience, IssuedAt: notYet.IssuedAt, Expiry: notYet.Expiry}), good, []string{"https://api.b.example"}, "future"},
		{"wrong audience", mint("k1", claims(now)), good, []string{"https://elsewhere"}, "audience"},
		{"no audience to check", mint("k1", claims(now)), good, nil, "audience"},
		{"empty audience to check", mint("k1", claims(now)), good, []string{""}, "audience"},
		{"key only in another trust domain", mint("k1", claims(now)), bundles(tdB, "k1", key), []string{"https://api.b.example"}, "no bundle found for trust domain \"a.example\""},
		{"oversized", strings.Repeat("a", jwtsvid.MaxTokenBytes+1), good, []string{"x"}, "limit"},
		{"garbage", "not.a.token", good, []string{"x"}, "unable to parse"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := jwtsvid.Validate(tc.token, tc.bundles, tc.audience, nil)
			require.Error(t, err)
			assert.ErrorIs(t, err, jwtsvid.ErrInvalidToken)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestValidateRefusesForeignTyp(t *testing.T) {
	key := ecKey(t, elliptic.P256())
	signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key},
		(&jose.SignerOptions{}).WithType("at+jwt").WithHeader("kid", "k1"))
	require.NoError(t, err)
	now := time.Now()
	tok, err := jwt.Signed(signer).Claims(jwt.Claims{Subject: idA.String(), Audience: jwt.Audience{"x"}, Expiry: jwt.NewNumericDate(now.Add(time.Minute))}).Serialize()
	require.NoError(t, err)
	_, err = jwtsvid.Validate(tok, bundles(tdA, "k1", key), []string{"x"}, nil)
	assert.ErrorIs(t, err, jwtsvid.ErrInvalidToken)
	assert.ErrorContains(t, err, "type")
}

// FuzzValidate feeds arbitrary tokens to the validation path: it must never
// panic, and anything it accepts must name the trust domain whose bundle
// holds the key, for the audience asked.
func FuzzValidate(f *testing.F) {
	key := ecKey(f, elliptic.P256())
	set := bundles(tdA, "k1", key)
	now := time.Now()
	good, err := jwtsvid.Mint(key, "k1", claims(now))
	require.NoError(f, err)
	f.Add(good)
	f.Add("")
	f.Add("..")
	f.Add("eyJhbGciOiJub25lIn0.e30.")
	f.Add(good[:len(good)-3])
	f.Add(strings.Replace(good, ".", "..", 1))
	f.Fuzz(func(t *testing.T, token string) {
		svid, err := jwtsvid.Validate(token, set, []string{"https://api.b.example"}, nil)
		if err != nil {
			return
		}
		assert.Equal(t, tdA, svid.ID.TrustDomain())
		assert.Contains(t, svid.Audience, "https://api.b.example")
	})
}
