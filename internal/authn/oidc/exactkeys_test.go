package oidc

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/trustbridge/trustbridge/internal/authn"
)

// TestAuthenticateExactHeaderKeys: the header's alg, kid and crit and the
// payload's iss are read by their exact names, once, as go-jose reads
// them, so "KID" never picks keys, "ALG" never passes the algorithm check
// and "ISS" never routes a token.
func TestAuthenticateExactHeaderKeys(t *testing.T) {
	claimsJSON := string(payloadBytes(t, ciClaims()))
	// prepend and append splice members into ciClaims' JSON text.
	prepend := func(extra string) string { return "{" + extra + "," + claimsJSON[1:] }
	appendTo := func(extra string) string { return claimsJSON[:len(claimsJSON)-1] + "," + extra + "}" }
	tests := []struct {
		name    string
		token   func() string
		wantErr error  // nil: accepted
		result  string // "" with ErrNoCredentials: no result counted
		kid     string // the key id the keys were asked for, when any
		errHas  string
	}{
		{name: "KID beside kid does not pick the key", token: func() string {
			return signRaw(t, `{"alg":"RS256","kid":"rsa-1","KID":"nope"}`, claimsJSON)
		}, result: resultAccepted, kid: "rsa-1"},
		{name: "KID alone is no key id", token: func() string {
			return sign(t, "RS256", "", map[string]any{"KID": "ec-1"}, ciClaims())
		}, result: resultAccepted, kid: ""},
		{name: "ALG is no algorithm", token: func() string {
			return unsigned(`{"ALG":"RS256","kid":"rsa-1"}`, claimsJSON, []byte("sig"))
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedAlg, errHas: `token algorithm "" is not one`},
		{name: "alg twice", token: func() string {
			return unsigned(`{"alg":"HS256","alg":"RS256","kid":"rsa-1"}`, claimsJSON, []byte("sig"))
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedClaims, errHas: "token header: a member name appears twice"},
		{name: "kid twice", token: func() string {
			return unsigned(`{"alg":"RS256","kid":"rsa-1","kid":"x"}`, claimsJSON, []byte("sig"))
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedClaims, errHas: "appears twice"},
		{name: "kid not a string", token: func() string {
			return unsigned(`{"alg":"RS256","kid":7}`, claimsJSON, []byte("sig"))
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedClaims, errHas: "token header: kid is not a string"},
		{name: "CRIT is not crit", token: func() string {
			return sign(t, "RS256", "rsa-1", map[string]any{"CRIT": []string{"x"}}, ciClaims())
		}, result: resultAccepted, kid: "rsa-1"},
		{name: "crit null is still crit", token: func() string {
			return unsigned(`{"alg":"RS256","crit":null}`, claimsJSON, []byte("sig"))
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedClaims, errHas: "critical extensions"},
		{name: "ISS does not route", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"iss": nil, "ISS": testIssuerURL}))
		}, wantErr: authn.ErrNoCredentials},
		{name: "ISS beside iss does not override it", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, appendTo(`"ISS":"https://elsewhere.test"`))
		}, result: resultAccepted, kid: "rsa-1"},
		{name: "iss twice, ours last", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, prepend(`"iss":"https://elsewhere.test"`))
		}, wantErr: authn.ErrNoCredentials},
		{name: "iss twice, ours first", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, appendTo(`"iss":"https://elsewhere.test"`))
		}, wantErr: authn.ErrNoCredentials},
		{name: "header data after the object", token: func() string {
			return unsigned(`{"alg":"RS256"} {}`, claimsJSON, []byte("sig"))
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedClaims, errHas: "token header: data after the JSON object"},
		{name: "header an array", token: func() string {
			return unsigned(`["alg","RS256"]`, claimsJSON, []byte("sig"))
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedClaims, errHas: "token header: not a JSON object"},
		{name: "header not closed", token: func() string {
			return unsigned(`{"alg":"RS256"`, claimsJSON, []byte("sig"))
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedClaims, errHas: "token header: not a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			var asked []string
			keys := f.keys[testIssuerName]
			token := tt.token()
			ident, err := f.a.Authenticate(context.Background(), bearer(token))
			if tt.wantErr == nil {
				require.NoError(t, err)
				assert.Equal(t, "spiffe://example.org/ci/acme/build", ident.ID.String())
			} else {
				require.ErrorIs(t, err, tt.wantErr)
				assert.True(t, strings.HasPrefix(err.Error(), "authn: oidc: "), err.Error())
				assert.Contains(t, err.Error(), tt.errHas)
				assertNoTokenBytes(t, err, token)
			}
			if tt.result != "" {
				assert.Equal(t, 1.0, f.count(testIssuerName, tt.result))
			} else {
				for _, r := range allResults() {
					assert.Zero(t, f.count(testIssuerName, r), r)
				}
			}
			keys.mu.Lock()
			asked = append(asked, keys.kids...)
			keys.mu.Unlock()
			if tt.wantErr == nil {
				assert.Equal(t, []string{tt.kid}, asked, "key ids the keys were asked for")
			} else {
				assert.Empty(t, asked, "no key work")
			}
		})
	}
}

// signRaw signs header and payload, both JSON text used as is, with the
// RSA test key (RS256): for headers no go-jose signer writes.
func signRaw(t testing.TB, header, payload string) string {
	t.Helper()
	e := base64.RawURLEncoding.EncodeToString
	input := e([]byte(header)) + "." + e([]byte(payload))
	digest := sha256.Sum256([]byte(input))
	sig, err := rsa.SignPKCS1v15(nil, testKeys().rsa, crypto.SHA256, digest[:])
	require.NoError(t, err)
	return input + "." + e(sig)
}
