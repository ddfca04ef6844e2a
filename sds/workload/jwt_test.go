package workload

import (
	"context"
	"crypto"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	workloadpb "github.com/spiffe/go-spiffe/v2/proto/spiffe/workload"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	spiffejwt "github.com/spiffe/go-spiffe/v2/svid/jwtsvid"
	"github.com/spiffe/go-spiffe/v2/workloadapi"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/trustbridge/trustbridge/internal/jwtsvid"
)

func jwtWorld(t *testing.T, minter JWTMinter) (*world, string) {
	t.Helper()
	w := newWorld(t)
	cell := NewCell()
	require.NoError(t, cell.Set(State{SVID: w.svid(t), Bundles: []*spiffebundle.Bundle{w.bundleA(t), w.bundleB(t)}}))
	if minter == nil {
		minter = signer{w.jwtA, kidA, web}
	}
	addr, _ := serve(t, Config{Source: cell, JWT: minter})
	return w, addr
}

func TestJWTSourceFetchAndValidate(t *testing.T) {
	w, addr := jwtWorld(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	src, err := workloadapi.NewJWTSource(ctx, clientOpts(addr))
	require.NoError(t, err)
	defer src.Close()

	svid, err := src.FetchJWTSVID(ctx, spiffejwt.Params{Audience: "https://api.b.test", ExtraAudiences: []string{"other"}})
	require.NoError(t, err)
	assert.Equal(t, web, svid.ID)
	assert.ElementsMatch(t, []string{"https://api.b.test", "other"}, svid.Audience)
	// The JWT bundles the source got validate it, as a peer would.
	_, err = spiffejwt.ParseAndValidate(svid.Marshal(), src, []string{"https://api.b.test"})
	require.NoError(t, err)
	_, err = src.GetJWTBundleForTrustDomain(tdB)
	require.NoError(t, err, "the federated trust domain's JWT bundle")

	c, err := workloadapi.New(ctx, workloadapi.WithAddr(addr))
	require.NoError(t, err)
	defer c.Close()
	validated, err := c.ValidateJWTSVID(ctx, svid.Marshal(), "other")
	require.NoError(t, err)
	assert.Equal(t, web, validated.ID)

	resp, err := rawClient(t, addr).ValidateJWTSVID(withHeader(ctx), &workloadpb.ValidateJWTSVIDRequest{Audience: "other", Svid: svid.Marshal()})
	require.NoError(t, err)
	assert.Equal(t, web.String(), resp.GetSpiffeId())
	assert.Equal(t, web.String(), resp.GetClaims().GetFields()["sub"].GetStringValue())
	assert.NotNil(t, resp.GetClaims().GetFields()["exp"])
	_ = w
}

func TestValidateJWTSVIDRefuses(t *testing.T) {
	w, addr := jwtWorld(t, nil)
	client := rawClient(t, addr)
	ctx, cancel := context.WithTimeout(withHeader(context.Background()), waitFor)
	defer cancel()
	now := time.Now()
	peer := spiffeid.RequireFromString("spiffe://b.test/api")
	outsider := spiffeid.RequireFromString("spiffe://c.test/x")
	mint := func(key crypto.Signer, kid string, sub spiffeid.ID, aud string, iat, exp time.Time) string {
		tok, err := jwtsvid.Mint(key, kid, jwtsvid.Claims{Subject: sub, Audience: []string{aud}, IssuedAt: iat, Expiry: exp})
		require.NoError(t, err)
		return tok
	}
	good := mint(w.jwtA, kidA, web, "svc", now, now.Add(time.Minute))

	tests := []struct {
		name  string
		token string
		aud   string
		ok    bool
	}{
		{"own trust domain", good, "svc", true},
		{"federated trust domain, its own key", mint(w.jwtB, kidB, peer, "svc", now, now.Add(time.Minute)), "svc", true},
		{"wrong audience", good, "not-svc", false},
		{"alg none", unsigned(t, web, "svc", kidA), "svc", false},
		{"HMAC", hmacToken(t, web, "svc", kidA), "svc", false},
		{"unknown kid", mint(w.jwtA, "kid-unknown", web, "svc", now, now.Add(time.Minute)), "svc", false},
		{"expired", mint(w.jwtA, kidA, web, "svc", now.Add(-time.Hour), now.Add(-30*time.Minute)), "svc", false},
		{"not yet valid", notYetValid(t, w, now), "svc", false},
		// a.test's key does not vouch for b.test's identities, even with
		// a kid a.test's bundle knows.
		{"other trust domain's key", mint(w.jwtA, kidA, peer, "svc", now, now.Add(time.Minute)), "svc", false},
		{"trust domain without a bundle", mint(w.jwtA, kidA, outsider, "svc", now, now.Add(time.Minute)), "svc", false},
		{"garbage", "not.a.jwt", "svc", false},
		{"no audience", good, "", false},
		{"no token", "", "svc", false},
		{"control character in the audience", mint(w.jwtA, kidA, web, "svc\x00x", now, now.Add(time.Minute)), "svc\x00x", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := client.ValidateJWTSVID(ctx, &workloadpb.ValidateJWTSVIDRequest{Audience: tt.aud, Svid: tt.token})
			if tt.ok {
				require.NoError(t, err)
				assert.NotEmpty(t, resp.GetSpiffeId())
				return
			}
			assert.Equal(t, codes.InvalidArgument, status.Code(err), "%v", err)
		})
	}
}

