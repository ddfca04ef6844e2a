package jwtsvid_test

import (
	"crypto/elliptic"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/jwtsvid"
)

func TestParseIssuer(t *testing.T) {
	for _, ok := range []string{
		"https://oidc.example.com",
		"https://oidc.example.com/prod",
		"https://oidc.example.com:8443/a/b-c_d.e~f",
		"https://127.0.0.1:9443/oidc",
		"https://[::1]:9443",
		"https://xn--bcher-kva.example/x",
		"https://1.2.3.4",
	} {
		u, err := jwtsvid.ParseIssuer(ok)
		if assert.NoError(t, err, ok) {
			assert.Equal(t, ok, u.String(), "the issuer is the string as given")
		}
	}
	for _, tc := range []struct{ in, want string }{
		{"", "issuer is empty"},
		{"http://oidc.example.com", "scheme must be https"},
		{"oidc.example.com", "scheme must be https"},
		{"https://", "has no host"},
		{"https://:443", "has no host"},
		{"https:oidc.example.com", "has no host"},
		{"https://user@oidc.example.com", "user info"},
		{"https://oidc.example.com?x=1", "query"},
		{"https://oidc.example.com/?", "query"},
		{"https://oidc.example.com#f", "fragment"},
		{"https://oidc.example.com/", `write "https://oidc.example.com"`},
		{"https://oidc.example.com/prod/", `write "https://oidc.example.com/prod"`},
		{"https://oidc.example.com/a//b", "not clean"},
		{"https://oidc.example.com/a/../b", "not clean"},
		{"https://oidc.example.com/a%2Fb", "percent-encoded"},
		{"https://oidc.example.com/a b", "character ' '"},
		{"https://oidc.example.com/\u00e9", "plain https URL"},
		{"https://oidc.example.com:0", "not a port number"},
		{"https://oidc.example.com:70000", "not a port number"},
		{"https://oidc.example.com/{td}", "must not contain"},
		{"https://oidc.example.com/" + strings.Repeat("a", 250), "over the 255-byte limit"},
		{"HTTPS://oidc.example.com", `write the scheme as "https://", lowercase`},
		{"https://OIDC.example.com", "lowercase letters"},
		{"https://*.example.com", `label "*"`},
		{"https://oidc.example.com.", "no trailing dot"},
		{"https://a<b>.com", "not a DNS name"},
		{"https://a_b.example.com", "not a DNS name"},
		{"https://-a.example.com", "not a DNS name"},
		{"https://oidc.example.com:", "empty port"},
		{"https://oidc.example.com:0443", "canonically"},
		{"https://oidc.example.com:443", "write https://oidc.example.com without it"},
		{"https://[fe80::1%25eth0]", "without a zone"},
		{"https://[1.2.3.4]", "invalid IP-literal"},
	} {
		_, err := jwtsvid.ParseIssuer(tc.in)
		if assert.Error(t, err, tc.in) {
			assert.Contains(t, err.Error(), tc.want, tc.in)
		}
	}
}

func FuzzParseIssuer(f *testing.F) {
	for _, s := range []string{"https://oidc.example.com/prod", "https://a:1", "https://a/b/", "http://x", "https://[::1]/x?y#z"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, err := jwtsvid.ParseIssuer(s)
		if err != nil {
			return
		}
		// What it accepts is a plain https URL that prints as given and
		// that a discovery path can be appended to.
		if u.String() != s || u.Scheme != "https" || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || strings.HasSuffix(s, "/") {
			t.Fatalf("accepted %q as %#v", s, u)
		}
	})
}

func TestMintCarriesIssuer(t *testing.T) {
	key := ecKey(t, elliptic.P256())
	now := time.Now()
	c := claims(now)
	c.Issuer = "https://oidc.a.example/prod"
	tok, err := jwtsvid.Mint(key, "k1", c)
	require.NoError(t, err)
	svid, err := jwtsvid.Validate(tok, bundles(tdA, "k1", key), c.Audience, nil)
	require.NoError(t, err)
	assert.Equal(t, c.Issuer, svid.Claims["iss"])

	c.Issuer = "https://oidc.a.example/"
	_, err = jwtsvid.Mint(key, "k1", c)
	assert.ErrorIs(t, err, jwtsvid.ErrInvalidClaims, "an issuer relying parties would not match is refused at minting")
}

func TestValidateChecksIssuerOfSubjectsTrustDomain(t *testing.T) {
	key := ecKey(t, elliptic.P256())
	now := time.Now()
	mint := func(iss string) string {
		c := claims(now)
		c.Issuer = iss
		tok, err := jwtsvid.Mint(key, "k1", c)
		require.NoError(t, err)
		return tok
	}
	ours := func(td spiffeid.TrustDomain) string {
		if td == tdA {
			return "https://oidc.a.example"
		}
		return ""
	}
	set := bundles(tdA, "k1", key)
	aud := claims(now).Audience
	for _, tc := range []struct {
		name, iss string
		issuer    jwtsvid.IssuerOf
		want      string
	}{
		{"our issuer", "https://oidc.a.example", ours, ""},
		{"another issuer", "https://evil.example", ours, `iss "https://evil.example" is not a.example's issuer "https://oidc.a.example"`},
		{"a prefix of ours", "https://oidc.a.example/x", ours, "is not a.example's issuer"},
		{"no iss: minted before the issuer was set", "", ours, ""},
		{"issuer unknown", "https://anything.example", nil, ""},
		{"issuer unknown for the trust domain", "https://anything.example", func(spiffeid.TrustDomain) string { return "" }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := jwtsvid.Validate(mint(tc.iss), set, aud, tc.issuer)
			if tc.want == "" {
				assert.NoError(t, err)
				return
			}
			assert.ErrorIs(t, err, jwtsvid.ErrInvalidToken)
			assert.ErrorContains(t, err, tc.want)
		})
	}

	// An iss that is not a string (an array holding ours, a number) is
	// refused (go-spiffe's claims parsing already does).
	for _, iss := range []any{[]string{"https://oidc.a.example"}, 42} {
		signer, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: key}, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", "k1"))
		require.NoError(t, err)
		tok, err := jwt.Signed(signer).Claims(map[string]any{"iss": iss, "sub": idA.String(), "aud": aud, "exp": now.Add(time.Minute).Unix(), "iat": now.Unix()}).Serialize()
		require.NoError(t, err)
		_, err = jwtsvid.Validate(tok, set, aud, ours)
		assert.ErrorIs(t, err, jwtsvid.ErrInvalidToken, "iss %v", iss)
	}

	// The issuer asked about is the subject's trust domain's: b's issuer
	// says nothing about a's tokens.
	onlyB := func(td spiffeid.TrustDomain) string {
		if td == tdB {
			return "https://oidc.b.example"
		}
		return ""
	}
	_, err := jwtsvid.Validate(mint("https://oidc.a.example"), set, aud, onlyB)
	assert.NoError(t, err)
}
