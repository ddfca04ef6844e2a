package certservice_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/certservice"
	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
	"github.com/trustbridge/trustbridge/internal/identityapi"
	"github.com/trustbridge/trustbridge/internal/testkit/testca"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

var (
	allowedTD    = spiffeid.RequireTrustDomainFromString("allowed.example")
	withheldTD   = spiffeid.RequireTrustDomainFromString("withheld.example")
	deniedTD     = spiffeid.RequireTrustDomainFromString("denied.example")
	ungovernedTD = spiffeid.RequireTrustDomainFromString("ungoverned.example")
)

// fakeBundles is a BundleSource whose trust the test replaces; calls
// counts Bundles calls, so a test can tell a stream has seen a change.
type fakeBundles struct {
	mu      sync.Mutex
	bundles []*spiffebundle.Bundle
	ch      chan struct{}
	calls   atomic.Int64
}

func newFakeBundles(bs ...*spiffebundle.Bundle) *fakeBundles {
	return &fakeBundles{bundles: bs, ch: make(chan struct{})}
}

func staticBundles() certservice.BundleSource { return newFakeBundles() }

func (f *fakeBundles) Bundles() ([]*spiffebundle.Bundle, <-chan struct{}) {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.bundles, f.ch
}

func (f *fakeBundles) set(bs ...*spiffebundle.Bundle) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bundles = bs
	close(f.ch)
	f.ch = make(chan struct{})
}

// fakePolicy decides with a compiled trustpolicy.Policy the test replaces.
type fakePolicy struct {
	mu sync.Mutex
	p  *trustpolicy.Policy
	ch chan struct{}
}

func (f *fakePolicy) Decide(ident authn.Identity) (trustpolicy.Decision, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.p.Decide(trustpolicy.SubjectOf(ident)), f.ch
}

func (f *fakePolicy) set(p *trustpolicy.Policy) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.p = p
	close(f.ch)
	f.ch = make(chan struct{})
}

// testPolicy grants workloadID allowed.example for every member and
// withheld.example for one peer; denied.example goes to another workload.
func testPolicy(t *testing.T, def trustpolicy.Default) *trustpolicy.Policy {
	t.Helper()
	p, err := trustpolicy.Compile(td, def, []trustpolicy.Rule{{
		Name:      "web",
		Workloads: []trustpolicy.Selector{{SPIFFEID: workloadID.String()}},
		TrustDomains: []trustpolicy.TrustDomainGrant{
			{TrustDomain: allowedTD.Name()},
			{TrustDomain: withheldTD.Name(), Peers: []string{"spiffe://withheld.example/api"}},
		},
	}, {
		Name:         "other",
		Workloads:    []trustpolicy.Selector{{SPIFFEID: "spiffe://example.org/other"}},
		TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: deniedTD.Name()}},
	}})
	require.NoError(t, err)
	return p
}

// watchFixture serves WatchBundles of the local CA's bundle and four
// federated ones.
type watchFixture struct {
	*fixture
	bundles *fakeBundles
	fed     map[spiffeid.TrustDomain]*spiffebundle.Bundle
}

func newWatchFixture(t *testing.T, mutate func(*certservice.Config)) *watchFixture {
	t.Helper()
	w := &watchFixture{fed: map[spiffeid.TrustDomain]*spiffebundle.Bundle{}}
	for _, d := range []spiffeid.TrustDomain{allowedTD, withheldTD, deniedTD, ungovernedTD} {
		w.fed[d] = testca.New(t, d.Name()).Bundle()
	}
	w.fixture = newFixture(t, func(cfg *certservice.Config, a *ca.Authority) {
		w.bundles = newFakeBundles(w.all(a.Bundle())...)
		cfg.Bundles = w.bundles
		cfg.Authenticator = authn.Chain{authn.NewX509SVID(td, localRoots{a}, nil), fakeTokens}
		if mutate != nil {
			mutate(cfg)
		}
	})
	return w
}

