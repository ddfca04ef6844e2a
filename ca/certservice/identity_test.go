package certservice_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509/pkix"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/time/rate"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/jwtsvid"
)

// fakeJWT signs with internal/jwtsvid.Mint and one ES256 key, as the CA
// will: default 5 minutes, clamped to an hour. err, when set, is returned
// instead; the last call's arguments are kept.
type fakeJWTSigner struct {
	key *ecdsa.PrivateKey
	clk clock.PassiveClock

	mu      sync.Mutex
	err     error
	calls   int
	lastID  spiffeid.ID
	lastAud []string
	lastTTL time.Duration
}

const testKID = "kid-1"

func newFakeJWTSigner(tb testing.TB) *fakeJWTSigner {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	return &fakeJWTSigner{key: key, clk: clock.RealClock{}}
}

func (f *fakeJWTSigner) SignJWT(id spiffeid.ID, audience []string, ttl time.Duration) (string, time.Time, error) {
	f.mu.Lock()
	f.calls++
	f.lastID, f.lastAud, f.lastTTL = id, append([]string(nil), audience...), ttl
	err := f.err
	f.mu.Unlock()
	if err != nil {
		return "", time.Time{}, err
	}
	switch {
	case ttl == 0:
		ttl = 5 * time.Minute
	case ttl > time.Hour:
		ttl = time.Hour
	}
	now := f.clk.Now().Truncate(time.Second)
	exp := now.Add(ttl)
	tok, err := jwtsvid.Mint(f.key, testKID, jwtsvid.Claims{Subject: id, Audience: audience, IssuedAt: now, Expiry: exp})
	return tok, exp, err
}

func (f *fakeJWTSigner) set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeJWTSigner) last() (spiffeid.ID, []string, time.Duration, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastID, f.lastAud, f.lastTTL, f.calls
}

// bundle is the JWT bundle that validates the signer's tokens.
func (f *fakeJWTSigner) bundle(tb testing.TB) *jwtbundle.Bundle {
	b := jwtbundle.New(td)
	require.NoError(tb, b.AddJWTAuthority(testKID, f.key.Public()))
	return b
}

// jwtFixture is a certificate service minting JWT-SVIDs with the fake
// signer; goodToken authenticates as tokenID, a client SVID as its own ID.
func jwtFixture(t *testing.T, mutate func(*certservice.Config)) (*fixture, *fakeJWTSigner) {
	t.Helper()
	signer := newFakeJWTSigner(t)
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.JWT = signer
		cfg.Authenticator = authn.Chain{authn.NewX509SVID(td, localRoots{a}, nil), fakeTokens}
		if mutate != nil {
			mutate(cfg)
		}
	})
	return f, signer
}

func TestMintJWTSVIDSubjectIsTheCaller(t *testing.T) {
	f, signer := jwtFixture(t, nil)
	for _, tc := range []struct {
		name  string
		c     identityapi.IdentityServiceClient
		want  spiffeid.ID
		mname string
	}{
		{"x509-svid", f.identityClient(t, svid(t, f.authority, workloadID), ""), workloadID, authn.MethodX509SVID},
		{"token", f.identityClient(t, nil, goodToken), tokenID, "fake-token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := &identityapi.MintJWTSVIDRequest{Audience: []string{"https://api.example.com", "other"}, TtlSeconds: 120}
			// A field this version does not know, holding another
			// identity: nothing in a request names the subject.
			req.ProtoReflect().SetUnknown(protowire.AppendString(protowire.AppendTag(nil, 9, protowire.BytesType), "spiffe://example.org/admin"))
			resp, err := tc.c.MintJWTSVID(context.Background(), req)
			require.NoError(t, err)
			assert.Equal(t, tc.want.String(), resp.GetSpiffeId())
			got, err := jwtsvid.Validate(resp.GetToken(), signer.bundle(t), []string{"other"}, nil)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got.ID)
			assert.Equal(t, got.Expiry.Unix(), resp.GetExpiresAt())
			id, aud, ttl, _ := signer.last()
			assert.Equal(t, tc.want, id)
			assert.Equal(t, []string{"https://api.example.com", "other"}, aud)
			assert.Equal(t, 2*time.Minute, ttl)
			assert.Equal(t, 1.0, testutil.ToFloat64(f.svc.JWTSVIDsForTest("OK", tc.mname)))
		})
	}
	assert.Contains(t, f.logs.String(), `"msg":"jwt-svid issued"`)
}

