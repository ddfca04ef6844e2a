package oidc

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/trustbridge/trustbridge/internal/authn"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// with returns claims with the changes applied; a nil value deletes.
func with(claims map[string]any, changes map[string]any) map[string]any {
	out := maps.Clone(claims)
	for k, v := range changes {
		if v == nil {
			delete(out, k)
			continue
		}
		out[k] = v
	}
	return out
}

func bearer(token string) authn.Request {
	return authn.Request{BearerToken: token, Peer: "127.0.0.1:5555"}
}

// TestAuthenticateVerification is the verification table over fake keys:
// each token's error kind, metric result and message.
func TestAuthenticateVerification(t *testing.T) {
	now := testNow
	k := testKeys()
	pubDER, err := x509.MarshalPKIXPublicKey(&k.rsa.PublicKey)
	require.NoError(t, err)
	pubPEM := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER})
	ciNone := func(claims map[string]any) string {
		return unsigned(`{"alg":"none","kid":"rsa-1"}`, string(payloadBytes(t, claims)), nil)
	}
	tests := []struct {
		name    string
		token   func() string
		issuer  string
		wantID  string
		wantErr error
		result  string
		errHas  string
	}{
		{name: "RS256 accepted", token: func() string { return sign(t, "RS256", "rsa-1", nil, ciClaims()) },
			wantID: "spiffe://example.org/ci/acme/build", result: resultAccepted},
		{name: "ES256 accepted", token: func() string { return sign(t, "ES256", "ec-1", nil, ciClaims()) },
			wantID: "spiffe://example.org/ci/acme/build", result: resultAccepted},
		{name: "PS256 with a key bound to PS256", token: func() string { return sign(t, "PS256", "rsa-ps", nil, ciClaims()) },
			wantID: "spiffe://example.org/ci/acme/build", result: resultAccepted},
		{name: "no kid tries every key", token: func() string { return sign(t, "ES256", "", nil, ciClaims()) },
			wantID: "spiffe://example.org/ci/acme/build", result: resultAccepted},
		{name: "aud array", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"aud": []string{"x", "other"}}))
		},
			wantID: "spiffe://example.org/ci/acme/build", result: resultAccepted},
		{name: "nbf within leeway", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"nbf": now.Add(59 * time.Second).Unix()}))
		},
			wantID: "spiffe://example.org/ci/acme/build", result: resultAccepted},
		{name: "iat within leeway", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"iat": now.Add(time.Minute).Unix()}))
		},
			wantID: "spiffe://example.org/ci/acme/build", result: resultAccepted},
		{name: "no nbf nor iat", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"nbf": nil, "iat": nil}))
		},
			wantID: "spiffe://example.org/ci/acme/build", result: resultAccepted},

		{name: "alg not allowed for this issuer", token: func() string { return sign(t, "RS384", "rsa-1", nil, ciClaims()) },
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedAlg, errHas: `token algorithm "RS384" is not one the issuer is configured for (RS256, ES256, PS256)`},
		{name: "alg none", token: func() string { return ciNone(ciClaims()) },
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedAlg, errHas: `token algorithm "none"`},
		{name: "HMAC keyed with the public key", token: func() string { return signWith(t, jose.HS256, pubPEM, "rsa-1", nil, ciClaims()) },
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedAlg, errHas: `token algorithm "HS256"`},
		{name: "crit header", token: func() string { return sign(t, "RS256", "rsa-1", map[string]any{"crit": []string{"exp"}}, ciClaims()) },
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedClaims, errHas: "critical extensions"},
		{name: "unknown kid", token: func() string { return sign(t, "RS256", "rsa-9", nil, ciClaims()) },
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedKey, errHas: `token key id "rsa-9" is not one of the issuer's keys`},
		{name: "signed by another key", token: func() string { return signWith(t, jose.RS256, k.rsa2, "rsa-1", nil, ciClaims()) },
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedSignature, errHas: "signature does not verify"},
		{name: "key bound to another alg", token: func() string { return sign(t, "RS256", "rsa-ps", nil, ciClaims()) },
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedSignature, errHas: "signature does not verify"},
		{name: "RS256 naming the EC key", token: func() string { return sign(t, "RS256", "ec-1", nil, ciClaims()) },
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedSignature},
		{name: "tampered payload", token: func() string {
			tok := sign(t, "RS256", "rsa-1", nil, ciClaims())
			parts := strings.Split(tok, ".")
			other := strings.Split(sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"repository_owner": "umbrella"})), ".")
			return parts[0] + "." + other[1] + "." + parts[2]
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedSignature},
		{name: "missing exp", token: func() string { return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"exp": nil})) },
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedTime, errHas: "token has no exp"},
		{name: "exp not a number", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"exp": "tomorrow"}))
		},
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedClaims, errHas: "exp is not a date"},
		{name: "expired", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"exp": now.Unix()}))
		},
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedTime, errHas: "token expired at 2027-03-01T12:00:00Z"},
		{name: "exp too far", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"exp": now.Add(367 * 24 * time.Hour).Unix()}))
		},
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedTime, errHas: "is more than 8784h0m0s away"},
		{name: "nbf in the future", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"nbf": now.Add(61 * time.Second).Unix()}))
		},
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedTime, errHas: "token nbf 2027-03-01T12:01:01Z is in the future"},
		{name: "iat in the future", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"iat": now.Add(time.Hour).Unix()}))
		},
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedTime, errHas: "token iat"},
		{name: "nbf not a number", token: func() string { return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"nbf": true})) },
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedClaims, errHas: "nbf is not a date"},
		{name: "wrong aud string", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"aud": "spiffe://other.org"}))
		},
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedAudience, errHas: "none of the issuer's audiences"},
		{name: "wrong aud array", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"aud": []string{"a", "b"}}))
		},
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedAudience},
		{name: "missing aud", token: func() string { return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"aud": nil})) },
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedClaims, errHas: "token aud is null"},
		{name: "aud array with a number", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"aud": []any{testAudience, 1}}))
		},
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedClaims},
		{name: "claim rule refuses", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"repository_owner": "evil"}))
		},
			wantErr: authn.ErrPermissionDenied, result: resultRefusedRules, errHas: `claim "repository_owner" is "evil"`},
		{name: "template refuses", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"workflow": "../../admin"}))
		},
			wantErr: authn.ErrPermissionDenied, result: resultRefusedTemplate, errHas: `spiffeID: claim "workflow"`},
		{name: "template claim missing", token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"workflow": nil}))
		},
			wantErr: authn.ErrPermissionDenied, result: resultRefusedTemplate, errHas: `claim "workflow" is missing`},

		{name: "kubernetes identity built", issuer: kubeIssuerName, token: func() string { return sign(t, "RS256", "rsa-1", nil, kubeClaims("prod", "web.api")) },
			wantID: "spiffe://example.org/ns/prod/sa/web.api", result: resultAccepted},
		{name: "kubernetes sub and kubernetes.io disagree", issuer: kubeIssuerName, token: func() string {
			c := kubeClaims("prod", "web")
			c["sub"] = "system:serviceaccount:prod:admin"
			return sign(t, "RS256", "rsa-1", nil, c)
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedSubject, errHas: "does not name the subject's service account prod/admin"},
		{name: "kubernetes namespace mismatch", issuer: kubeIssuerName, token: func() string {
			c := kubeClaims("prod", "web")
			c["kubernetes.io"].(map[string]any)["namespace"] = "dev"
			return sign(t, "RS256", "rsa-1", nil, c)
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedSubject},
		{name: "kubernetes no kubernetes.io claim", issuer: kubeIssuerName, token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(kubeClaims("prod", "web"), map[string]any{"kubernetes.io": nil}))
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedSubject},
		{name: "kubernetes bad namespace", issuer: kubeIssuerName, token: func() string { return sign(t, "RS256", "rsa-1", nil, kubeClaims("Prod_1", "web")) },
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedSubject, errHas: `namespace "Prod_1"`},
		{name: "kubernetes bad name", issuer: kubeIssuerName, token: func() string { return sign(t, "RS256", "rsa-1", nil, kubeClaims("prod", "../x")) },
			wantErr: authn.ErrInvalidCredentials, result: resultRefusedSubject, errHas: "service account name"},
		{name: "kubernetes sub not a service account", issuer: kubeIssuerName, token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(kubeClaims("prod", "web"), map[string]any{"sub": "alice"}))
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedSubject, errHas: "is not system:serviceaccount:<namespace>:<name>"},
		{name: "kubernetes wrong aud", issuer: kubeIssuerName, token: func() string {
			return sign(t, "RS256", "rsa-1", nil, with(kubeClaims("prod", "web"), map[string]any{"aud": []string{"https://kubernetes.default.svc"}}))
		}, wantErr: authn.ErrInvalidCredentials, result: resultRefusedAudience},
		{name: "kubernetes claim rule", issuer: kubeIssuerName, token: func() string { return sign(t, "RS256", "rsa-1", nil, kubeClaims("dev", "web")) },
			wantErr: authn.ErrPermissionDenied, result: resultRefusedRules, errHas: `claim "kubernetes.io.namespace" is "dev"`},
	}
	kube := kubeIssuer()
	kube.Claims = []ClaimRule{{Claim: "kubernetes.io.namespace", Values: []string{"prod"}}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t, oidcIssuer(), kube)
			name := testIssuerName
			if tt.issuer != "" {
				name = tt.issuer
			}
			token := tt.token()
			ident, err := f.a.Authenticate(context.Background(), bearer(token))
			assert.Equal(t, 1.0, f.count(name, tt.result), "result %s", tt.result)
			if tt.wantErr == nil {
				require.NoError(t, err)
				assert.Equal(t, tt.wantID, ident.ID.String())
				return
			}
			require.Error(t, err)
			assert.ErrorIs(t, err, tt.wantErr)
			assert.NotErrorIs(t, err, authn.ErrNoCredentials)
			assert.True(t, ident.ID.IsZero())
			assert.True(t, strings.HasPrefix(err.Error(), "authn: oidc: issuer "+name+": "), err.Error())
			assert.Contains(t, err.Error(), tt.errHas)
			assertNoTokenBytes(t, err, token)
		})
	}
}