func (w *watchFixture) all(local *spiffebundle.Bundle) []*spiffebundle.Bundle {
	return []*spiffebundle.Bundle{local, w.fed[allowedTD], w.fed[deniedTD], w.fed[ungovernedTD], w.fed[withheldTD]}
}

func (w *watchFixture) watch(t *testing.T, c identityapi.IdentityServiceClient) grpc.ServerStreamingClient[identityapi.WatchBundlesResponse] {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := c.WatchBundles(ctx, &identityapi.WatchBundlesRequest{})
	require.NoError(t, err)
	return stream
}

// recvMap receives one message: its trust domains and withheld names.
func recvMap(t *testing.T, stream grpc.ServerStreamingClient[identityapi.WatchBundlesResponse]) (map[string]*spiffebundle.Bundle, []string) {
	t.Helper()
	msg, err := stream.Recv()
	require.NoError(t, err)
	bundles, warnings, err := bundledoc.ParseMap(msg.GetBundleMap())
	require.NoError(t, err)
	require.Empty(t, warnings)
	out := map[string]*spiffebundle.Bundle{}
	for _, b := range bundles {
		out[b.TrustDomain().Name()] = b
	}
	return out, msg.GetWithheldTrustDomains()
}

func names(m map[string]*spiffebundle.Bundle) []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	return out
}

func TestWatchBundlesFiltering(t *testing.T) {
	for _, tc := range []struct {
		name         string
		policy       func(t *testing.T) certservice.AccessPolicy
		caller       spiffeid.ID
		want         []string
		wantWithheld []string
	}{
		{"no policy: everything", func(*testing.T) certservice.AccessPolicy { return nil }, workloadID,
			[]string{"allowed.example", "denied.example", "example.org", "ungoverned.example", "withheld.example"}, nil},
		{"default deny: local, allowed; withheld named", func(t *testing.T) certservice.AccessPolicy {
			return &fakePolicy{p: testPolicy(t, trustpolicy.DefaultDeny), ch: make(chan struct{})}
		}, workloadID, []string{"allowed.example", "example.org"}, []string{"withheld.example"}},
		{"default allow: ungoverned too", func(t *testing.T) certservice.AccessPolicy {
			return &fakePolicy{p: testPolicy(t, trustpolicy.DefaultAllow), ch: make(chan struct{})}
		}, workloadID, []string{"allowed.example", "example.org", "ungoverned.example"}, []string{"withheld.example"}},
		{"another workload: its own grant, local always", func(t *testing.T) certservice.AccessPolicy {
			return &fakePolicy{p: testPolicy(t, trustpolicy.DefaultDeny), ch: make(chan struct{})}
		}, spiffeid.RequireFromString("spiffe://example.org/other"), []string{"denied.example", "example.org"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWatchFixture(t, func(cfg *certservice.Config) { cfg.Policy = tc.policy(t) })
			stream := w.watch(t, w.identityClient(t, svid(t, w.authority, tc.caller), ""))
			got, withheld := recvMap(t, stream)
			assert.ElementsMatch(t, tc.want, names(got))
			assert.Equal(t, tc.wantWithheld, withheld)
			// The bundle map omits refresh hints, as producers must.
			assert.True(t, got["example.org"].X509Bundle().Equal(w.authority.Bundle().X509Bundle()), "the local roots as the source has them")
			assert.Equal(t, 1.0, testutil.ToFloat64(w.svc.WatchesOpenForTest()))
		})
	}
}

func TestWatchBundlesKeepsJWTAuthorities(t *testing.T) {
	w := newWatchFixture(t, nil)
	signer := newFakeJWTSigner(t)
	fed := w.fed[allowedTD].Clone()
	require.NoError(t, fed.AddJWTAuthority("peer-kid", signer.key.Public()))
	w.bundles.set(w.authority.Bundle(), fed)
	got, _ := recvMap(t, w.watch(t, w.identityClient(t, nil, goodToken)))
	key, ok := got["allowed.example"].FindJWTAuthority("peer-kid")
	require.True(t, ok)
	assert.True(t, signer.key.PublicKey.Equal(key))
}