// notYetValid is a token whose nbf is an hour ahead.
func notYetValid(t *testing.T, w *world, now time.Time) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.ES256, Key: w.jwtA},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kidA))
	require.NoError(t, err)
	tok, err := jwt.Signed(s).Claims(jwt.Claims{
		Subject: web.String(), Audience: jwt.Audience{"svc"},
		NotBefore: jwt.NewNumericDate(now.Add(time.Hour)), Expiry: jwt.NewNumericDate(now.Add(2 * time.Hour)),
	}).Serialize()
	require.NoError(t, err)
	return tok
}

// unsigned is a token with alg none.
func unsigned(t *testing.T, sub spiffeid.ID, aud, kid string) string {
	t.Helper()
	enc := base64.RawURLEncoding.EncodeToString
	header := enc([]byte(`{"alg":"none","typ":"JWT","kid":"` + kid + `"}`))
	exp := time.Now().Add(time.Minute).Unix()
	payload := enc(fmt.Appendf(nil, `{"sub":%q,"aud":[%q],"exp":%d}`, sub.String(), aud, exp))
	return header + "." + payload + "."
}

// hmacToken is a token signed HS256 with the kid of a real key: a
// validator that took the public key as the HMAC secret would accept it.
func hmacToken(t *testing.T, sub spiffeid.ID, aud, kid string) string {
	t.Helper()
	s, err := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte("0123456789abcdef0123456789abcdef")},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	require.NoError(t, err)
	tok, err := jwt.Signed(s).Claims(jwt.Claims{Subject: sub.String(), Audience: jwt.Audience{aud}, Expiry: jwt.NewNumericDate(time.Now().Add(time.Minute))}).Serialize()
	require.NoError(t, err)
	return tok
}

func TestFetchJWTSVIDRefuses(t *testing.T) {
	_, addr := jwtWorld(t, nil)
	client := rawClient(t, addr)
	ctx, cancel := context.WithTimeout(withHeader(context.Background()), waitFor)
	defer cancel()
	long := strings.Repeat("x", maxAudienceSize+1)
	tests := []struct {
		name string
		req  *workloadpb.JWTSVIDRequest
		code codes.Code
	}{
		{"no audience", &workloadpb.JWTSVIDRequest{}, codes.InvalidArgument},
		{"empty audience", &workloadpb.JWTSVIDRequest{Audience: []string{""}}, codes.InvalidArgument},
		{"audience too long", &workloadpb.JWTSVIDRequest{Audience: []string{long}}, codes.InvalidArgument},
		{"too many audiences", &workloadpb.JWTSVIDRequest{Audience: make([]string, maxAudiences+1)}, codes.InvalidArgument},
		{"NUL in an audience", &workloadpb.JWTSVIDRequest{Audience: []string{"svc", "a\x00b"}}, codes.InvalidArgument},
		{"newline in an audience", &workloadpb.JWTSVIDRequest{Audience: []string{"svc\n"}}, codes.InvalidArgument},
		{"DEL in an audience", &workloadpb.JWTSVIDRequest{Audience: []string{"svc\x7f"}}, codes.InvalidArgument},
		{"C1 control in an audience", &workloadpb.JWTSVIDRequest{Audience: []string{"svc\u0085"}}, codes.InvalidArgument},
		{"another identity", &workloadpb.JWTSVIDRequest{Audience: []string{"svc"}, SpiffeId: "spiffe://a.test/ns/default/sa/db"}, codes.PermissionDenied},
		{"not a SPIFFE ID", &workloadpb.JWTSVIDRequest{Audience: []string{"svc"}, SpiffeId: "https://a.test/x"}, codes.InvalidArgument},
		{"the held identity", &workloadpb.JWTSVIDRequest{Audience: []string{"svc"}, SpiffeId: web.String()}, codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, err := client.FetchJWTSVID(ctx, tt.req)
			assert.Equal(t, tt.code, status.Code(err), "%v", err)
			if tt.code == codes.OK {
				require.Len(t, resp.GetSvids(), 1)
				assert.Equal(t, web.String(), resp.GetSvids()[0].GetSpiffeId())
			}
		})
	}
}