// TestAuthenticateAmbiguousClaims: a claim path with two resolutions in
// the token is refused wherever it is read, so a rule and the identity
// can never read different values of one claim.
func TestAuthenticateAmbiguousClaims(t *testing.T) {
	kube := kubeIssuer()
	kube.Claims = []ClaimRule{{Claim: "kubernetes.io.namespace", Values: []string{"prod"}}}
	ci := oidcIssuer()
	ci.Claims = append(ci.Claims, ClaimRule{Claim: "org.id", Values: []string{"1"}})
	ci.SPIFFEID = "spiffe://{{.TrustDomain}}/ci/{{.Claims.team.name}}"
	ciGood := with(ciClaims(), map[string]any{"org": map[string]any{"id": 1}, "team": map[string]any{"name": "payments"}})
	// The rule reads the flat key "prod" first by the old longest-key
	// order, while the ID was made of the nested "dev".
	devAsProd := with(kubeClaims("dev", "web"), map[string]any{"kubernetes.io.namespace": "prod"})
	tests := []struct {
		name, issuer string
		rules        bool
		claims       map[string]any
		result       string
		errHas       string
	}{
		{name: "flat prod beside nested dev", issuer: kubeIssuerName, rules: true, claims: devAsProd, result: resultRefusedSubject,
			errHas: `token claim "kubernetes.io.namespace" is ambiguous`},
		{name: "flat prod beside nested dev, no rules", issuer: kubeIssuerName, claims: devAsProd, result: resultRefusedSubject,
			errHas: `token claim "kubernetes.io.namespace" is ambiguous`},
		{name: "service account name twice", issuer: kubeIssuerName, rules: true,
			claims: with(kubeClaims("prod", "web"), map[string]any{"kubernetes.io.serviceaccount.name": "web"}), result: resultRefusedSubject,
			errHas: `token claim "kubernetes.io.serviceaccount.name" is ambiguous`},
		{name: "rule claim twice", issuer: testIssuerName, rules: true, claims: with(ciGood, map[string]any{"org.id": "1"}), result: resultRefusedRules,
			errHas: `claim rule: claim "org.id" is ambiguous`},
		{name: "template claim twice", issuer: testIssuerName, rules: true, claims: with(ciGood, map[string]any{"team.name": "ops"}), result: resultRefusedTemplate,
			errHas: `spiffeID: claim "team.name" is ambiguous`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := kube
			if !tt.rules {
				k = kubeIssuer()
			}
			f := newFixture(t, ci, k)
			ident, err := f.a.Authenticate(context.Background(), bearer(sign(t, "RS256", "rsa-1", nil, tt.claims)))
			require.Error(t, err)
			assert.True(t, ident.ID.IsZero())
			assert.ErrorIs(t, err, authn.ErrPermissionDenied)
			assert.NotErrorIs(t, err, authn.ErrInvalidCredentials)
			assert.Contains(t, err.Error(), "authn: oidc: issuer "+tt.issuer+": "+tt.errHas)
			assert.Equal(t, 1.0, f.count(tt.issuer, tt.result))
		})
	}

	// Without the ambiguity the same issuers accept.
	f := newFixture(t, ci, kube)
	ident, err := f.a.Authenticate(context.Background(), bearer(sign(t, "RS256", "rsa-1", nil, ciGood)))
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/ci/payments", ident.ID.String())
	_, err = f.a.Authenticate(context.Background(), bearer(sign(t, "RS256", "rsa-1", nil, kubeClaims("dev", "web"))))
	require.ErrorIs(t, err, authn.ErrPermissionDenied, "the rule still refuses dev")
}