func TestWatchBundlesUpdates(t *testing.T) {
	pol := &fakePolicy{p: testPolicy(t, trustpolicy.DefaultDeny), ch: make(chan struct{})}
	w := newWatchFixture(t, func(cfg *certservice.Config) { cfg.Policy = pol })
	stream := w.watch(t, w.identityClient(t, svid(t, w.authority, workloadID), ""))
	got, _ := recvMap(t, stream)
	require.ElementsMatch(t, []string{"allowed.example", "example.org"}, names(got))

	// A change of a trust domain the caller does not get sends nothing.
	before := w.bundles.calls.Load()
	w.bundles.set(w.authority.Bundle(), w.fed[allowedTD], testca.New(t, "denied.example").Bundle(), w.fed[withheldTD])
	require.Eventually(t, func() bool { return w.bundles.calls.Load() > before }, 10*time.Second, time.Millisecond, "the stream reads the new trust")

	// A rotation of one it gets is sent, and is the next message.
	rotated := testca.New(t, "allowed.example").Bundle()
	w.bundles.set(w.authority.Bundle(), rotated, w.fed[withheldTD])
	got, _ = recvMap(t, stream)
	assert.True(t, got["allowed.example"].X509Bundle().Equal(rotated.X509Bundle()))

	// A policy change that grants withheld.example without peers.
	p, err := trustpolicy.Compile(td, trustpolicy.DefaultDeny, []trustpolicy.Rule{{
		Name: "web", Workloads: []trustpolicy.Selector{{SPIFFEID: workloadID.String()}},
		TrustDomains: []trustpolicy.TrustDomainGrant{{TrustDomain: withheldTD.Name()}},
	}})
	require.NoError(t, err)
	pol.set(p)
	got, withheld := recvMap(t, stream)
	assert.ElementsMatch(t, []string{"example.org", "withheld.example"}, names(got))
	assert.Empty(t, withheld)
	// The server counts a message once its Send returned, which may be
	// after the client read it: wait for the third, then none more.
	require.Eventually(t, func() bool { return testutil.ToFloat64(w.svc.WatchMessagesForTest()) >= 3 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, 3.0, testutil.ToFloat64(w.svc.WatchMessagesForTest()), "no message repeats the last")
}

func TestWatchBundlesRefusals(t *testing.T) {
	t.Run("unauthenticated", func(t *testing.T) {
		w := newWatchFixture(t, nil)
		_, err := w.watch(t, w.identityClient(t, nil, "")).Recv()
		assert.Equal(t, codes.Unauthenticated, status.Code(err))
		assert.Equal(t, 1.0, testutil.ToFloat64(w.svc.WatchesForTest("Unauthenticated", "none")))
		assert.Contains(t, w.logs.String(), `"msg":"bundle watch refused"`)
	})
	t.Run("not configured", func(t *testing.T) {
		f, _ := jwtFixture(t, nil)
		stream, err := f.identityClient(t, nil, goodToken).WatchBundles(context.Background(), &identityapi.WatchBundlesRequest{})
		require.NoError(t, err)
		_, err = stream.Recv()
		assert.Equal(t, codes.FailedPrecondition, status.Code(err))
	})
	t.Run("too many streams", func(t *testing.T) {
		w := newWatchFixture(t, func(cfg *certservice.Config) { cfg.MaxBundleWatches = 1 })
		c := w.identityClient(t, nil, goodToken)
		first := w.watch(t, c)
		recvMap(t, first)
		_, err := w.watch(t, c).Recv()
		assert.Equal(t, codes.ResourceExhausted, status.Code(err))
		assert.Equal(t, 1.0, testutil.ToFloat64(w.svc.WatchesOpenForTest()))
	})
}

func TestWatchBundlesEndsOnShutdown(t *testing.T) {
	w := newWatchFixture(t, nil)
	stream := w.watch(t, w.identityClient(t, nil, goodToken))
	recvMap(t, stream)
	w.stop() // returns once Run has: the stream did not hold it
	_, err := stream.Recv()
	assert.Equal(t, codes.Unavailable, status.Code(err))
	assert.Equal(t, 0.0, testutil.ToFloat64(w.svc.WatchesOpenForTest()))
	assert.Equal(t, 1.0, testutil.ToFloat64(w.svc.WatchesForTest("Unavailable", "fake-token")))
}

func TestWatchBundlesEndsWhenCredentialExpires(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	w := newWatchFixture(t, func(cfg *certservice.Config) {
		cfg.Clock = clk
		cfg.WatchReauthInterval = 1000 * time.Hour
	})
	cert := svid(t, w.authority, workloadID) // valid for an hour
	stream := w.watch(t, w.identityClient(t, cert, ""))
	recvMap(t, stream)
	require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond)
	clk.Step(time.Until(cert.Leaf.NotAfter) + time.Second)
	_, err := stream.Recv()
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "expired at")
	assert.Contains(t, w.logs.String(), `"reason":"credential_expired"`)
}