func TestMintJWTSVIDAudienceBounds(t *testing.T) {
	f, _ := jwtFixture(t, nil)
	c := f.identityClient(t, nil, goodToken)
	many := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = fmt.Sprint("aud-", i)
		}
		return out
	}
	for _, tc := range []struct {
		name    string
		aud     []string
		ttl     int64
		wantMsg string // "" accepted
	}{
		{"one", []string{"a"}, 0, ""},
		{"sixteen", many(certservice.MaxAudiences), 0, ""},
		{"512 bytes", []string{strings.Repeat("a", certservice.MaxAudienceBytes)}, 0, ""},
		{"none", nil, 0, "audience is required"},
		{"seventeen", many(certservice.MaxAudiences + 1), 0, "17 audiences requested; at most 16"},
		{"empty", []string{"a", ""}, 0, "audience 2 is empty"},
		{"513 bytes", []string{strings.Repeat("a", certservice.MaxAudienceBytes+1)}, 0, "audience 1 is 513 bytes; at most 512"},
		{"negative ttl", []string{"a"}, -1, "ttl_seconds -1 is negative"},
		{"NUL", []string{"a", "b\x00c"}, 0, "audience 2 holds a control character"},
		{"newline", []string{"https://api.example\nforged"}, 0, "audience 1 holds a control character"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.MintJWTSVID(context.Background(), &identityapi.MintJWTSVIDRequest{Audience: tc.aud, TtlSeconds: tc.ttl})
			if tc.wantMsg == "" {
				assert.NoError(t, err)
				return
			}
			assert.Equal(t, codes.InvalidArgument, status.Code(err))
			assert.Contains(t, status.Convert(err).Message(), tc.wantMsg)
		})
	}
}

func TestMintJWTSVIDRefusals(t *testing.T) {
	var unavailable = authn.AuthenticatorFunc(func(context.Context, authn.Request) (authn.Identity, error) {
		return authn.Identity{}, fmt.Errorf("api server down: %w", authn.ErrUnavailable)
	})
	singleUse := authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
		if r.BearerToken != bootstrapToken {
			return authn.Identity{}, authn.ErrNoCredentials
		}
		return authn.Identity{ID: bootID, Method: authn.MethodBootstrapToken, Spend: func(context.Context) error { return nil }}, nil
	})
	aud := []string{"a"}
	for _, tc := range []struct {
		name      string
		mutate    func(*certservice.Config)
		signerErr error
		token     string
		svid      bool
		want      codes.Code
		reason    string
	}{
		{name: "no credentials", want: codes.Unauthenticated, reason: "unauthenticated"},
		{name: "bad token", token: "bad-token-0123456789", want: codes.Unauthenticated, reason: "unauthenticated"},
		{name: "backend unavailable", token: goodToken, mutate: func(c *certservice.Config) { c.Authenticator = unavailable }, want: codes.Unavailable, reason: "authn_unavailable"},
		{name: "single-use bootstrap token", token: bootstrapToken, mutate: func(c *certservice.Config) { c.Authenticator = singleUse }, want: codes.Unauthenticated, reason: "token_single_use"},
		{name: "not configured", token: goodToken, mutate: func(c *certservice.Config) { c.JWT, c.Bundles = nil, staticBundles() }, want: codes.FailedPrecondition, reason: "not_configured"},
		{name: "rate limited", token: goodToken, mutate: func(c *certservice.Config) { c.RateLimit, c.RateBurst = rate.Every(time.Hour), 1 }, want: codes.ResourceExhausted, reason: "rate_limited"},
		{name: "signer: invalid claims", token: goodToken, signerErr: fmt.Errorf("ca: %w: bad", jwtsvid.ErrInvalidClaims), want: codes.InvalidArgument, reason: "invalid_claims"},
		{name: "signer: identity not allowed", token: goodToken, signerErr: fmt.Errorf("ca: %w", ca.ErrIdentityNotAllowed), want: codes.PermissionDenied, reason: "identity_not_allowed"},
		{name: "signer: no key", token: goodToken, signerErr: fmt.Errorf("ca: %w", ca.ErrInvalidSigningMaterial), want: codes.Unavailable, reason: "signing_material"},
		{name: "signer: internal", token: goodToken, signerErr: errSecret, want: codes.Internal, reason: "internal"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, signer := jwtFixture(t, tc.mutate)
			signer.set(tc.signerErr)
			c := f.identityClient(t, nil, tc.token)
			if tc.reason == "rate_limited" {
				_, err := c.MintJWTSVID(context.Background(), &identityapi.MintJWTSVIDRequest{Audience: aud})
				require.NoError(t, err, "the burst")
			}
			_, err := c.MintJWTSVID(context.Background(), &identityapi.MintJWTSVIDRequest{Audience: aud})
			require.Error(t, err)
			assert.Equal(t, tc.want, status.Code(err), status.Convert(err).Message())
			assert.NotContains(t, status.Convert(err).Message(), errSecret.Error(), "internals stay in the log")
			logs := f.logs.String()
			assert.Contains(t, logs, `"msg":"jwt-svid request refused"`)
			assert.Contains(t, logs, `"reason":"`+tc.reason+`"`)
			var total float64
			for _, m := range []string{"none", "fake-token", authn.MethodBootstrapToken} {
				total += testutil.ToFloat64(f.svc.JWTSVIDsForTest(tc.want.String(), m))
			}
			assert.Equal(t, 1.0, total, "counted once by its code")
		})
	}
}