// assertNoTokenBytes checks that no part of token is in err's message.
func assertNoTokenBytes(t *testing.T, err error, token string) {
	t.Helper()
	if token == "" {
		return
	}
	assert.NotContains(t, err.Error(), token)
	for _, part := range strings.Split(token, ".") {
		if len(part) >= 8 {
			assert.NotContains(t, err.Error(), part)
		}
	}
}

func TestAuthenticateIdentity(t *testing.T) {
	f := newFixture(t)
	claims := with(ciClaims(), map[string]any{"exp": testNow.Add(90 * time.Second).Unix()})
	ident, err := f.a.Authenticate(context.Background(), bearer(sign(t, "RS256", "rsa-1", nil, claims)))
	require.NoError(t, err)
	assert.Equal(t, authn.Identity{
		ID: spiffeid.RequireFromString("spiffe://example.org/ci/acme/build"), Method: authn.MethodOIDC,
		Grant: &authn.Grant{Method: authn.MethodOIDC, Ref: testIssuerName, UID: authn.IssuerGrantUID(testIssuerURL)}, NotAfter: testNow.Add(90 * time.Second),
	}, ident)

	ident, err = f.a.Authenticate(context.Background(), bearer(sign(t, "ES256", "ec-1", nil, kubeClaims("prod", "web"))))
	require.NoError(t, err)
	assert.Equal(t, authn.MethodKubernetesIssuer, ident.Method)
	assert.Equal(t, &authn.Grant{Method: authn.MethodKubernetesIssuer, Ref: kubeIssuerName, UID: authn.IssuerGrantUID(kubeIssuerURL)}, ident.Grant)
	assert.Equal(t, testNow.Add(time.Hour), ident.NotAfter)
}