// A service account token's stream ends at its exp, which the TokenReview
// authenticator reports (authn.Identity.NotAfter); the service reads no
// token itself.
func TestWatchBundlesEndsWhenTokenExpires(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	jwt := fakeJWT(clk.Now().Add(30 * time.Minute))
	w := newWatchFixture(t, func(cfg *certservice.Config) {
		cfg.Clock = clk
		cfg.WatchReauthInterval = 1000 * time.Hour
		tr, err := authn.NewTokenReview(authn.TokenReviewConfig{Client: fakeAPIServer(jwt), TrustDomain: td, Clock: clk})
		require.NoError(t, err)
		cfg.Authenticator = tr
	})
	stream := w.watch(t, w.identityClient(t, nil, jwt))
	recvMap(t, stream)
	require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond)
	clk.Step(30*time.Minute + time.Second)
	_, err := stream.Recv()
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "expired at")
	assert.Contains(t, w.logs.String(), `"reason":"credential_expired"`)
}

func TestWatchBundlesReauthentication(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	var revoked atomic.Bool
	w := newWatchFixture(t, func(cfg *certservice.Config) {
		cfg.Clock = clk
		cfg.WatchReauthInterval = time.Minute
		cfg.Authenticator = authn.AuthenticatorFunc(func(ctx context.Context, r authn.Request) (authn.Identity, error) {
			if revoked.Load() {
				return authn.Identity{}, authn.ErrInvalidCredentials
			}
			return fakeTokens(ctx, r)
		})
	})
	w.svc.SetRandForTest(func() float64 { return 0.5 }) // no jitter: TestWatchBundlesReauthJitter
	stream := w.watch(t, w.identityClient(t, nil, goodToken))
	recvMap(t, stream)
	// One interval with the token still good keeps the stream.
	require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond)
	clk.Step(time.Minute)
	require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond)
	revoked.Store(true)
	clk.Step(time.Minute)
	_, err := stream.Recv()
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	assert.Equal(t, 1.0, testutil.ToFloat64(w.svc.WatchMessagesForTest()), "nothing sent between")
}

// Callers with different decisions on one trust each get their own map,
// however the encodings are shared.
func TestWatchBundlesPerCallerOnSharedTrust(t *testing.T) {
	pol := &fakePolicy{p: testPolicy(t, trustpolicy.DefaultDeny), ch: make(chan struct{})}
	w := newWatchFixture(t, func(cfg *certservice.Config) { cfg.Policy = pol })
	other := spiffeid.RequireFromString("spiffe://example.org/other")
	web := w.watch(t, w.identityClient(t, svid(t, w.authority, workloadID), ""))
	oth := w.watch(t, w.identityClient(t, svid(t, w.authority, other), ""))
	web2 := w.watch(t, w.identityClient(t, svid(t, w.authority, workloadID), ""))
	for range 2 { // at once, then after a rotation of both granted trust domains
		got, _ := recvMap(t, web)
		assert.ElementsMatch(t, []string{"allowed.example", "example.org"}, names(got))
		got, _ = recvMap(t, oth)
		assert.ElementsMatch(t, []string{"denied.example", "example.org"}, names(got))
		got, _ = recvMap(t, web2)
		assert.ElementsMatch(t, []string{"allowed.example", "example.org"}, names(got))
		w.bundles.set(w.authority.Bundle(), testca.New(t, "allowed.example").Bundle(), testca.New(t, "denied.example").Bundle(), w.fed[withheldTD])
	}
	assert.Equal(t, 3.0, testutil.ToFloat64(w.svc.WatchesOpenForTest()))
}