type minterFunc func(context.Context, []string) (string, error)

func (f minterFunc) MintJWTSVID(ctx context.Context, aud []string) (string, error) {
	return f(ctx, aud)
}

func TestFetchJWTSVIDMinterFailures(t *testing.T) {
	w := newWorld(t)
	other := spiffeid.RequireFromString("spiffe://a.test/ns/default/sa/db")
	tests := []struct {
		name   string
		minter JWTMinter
		code   codes.Code
		msg    string
	}{
		{"no minter", nil, codes.Unavailable, "credential files"},
		{"upstream unreachable", minterFunc(func(context.Context, []string) (string, error) {
			return "", status.Error(codes.Unavailable, "connection refused")
		}), codes.Unavailable, "connection refused"},
		{"upstream refused the client", minterFunc(func(context.Context, []string) (string, error) {
			return "", status.Error(codes.Unauthenticated, "bad certificate")
		}), codes.Unavailable, "Unauthenticated"},
		{"token for another identity", signer{w.jwtA, kidA, other}, codes.Internal, "not " + web.String()},
		{"token for one audience more", minterFunc(func(ctx context.Context, aud []string) (string, error) {
			return signer{w.jwtA, kidA, web}.MintJWTSVID(ctx, append(aud, "elsewhere"))
		}), codes.Internal, "not the requested"},
		{"token for part of the audiences", minterFunc(func(ctx context.Context, aud []string) (string, error) {
			return signer{w.jwtA, kidA, web}.MintJWTSVID(ctx, aud[:1])
		}), codes.Internal, "not the requested"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cell := NewCell()
			require.NoError(t, cell.Set(State{SVID: w.svid(t), Bundles: []*spiffebundle.Bundle{w.bundleA(t)}}))
			cfg := Config{Source: cell, NoJWTReason: "the agent serves credential files and has no certificate service"}
			if tt.minter != nil {
				cfg.JWT = tt.minter
			}
			addr, _ := serve(t, cfg)
			ctx, cancel := context.WithTimeout(withHeader(context.Background()), waitFor)
			defer cancel()
			_, err := rawClient(t, addr).FetchJWTSVID(ctx, &workloadpb.JWTSVIDRequest{Audience: []string{"svc", "other"}})
			assert.Equal(t, tt.code, status.Code(err))
			assert.Contains(t, status.Convert(err).Message(), tt.msg)
		})
	}
}

// With the issuers of trust domains known, ValidateJWTSVID refuses a
// token of such a trust domain whose iss names another issuer, and
// accepts ours, one without iss (minted before the issuer was set) and
// any iss of a trust domain whose issuer is unknown.
func TestValidateJWTSVIDChecksIssuer(t *testing.T) {
	w := newWorld(t)
	cell := NewCell()
	require.NoError(t, cell.Set(State{SVID: w.svid(t), Bundles: []*spiffebundle.Bundle{w.bundleA(t), w.bundleB(t)}}))
	const ours = "https://oidc.a.test"
	issuerOf := func(td spiffeid.TrustDomain) string {
		if td == web.TrustDomain() {
			return ours
		}
		return ""
	}
	addr, _ := serve(t, Config{Source: cell, JWT: signer{w.jwtA, kidA, web}, JWTIssuer: issuerOf})
	client := rawClient(t, addr)
	ctx, cancel := context.WithTimeout(withHeader(context.Background()), waitFor)
	defer cancel()
	now := time.Now()
	peer := spiffeid.RequireFromString("spiffe://b.test/api")
	mint := func(key crypto.Signer, kid string, sub spiffeid.ID, iss string) string {
		tok, err := jwtsvid.Mint(key, kid, jwtsvid.Claims{Issuer: iss, Subject: sub, Audience: []string{"svc"}, IssuedAt: now, Expiry: now.Add(time.Minute)})
		require.NoError(t, err)
		return tok
	}
	for _, tc := range []struct {
		name, token string
		ok          bool
	}{
		{"our issuer", mint(w.jwtA, kidA, web, ours), true},
		{"no iss", mint(w.jwtA, kidA, web, ""), true},
		{"another issuer, signed by our key", mint(w.jwtA, kidA, web, "https://evil.test"), false},
		{"a federated trust domain's own issuer", mint(w.jwtB, kidB, peer, "https://oidc.b.test"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := client.ValidateJWTSVID(ctx, &workloadpb.ValidateJWTSVIDRequest{Audience: "svc", Svid: tc.token})
			if tc.ok {
				require.NoError(t, err)
				assert.NotEmpty(t, resp.GetSpiffeId())
				return
			}
			assert.Equal(t, codes.InvalidArgument, status.Code(err))
			assert.ErrorContains(t, err, `is not a.test's issuer "https://oidc.a.test"`)
		})
	}
}