// TestAuthenticateNoCredentials: what is not a token of a configured
// issuer is left to the next authenticator, without any key work.
func TestAuthenticateNoCredentials(t *testing.T) {
	otherIss := sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"iss": "https://elsewhere.test"}))
	trailingSlash := sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"iss": testIssuerURL + "/"}))
	tests := []struct {
		name string
		r    authn.Request
	}{
		{"no token", authn.Request{}},
		{"authorization error", authn.Request{AuthorizationError: errors.New("scheme Basic")}},
		{"opaque token", bearer("tb-0123456789abcdef0123456789")},
		{"two parts", bearer("abc.def")},
		{"payload not base64", bearer("eyJhbGciOiJSUzI1NiJ9.!!!.sig")},
		{"no iss", bearer(sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"iss": nil})))},
		{"iss not a string", bearer(sign(t, "RS256", "rsa-1", nil, with(ciClaims(), map[string]any{"iss": 7})))},
		{"unconfigured iss", bearer(otherIss)},
		{"iss differs by a trailing slash", bearer(trailingSlash)},
		{"payload with data after the object", bearer(sign(t, "RS256", "rsa-1", nil, `{"iss":"`+testIssuerURL+`"} []`))},
		{"oversized", bearer(strings.Repeat("a", authn.MaxTokenSize+1))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFixture(t)
			_, err := f.a.Authenticate(context.Background(), tt.r)
			require.Error(t, err)
			assert.ErrorIs(t, err, authn.ErrNoCredentials)
			assert.NotErrorIs(t, err, authn.ErrInvalidCredentials)
			assert.True(t, strings.HasPrefix(err.Error(), "authn: oidc: "))
			assertNoTokenBytes(t, err, tt.r.BearerToken)
			assert.Zero(t, f.keys[testIssuerName].calls+f.keys[kubeIssuerName].calls, "no key work")
			assert.Zero(t, testutil.CollectAndCount(f.a.tokens)-2*len(allResults()), "no new series")
			for _, r := range allResults() {
				assert.Zero(t, f.count(testIssuerName, r), r)
			}
		})
	}
}

