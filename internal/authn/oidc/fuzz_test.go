package oidc

import (
	"context"
	"strings"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/stretchr/testify/require"
)

func FuzzParseConfig(f *testing.F) {
	f.Add(goodConfig)
	f.Add(issuerDoc(okBody))
	f.Add(issuerDoc(okBody + okRule))
	f.Add(issuerDoc(okBody + "  claims:\n  - claim: a.b\n    values: [x, '1']\n"))
	f.Add("issuers:\n- name: k\n  kind: kubernetes\n  issuer: https://k.test\n  audiences: [a]\n")
	f.Add("issuers:\n- &a {name: x}\n- *a\n")
	f.Add("issuers: [{name: x, issuer: 'https://i.test?', audiences: [a]}]")
	f.Add("")
	f.Fuzz(func(t *testing.T, doc string) {
		issuers, err := ParseConfig([]byte(doc))
		if err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "authn: oidc: "), err.Error())
			return
		}
		// Whatever parses is a configuration New accepts, once the
		// templates name our trust domain.
		for i := range issuers {
			c := issuers[i]
			require.NoError(t, c.check())
			if c.SPIFFEID != "" {
				_, err := parseTemplate(c.SPIFFEID)
				require.NoError(t, err)
			}
		}
	})
}

// FuzzAuthenticate sends arbitrary bearer tokens: Authenticate never
// panics, and never succeeds unless the token carries a valid signature
// of one of the issuer's keys over the claims it was judged by.
func FuzzAuthenticate(f *testing.F) {
	fx := newFixture(f)
	f.Add(sign(f, "RS256", "rsa-1", nil, ciClaims()))
	f.Add(sign(f, "ES256", "", nil, ciClaims()))
	f.Add(sign(f, "RS256", "rsa-1", nil, kubeClaims("prod", "web")))
	f.Add(sign(f, "RS256", "rsa-1", map[string]any{"crit": []string{"b64"}, "b64": false}, ciClaims()))
	f.Add(unsigned(`{"alg":"none"}`, string(payloadBytes(f, ciClaims())), nil))
	f.Add(unsigned(`{"alg":"RS256","kid":"rsa-1"}`, string(payloadBytes(f, ciClaims())), []byte("x")))
	f.Add(signRaw(f, `{"alg":"RS256","kid":"rsa-1","KID":"x"}`, string(payloadBytes(f, ciClaims()))))
	f.Add(unsigned(`{"alg":"HS256","alg":"RS256"}`, string(payloadBytes(f, ciClaims())), []byte("x")))
	f.Add(signRaw(f, `{"alg":"RS256"}`, `{"ISS":"`+testIssuerURL+`"}`))
	f.Add("a.b.c")
	f.Add("")
	keys := publicKeys()
	f.Fuzz(func(t *testing.T, token string) {
		ident, err := fx.a.Authenticate(context.Background(), bearer(token))
		if err != nil {
			require.True(t, strings.HasPrefix(err.Error(), "authn: oidc: "), err.Error())
			if len(token) >= 16 {
				require.NotContains(t, err.Error(), token)
			}
			return
		}
		require.False(t, ident.ID.IsZero())
		jws, perr := jose.ParseSignedCompact(token, []jose.SignatureAlgorithm{jose.RS256, jose.ES256, jose.PS256})
		require.NoError(t, perr)
		verified := false
		for i := range keys {
			if _, verr := jws.Verify(&keys[i]); verr == nil {
				verified = true
			}
		}
		require.True(t, verified, "accepted a token no key verifies")
	})
}