func TestMintJWTSVIDRevokedGrant(t *testing.T) {
	// A certificate SDS minted for Envoy is no credential here, as on SDS.
	f, signer := jwtFixture(t, nil)
	marker, err := authn.Grant{Method: authn.GrantMethodSDS, GrantedAt: time.Now()}.Extension()
	require.NoError(t, err)
	key, err := ca.GenerateKey(ca.KeyECP256)
	require.NoError(t, err)
	issued, err := f.authority.SignX509SVID(ca.X509SVIDParams{PublicKey: key.Public(), SPIFFEID: workloadID, TTL: time.Hour, Extensions: []pkix.Extension{marker}})
	require.NoError(t, err)
	c := f.identityClient(t, tlsCert(issued.Leaf, key), "")
	_, err = c.MintJWTSVID(context.Background(), &identityapi.MintJWTSVIDRequest{Audience: []string{"a"}})
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	_, _, _, calls := signer.last()
	assert.Zero(t, calls, "nothing signed")
}

func TestIdentityServiceNotRegisteredWithoutConfig(t *testing.T) {
	f := newFixture(t, nil)
	_, err := f.identityClient(t, nil, goodToken).MintJWTSVID(context.Background(), &identityapi.MintJWTSVIDRequest{Audience: []string{"a"}})
	assert.Equal(t, codes.Unimplemented, status.Code(err))
}

// ttl_seconds reaches the signer as asked: 0 for its default, anything
// larger than a time.Duration holds as the largest one, for it to clamp.
func TestMintJWTSVIDLifetime(t *testing.T) {
	f, signer := jwtFixture(t, nil)
	c := f.identityClient(t, nil, goodToken)
	for _, tc := range []struct {
		seconds int64
		toSign  time.Duration
		life    time.Duration
	}{
		{0, 0, 5 * time.Minute},
		{90, 90 * time.Second, 90 * time.Second},
		{1 << 40, time.Duration(math.MaxInt64), time.Hour},
	} {
		resp, err := c.MintJWTSVID(context.Background(), &identityapi.MintJWTSVIDRequest{Audience: []string{"a"}, TtlSeconds: tc.seconds})
		require.NoError(t, err)
		_, _, ttl, _ := signer.last()
		assert.Equal(t, tc.toSign, ttl, "%d", tc.seconds)
		assert.WithinDuration(t, time.Now().Add(tc.life), time.Unix(resp.GetExpiresAt(), 0), 5*time.Second, "%d", tc.seconds)
	}
}