// TestAuthenticateAlgBeforeKeys: a token with an algorithm the issuer may
// not use costs no key work.
func TestAuthenticateAlgBeforeKeys(t *testing.T) {
	f := newFixture(t)
	for _, tok := range []string{
		unsigned(`{"alg":"none"}`, string(payloadBytes(t, ciClaims())), nil),
		unsigned(`{"alg":"HS256","kid":"rsa-1"}`, string(payloadBytes(t, ciClaims())), []byte("sig")),
		unsigned(`{"alg":"RS256","crit":["x"]}`, string(payloadBytes(t, ciClaims())), []byte("sig")),
		unsigned(`[]`, string(payloadBytes(t, ciClaims())), []byte("sig")),
	} {
		_, err := f.a.Authenticate(context.Background(), bearer(tok))
		require.ErrorIs(t, err, authn.ErrInvalidCredentials)
	}
	assert.Zero(t, f.keys[testIssuerName].calls)
	assert.Equal(t, 2.0, f.count(testIssuerName, resultRefusedAlg))
	assert.Equal(t, 2.0, f.count(testIssuerName, resultRefusedClaims))
}

func TestAuthenticateKeysUnavailable(t *testing.T) {
	f := newFixture(t)
	f.keys[testIssuerName].err = fmt.Errorf("jwks: status 503: %w", ErrKeysUnavailable)
	token := sign(t, "RS256", "rsa-1", nil, ciClaims())
	_, err := f.a.Authenticate(context.Background(), bearer(token))
	require.ErrorIs(t, err, authn.ErrUnavailable)
	assert.NotErrorIs(t, err, authn.ErrInvalidCredentials)
	assert.Contains(t, err.Error(), "authn: oidc: issuer ci: issuer keys: jwks: status 503")
	assert.Equal(t, 1.0, f.count(testIssuerName, resultUnavailable))
	assertNoTokenBytes(t, err, token)
	st := f.a.Status()
	require.Len(t, st, 2)
	assert.Contains(t, st[0].LastError, "status 503")

	// Back: the same token is accepted.
	f.keys[testIssuerName].err = nil
	_, err = f.a.Authenticate(context.Background(), bearer(token))
	require.NoError(t, err)
	assert.Equal(t, 1.0, f.count(testIssuerName, resultAccepted))
}