// One identity filling its share of the streams leaves the rest to
// others, and a stream that ends gives its slot back.
func TestWatchBundlesPerIdentityCap(t *testing.T) {
	w := newWatchFixture(t, func(cfg *certservice.Config) { cfg.MaxBundleWatches, cfg.MaxBundleWatchesPerIdentity = 10, 2 })
	greedy := w.identityClient(t, nil, goodToken)
	ctx, cancel := context.WithCancel(t.Context())
	first, err := greedy.WatchBundles(ctx, &identityapi.WatchBundlesRequest{})
	require.NoError(t, err)
	recvMap(t, first)
	recvMap(t, w.watch(t, greedy))

	_, err = w.watch(t, greedy).Recv()
	assert.Equal(t, codes.ResourceExhausted, status.Code(err))
	assert.Contains(t, status.Convert(err).Message(), "holds 2 bundle streams, the most one identity may")
	assert.Contains(t, w.logs.String(), `"reason":"too_many_streams_per_identity"`)
	assert.Equal(t, 1.0, testutil.ToFloat64(w.svc.WatchesForTest("ResourceExhausted", "fake-token")))

	recvMap(t, w.watch(t, w.identityClient(t, svid(t, w.authority, workloadID), "")))
	assert.Equal(t, 3.0, testutil.ToFloat64(w.svc.WatchesOpenForTest()), "another identity still gets a stream")

	cancel()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, 2.0, testutil.ToFloat64(w.svc.WatchesOpenForTest()))
	}, 10*time.Second, time.Millisecond)
	recvMap(t, w.watch(t, greedy))
	assert.Equal(t, 3.0, testutil.ToFloat64(w.svc.WatchesOpenForTest()), "the ended stream's slot is free again")
}

func TestNewRefusesNegativeWatchCap(t *testing.T) {
	_, err := certservice.New(certservice.Config{Signer: certservice.SignerFunc(nil), Authenticator: fakeTokens, MaxBundleWatchesPerIdentity: -1})
	assert.ErrorContains(t, err, "must not be negative")
}

// Streams re-authenticate within ±15% of the interval, each at its own
// point, so those opened together do not ask the authenticators at once.
func TestWatchBundlesReauthJitter(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	var revoked atomic.Bool
	w := newWatchFixture(t, func(cfg *certservice.Config) {
		cfg.Clock = clk
		cfg.WatchReauthInterval = 100 * time.Second
		cfg.Authenticator = authn.AuthenticatorFunc(func(ctx context.Context, r authn.Request) (authn.Identity, error) {
			if revoked.Load() {
				return authn.Identity{}, authn.ErrInvalidCredentials
			}
			return fakeTokens(ctx, r)
		})
	})
	w.svc.SetRandForTest(func() float64 { return 0 }) // the earliest point
	stream := w.watch(t, w.identityClient(t, nil, goodToken))
	recvMap(t, stream)
	require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond)
	revoked.Store(true)
	clk.Step(85 * time.Second)
	// Without jitter the stream would wait for the full interval: wait
	// on the refusal's count, bounded, rather than on Recv.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, 1.0, testutil.ToFloat64(w.svc.WatchesForTest("Unauthenticated", "fake-token")), "re-authenticated 15% before the interval")
	}, 10*time.Second, time.Millisecond)
	_, err := stream.Recv()
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
}

func TestJittered(t *testing.T) {
	for _, tc := range []struct {
		r    float64
		want time.Duration
	}{
		{0, 85 * time.Second},
		{0.5, 100 * time.Second},
		{0.999999, 114999970 * time.Microsecond},
	} {
		t.Run(fmt.Sprint(tc.r), func(t *testing.T) {
			got := certservice.Jittered(100*time.Second, tc.r)
			assert.InDelta(t, tc.want, got, float64(time.Microsecond))
			assert.GreaterOrEqual(t, got, 85*time.Second)
			assert.Less(t, got, 115*time.Second)
		})
	}
}