// A JWT-SVID never outlives the credential that bought it: the lifetime
// asked for, or the signer's default, is clamped to what the caller's
// X509-SVID or token has left, and a credential with under a second left
// buys none.
func TestMintJWTSVIDClampedToCredential(t *testing.T) {
	now := time.Unix(time.Now().Unix(), 0)
	for _, tc := range []struct {
		name     string
		tokenExp time.Time     // a JWT bearer token's exp, or zero for an X509-SVID caller
		svidLeft time.Duration // the X509-SVID's time left at the service's clock
		ttl      int64
		wantTTL  []time.Duration // what the signer was asked for, in order
		wantExp  time.Time
		wantCode codes.Code
	}{
		{name: "token: request clamped", tokenExp: now.Add(90 * time.Second), ttl: 600, wantTTL: []time.Duration{90 * time.Second}, wantExp: now.Add(90 * time.Second)},
		{name: "token: default clamped", tokenExp: now.Add(90 * time.Second), wantTTL: []time.Duration{0, 90 * time.Second}, wantExp: now.Add(90 * time.Second)},
		{name: "token: request within", tokenExp: now.Add(2 * time.Hour), ttl: 600, wantTTL: []time.Duration{10 * time.Minute}, wantExp: now.Add(10 * time.Minute)},
		{name: "token: default within", tokenExp: now.Add(2 * time.Hour), wantTTL: []time.Duration{0}, wantExp: now.Add(5 * time.Minute)},
		{name: "token: under a second left", tokenExp: now, ttl: 600, wantCode: codes.Unauthenticated},
		{name: "x509-svid: request clamped", svidLeft: 30 * time.Second, ttl: 600, wantTTL: []time.Duration{30 * time.Second}, wantExp: now.Add(30 * time.Second)},
		{name: "x509-svid: under a second left", svidLeft: 500 * time.Millisecond, ttl: 600, wantCode: codes.Unauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(now)
			var (
				mu    sync.Mutex
				asked []time.Duration
			)
			signed := func() []time.Duration {
				mu.Lock()
				defer mu.Unlock()
				return asked
			}
			signer := newFakeJWTSigner(t)
			signer.clk = clk
			f, _ := jwtFixture(t, func(cfg *certservice.Config) {
				cfg.Clock = clk
				cfg.JWT = certservice.JWTSignerFunc(func(id spiffeid.ID, aud []string, ttl time.Duration) (string, time.Time, error) {
					mu.Lock()
					asked = append(asked, ttl)
					mu.Unlock()
					return signer.SignJWT(id, aud, ttl)
				})
				cfg.Authenticator = authn.Chain{cfg.Authenticator, authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
					if strings.Count(r.BearerToken, ".") != 2 {
						return authn.Identity{}, authn.ErrNoCredentials
					}
					// What a token authenticator proves: the identity, and
					// when the token stops proving it.
					return authn.Identity{ID: tokenID, Method: authn.MethodKubernetesJWT, NotAfter: tc.tokenExp}, nil
				})}
			})
			var c identityapi.IdentityServiceClient
			if !tc.tokenExp.IsZero() {
				c = f.identityClient(t, nil, fakeJWT(tc.tokenExp))
			} else {
				cert := svid(t, f.authority, workloadID)
				clk.SetTime(cert.Leaf.NotAfter.Add(-tc.svidLeft))
				now := clk.Now()
				tc.wantExp = now.Add(tc.svidLeft).Truncate(time.Second)
				c = f.identityClient(t, cert, "")
			}
			resp, err := c.MintJWTSVID(t.Context(), &identityapi.MintJWTSVIDRequest{Audience: []string{"aud"}, TtlSeconds: tc.ttl})
			if tc.wantCode != codes.OK {
				assert.Equal(t, tc.wantCode, status.Code(err))
				assert.Contains(t, status.Convert(err).Message(), "renew it and ask again")
				assert.Empty(t, signed(), "nothing signed")
				assert.Contains(t, f.logs.String(), `"reason":"credential_expiring"`)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.wantTTL, signed())
			assert.Equal(t, tc.wantExp.Unix(), resp.GetExpiresAt())
		})
	}
}

// The clamp to the credential is reckoned when the token is signed, not
// when its request was judged: a request that waited 15 s in the signing
// queue, its token with 90 s left when it arrived, gets a token ending
// with the token, not 15 s after it.
func TestMintJWTSVIDClampedAfterQueueWait(t *testing.T) {
	now := time.Unix(time.Now().Unix(), 0)
	tokenExp := now.Add(90 * time.Second)
	clk := clocktesting.NewFakeClock(now)
	signer := newFakeJWTSigner(t)
	signer.clk = clk
	entered, release := make(chan struct{}, 1), make(chan struct{})
	f := newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		cfg.Clock = clk
		cfg.JWT = signer
		cfg.Concurrency, cfg.QueueSize = 1, 10
		cfg.Signer = heldSigner(a, entered, release)
		cfg.Authenticator = authn.Chain{authn.NewX509SVID(td, localRoots{a}, nil), authn.AuthenticatorFunc(func(_ context.Context, r authn.Request) (authn.Identity, error) {
			if strings.Count(r.BearerToken, ".") != 2 {
				return authn.Identity{}, authn.ErrNoCredentials
			}
			return authn.Identity{ID: tokenID, Method: authn.MethodKubernetesJWT, NotAfter: tokenExp}, nil
		})}
	})
	queued := make(chan struct{}, 2)
	f.svc.OnQueuedForTest(func() { queued <- struct{}{} })
	certDone := createInBackground(t, f.client(t, svid(t, f.authority, workloadID), ""))
	<-entered // the one slot is taken

	type answer struct {
		resp *identityapi.MintJWTSVIDResponse
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := f.identityClient(t, nil, fakeJWT(tokenExp)).MintJWTSVID(context.Background(),
			&identityapi.MintJWTSVIDRequest{Audience: []string{"aud"}, TtlSeconds: 600})
		done <- answer{resp, err}
	}()
	<-queued
	clk.Step(15 * time.Second) // under the queue's 20 s, which this clock also runs
	close(release)
	require.NoError(t, <-certDone)
	got := <-done
	require.NoError(t, got.err)
	assert.Equal(t, tokenExp.Unix(), got.resp.GetExpiresAt(), "the token ends with the credential that bought it")
}