func TestCheckGrant(t *testing.T) {
	f := newFixture(t)
	id := spiffeid.RequireFromString("spiffe://example.org/ci/acme/build")
	ciUID, kubeUID := authn.IssuerGrantUID(testIssuerURL), authn.IssuerGrantUID(kubeIssuerURL)
	tests := []struct {
		name   string
		g      authn.Grant
		errHas string
	}{
		{"oidc issuer present", authn.Grant{Method: authn.MethodOIDC, Ref: testIssuerName, UID: ciUID}, ""},
		{"kubernetes issuer present", authn.Grant{Method: authn.MethodKubernetesIssuer, Ref: kubeIssuerName, UID: kubeUID}, ""},
		{"issuer removed", authn.Grant{Method: authn.MethodOIDC, Ref: "gone", UID: ciUID}, `issuer "gone" that granted it is no longer configured`},
		{"kind changed to kubernetes", authn.Grant{Method: authn.MethodOIDC, Ref: kubeIssuerName, UID: kubeUID}, "is now of kind kubernetes, not oidc"},
		{"kind changed to oidc", authn.Grant{Method: authn.MethodKubernetesIssuer, Ref: testIssuerName, UID: ciUID}, "is now of kind oidc, not kubernetes"},
		{"not an issuer grant", authn.Grant{Method: authn.MethodBootstrapToken, Ref: testIssuerName}, "is not an issuer grant"},
		{"name now points at another URL", authn.Grant{Method: authn.MethodOIDC, Ref: testIssuerName, UID: authn.IssuerGrantUID("https://old.test")},
			`issuer "ci" now has issuer URL https://issuer.test/tenant, not the one that granted it`},
		{"kubernetes name now points at another URL", authn.Grant{Method: authn.MethodKubernetesIssuer, Ref: kubeIssuerName, UID: ciUID},
			`issuer "west" now has issuer URL https://kube.test, not the one that granted it`},
		{"grant without uid", authn.Grant{Method: authn.MethodOIDC, Ref: testIssuerName}, "not the one that granted it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := tt.g
			g.GrantedAt = testNow // as the certificate service records it
			err := f.a.CheckGrant(context.Background(), id, g)
			if tt.errHas == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, authn.ErrGrantRevoked)
			assert.Contains(t, err.Error(), tt.errHas)
		})
	}
	var _ authn.GrantChecker = f.a
	var _ authn.Authenticator = f.a

	// The grants Authenticate makes stand, for both kinds.
	for _, token := range []string{sign(t, "RS256", "rsa-1", nil, ciClaims()), sign(t, "RS256", "rsa-1", nil, kubeClaims("prod", "web"))} {
		ident, err := f.a.Authenticate(context.Background(), bearer(token))
		require.NoError(t, err)
		g := *ident.Grant
		g.GrantedAt = testNow
		require.NoError(t, f.a.CheckGrant(context.Background(), ident.ID, g))
	}
}

// TestCheckGrantMaxRenewalLifetime: a renewal chain of an issuer's token
// ends after the issuer's maxRenewalLifetime, by the injected clock, so
// it goes back to a fresh token whose claims are checked again.
func TestCheckGrantMaxRenewalLifetime(t *testing.T) {
	ci := oidcIssuer()
	ci.MaxRenewalLifetime = 2 * time.Hour
	f := newFixture(t, ci, kubeIssuer())
	id := spiffeid.RequireFromString("spiffe://example.org/ci/acme/build")
	ciGrant := authn.Grant{Method: authn.MethodOIDC, Ref: testIssuerName, UID: authn.IssuerGrantUID(testIssuerURL), GrantedAt: testNow}
	kubeGrant := authn.Grant{Method: authn.MethodKubernetesIssuer, Ref: kubeIssuerName, UID: authn.IssuerGrantUID(kubeIssuerURL), GrantedAt: testNow}
	check := func(g authn.Grant) error { return f.a.CheckGrant(context.Background(), id, g) }

	f.clk.SetTime(testNow.Add(2 * time.Hour))
	require.NoError(t, check(ciGrant), "exactly the lifetime still stands")
	f.clk.SetTime(testNow.Add(2*time.Hour + time.Second))
	err := check(ciGrant)
	require.ErrorIs(t, err, authn.ErrGrantExpired)
	assert.NotErrorIs(t, err, authn.ErrGrantRevoked)
	assert.Contains(t, err.Error(), `authn: oidc: spiffe://example.org/ci/acme/build: granted at 2027-03-01T12:00:00Z by issuer "ci", longer ago than its maxRenewalLifetime of 2h0m0s`)
	assert.Contains(t, err.Error(), "cannot be re-checked offline")
	require.NoError(t, check(kubeGrant), "the other issuer has the default")

	f.clk.SetTime(testNow.Add(DefaultMaxRenewalLifetime))
	require.NoError(t, check(kubeGrant))
	f.clk.SetTime(testNow.Add(DefaultMaxRenewalLifetime + time.Second))
	err = check(kubeGrant)
	require.ErrorIs(t, err, authn.ErrGrantExpired)
	assert.Contains(t, err.Error(), `by issuer "west", longer ago than its maxRenewalLifetime of 24h0m0s`)

	// A chain granted later is younger.
	kubeGrant.GrantedAt = testNow.Add(time.Hour)
	require.NoError(t, check(kubeGrant))
}