// A stream whose trust or decision changes more often than it
// re-authenticates still re-authenticates at its deadline: were each
// wake-up to re-arm the wait, changes every few minutes would postpone
// re-authentication for as long as they came, and a bootstrap token (the
// fake token here: its expiry unknown, as a bootstrap token's is) revoked
// meanwhile would keep its stream.
func TestWatchBundlesReauthDeadlineSurvivesChanges(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	var revoked atomic.Bool
	var auths atomic.Int64
	pol := &fakePolicy{p: testPolicy(t, trustpolicy.DefaultAllow), ch: make(chan struct{})}
	w := newWatchFixture(t, func(cfg *certservice.Config) {
		cfg.Clock = clk
		cfg.Policy = pol
		cfg.WatchReauthInterval = 100 * time.Second
		cfg.Authenticator = authn.AuthenticatorFunc(func(ctx context.Context, r authn.Request) (authn.Identity, error) {
			auths.Add(1)
			if revoked.Load() {
				return authn.Identity{}, authn.ErrInvalidCredentials
			}
			return fakeTokens(ctx, r)
		})
	})
	w.svc.SetRandForTest(func() float64 { return 0.5 }) // no jitter: the deadline is the interval
	stream := w.watch(t, w.identityClient(t, nil, goodToken))
	recvMap(t, stream)
	require.Equal(t, int64(1), auths.Load(), "opening the stream authenticates once")

	// A quarter interval passes, then the trust or the decision changes
	// (to the same content: the stream wakes and sends nothing).
	same := pol.p
	changes := []func(){
		func() { w.bundles.set(w.all(w.authority.Bundle())...) },
		func() { pol.set(same) },
	}
	quarter := func(change func()) {
		t.Helper()
		require.Eventually(t, clk.HasWaiters, 10*time.Second, time.Millisecond)
		clk.Step(25 * time.Second)
		if change == nil {
			return
		}
		before := w.bundles.calls.Load()
		change()
		require.Eventually(t, func() bool { return w.bundles.calls.Load() > before }, 10*time.Second, time.Millisecond, "the stream woke for the change")
	}

	for i := range 3 {
		quarter(changes[i%2])
	}
	quarter(nil) // the deadline
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, int64(2), auths.Load(), "re-authenticated at the deadline despite a change every quarter interval")
	}, 10*time.Second, time.Millisecond)

	// The next deadline is an interval after that re-authentication,
	// changes again notwithstanding; the token is revoked meanwhile.
	revoked.Store(true)
	for i := range 3 {
		quarter(changes[i%2])
	}
	assert.Equal(t, int64(2), auths.Load(), "no re-authentication before the deadline")
	quarter(nil)
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		assert.Equal(c, 1.0, testutil.ToFloat64(w.svc.WatchesForTest("Unauthenticated", "fake-token")), "the revoked token's stream ended at the deadline")
	}, 10*time.Second, time.Millisecond)
	_, err := stream.Recv()
	assert.Equal(t, codes.Unauthenticated, status.Code(err))
	assert.Equal(t, 1.0, testutil.ToFloat64(w.svc.WatchMessagesForTest()), "the changes sent nothing")
}

// Every WatchBundles message names the issuer of the trust domain's
// JWT-SVIDs, so agents validating them refuse another issuer's; none
// without one.
func TestWatchBundlesNamesJWTIssuer(t *testing.T) {
	for _, iss := range []string{"", "https://oidc.example.org/prod"} {
		w := newWatchFixture(t, func(cfg *certservice.Config) { cfg.JWTIssuer = iss })
		msg, err := w.watch(t, w.identityClient(t, nil, goodToken)).Recv()
		require.NoError(t, err)
		assert.Equal(t, iss, msg.GetJwtIssuer())
	}
}