func TestNewRefuses(t *testing.T) {
	dupName := oidcIssuer()
	dupName.Issuer = "https://other.test"
	dupIss := kubeIssuer()
	dupIss.Name = "other"
	dupIss.Issuer = testIssuerURL
	otherTD := oidcIssuer()
	otherTD.SPIFFEID = "spiffe://other.org/ci/{{.Claims.workflow}}"
	badTmpl := oidcIssuer()
	badTmpl.SPIFFEID = "spiffe://{{.TrustDomain}}/{{.Foo}}"
	noAud := kubeIssuer()
	noAud.Audiences = nil
	tests := []struct {
		name   string
		cfg    Config
		errHas string
	}{
		{"no trust domain", Config{Issuers: []IssuerConfig{oidcIssuer()}}, "trust domain is required"},
		{"negative refresh", Config{TrustDomain: testTD, RefreshInterval: -time.Second}, "is negative"},
		{"duplicate name", Config{TrustDomain: testTD, Issuers: []IssuerConfig{oidcIssuer(), dupName}}, `issuer 1 ("ci"): name "ci" is used by two issuers`},
		{"duplicate issuer", Config{TrustDomain: testTD, Issuers: []IssuerConfig{oidcIssuer(), dupIss}}, `issuer "https://issuer.test/tenant" is configured twice`},
		{"template of another trust domain", Config{TrustDomain: testTD, Issuers: []IssuerConfig{otherTD}}, `template names trust domain "other.org"`},
		{"bad template", Config{TrustDomain: testTD, Issuers: []IssuerConfig{badTmpl}}, "{{.Foo}} is not"},
		{"bad issuer", Config{TrustDomain: testTD, Issuers: []IssuerConfig{noAud}}, "audiences: must list 1 to 16"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.newKeys = func(IssuerConfig) (keySource, error) { return &fakeKeys{}, nil }
			_, err := New(tt.cfg)
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), "authn: oidc: "), err.Error())
			assert.Contains(t, err.Error(), tt.errHas)
		})
	}

	_, err := New(Config{TrustDomain: testTD, Issuers: []IssuerConfig{oidcIssuer()},
		newKeys: func(IssuerConfig) (keySource, error) { return nil, errors.New("no roots") }})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `issuer 0 ("ci"): keys: no roots`)
}

// TestNewCopiesConfig: changing the caller's slices later changes
// nothing.
func TestNewCopiesConfig(t *testing.T) {
	ic := oidcIssuer()
	f := newFixture(t, ic)
	ic.Audiences[0] = "changed"
	ic.Claims[0].Values[0] = "evil"
	_, err := f.a.Authenticate(context.Background(), bearer(sign(t, "RS256", "rsa-1", nil, ciClaims())))
	require.NoError(t, err)
}

func TestIssuersAndStatus(t *testing.T) {
	f := newFixture(t)
	assert.Equal(t, []string{testIssuerURL, kubeIssuerURL}, f.a.Issuers())
	assert.Equal(t, []IssuerStatus{
		{Name: testIssuerName, Issuer: testIssuerURL, Kind: KindOIDC, Keys: 3, LastFetch: testNow, LastSuccess: testNow},
		{Name: kubeIssuerName, Issuer: kubeIssuerURL, Kind: KindKubernetes, Keys: 3, LastFetch: testNow, LastSuccess: testNow},
	}, f.a.Status())
}

func TestRunWarmsUpKeys(t *testing.T) {
	var logs bytes.Buffer
	f := &fixture{keys: map[string]*fakeKeys{}}
	a, err := New(Config{
		TrustDomain: testTD, Issuers: []IssuerConfig{oidcIssuer(), kubeIssuer()},
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		newKeys: func(ic IssuerConfig) (keySource, error) {
			k := &fakeKeys{keys: publicKeys()}
			if ic.Name == kubeIssuerName {
				k.err = fmt.Errorf("discovery: %w", ErrKeysUnavailable)
			}
			f.keys[ic.Name] = k
			return k, nil
		},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		f.keys[testIssuerName].mu.Lock()
		defer f.keys[testIssuerName].mu.Unlock()
		f.keys[kubeIssuerName].mu.Lock()
		defer f.keys[kubeIssuerName].mu.Unlock()
		assert.Equal(c, 1, f.keys[testIssuerName].calls)
		assert.Equal(c, 1, f.keys[kubeIssuerName].calls)
	}, 5*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	out := logs.String()
	assert.NotContains(t, out, `msg="issuer keys fetched"`, "the key set logs a fetch, not the warm-up (TestWarmUpLogsFetchOnce)")
	assert.Contains(t, out, `level=DEBUG msg="issuer key warm-up failed; keys are fetched again on first use" issuer=west`)
}

func TestMetricsRegistered(t *testing.T) {
	f := newFixture(t)
	n, err := testutil.GatherAndCount(f.reg, "trustbridge_authn_oidc_tokens_total")
	require.NoError(t, err)
	assert.Equal(t, 2*len(allResults()), n, "every issuer's results are present from the start")

	// A second Authenticator on the same registry is a configuration
	// error, not a panic.
	_, err = New(Config{TrustDomain: testTD, Registerer: f.reg, newKeys: func(IssuerConfig) (keySource, error) { return &fakeKeys{}, nil }})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "metrics:")
}

// GrantNotAfter is when the certificates of an issuer grant end: its
// issuer's maxRenewalLifetime after the token. A grant no configured
// issuer made has no bound here (CheckGrant refuses it).
func TestGrantNotAfter(t *testing.T) {
	ci := oidcIssuer()
	ci.MaxRenewalLifetime = 2 * time.Hour
	f := newFixture(t, ci, kubeIssuer())
	ciGrant := authn.Grant{Method: authn.MethodOIDC, Ref: testIssuerName, UID: authn.IssuerGrantUID(testIssuerURL), GrantedAt: testNow}
	end, ok := f.a.GrantNotAfter(ciGrant)
	require.True(t, ok)
	assert.Equal(t, testNow.Add(2*time.Hour), end)
	kubeGrant := authn.Grant{Method: authn.MethodKubernetesIssuer, Ref: kubeIssuerName, UID: authn.IssuerGrantUID(kubeIssuerURL), GrantedAt: testNow}
	end, ok = f.a.GrantNotAfter(kubeGrant)
	require.True(t, ok)
	assert.Equal(t, testNow.Add(DefaultMaxRenewalLifetime), end)

	for name, g := range map[string]authn.Grant{
		"unknown issuer":      {Method: authn.MethodOIDC, Ref: "gone", UID: ciGrant.UID, GrantedAt: testNow},
		"another method":      {Method: authn.MethodKubernetesIssuer, Ref: testIssuerName, UID: ciGrant.UID, GrantedAt: testNow},
		"another issuer URL":  {Method: authn.MethodOIDC, Ref: testIssuerName, UID: authn.IssuerGrantUID("https://old.test"), GrantedAt: testNow},
		"not yet granted":     {Method: authn.MethodOIDC, Ref: testIssuerName, UID: ciGrant.UID},
		"not an issuer grant": {Method: authn.MethodBootstrapToken, Ref: testIssuerName, GrantedAt: testNow},
	} {
		_, ok := f.a.GrantNotAfter(g)
		assert.False(t, ok, name)
	}
}
