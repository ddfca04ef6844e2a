package authn

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

var epoch = time.Date(2026, 11, 22, 6, 0, 0, 0, time.UTC)

// makeJWT builds an unsigned-looking compact JWS with the given claims; the
// fake API server decides whether it is valid.
func makeJWT(t testing.TB, claims map[string]any) string {
	t.Helper()
	enc := func(v any) string {
		b, err := json.Marshal(v)
		require.NoError(t, err)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	return enc(map[string]string{"alg": "RS256", "kid": "k"}) + "." + enc(claims) + "." + base64.RawURLEncoding.EncodeToString([]byte("signature"))
}

// testIssuer is the iss of test tokens, kube-apiserver's default.
const testIssuer = "https://kubernetes.default.svc.cluster.local"

// saToken is a JWT for a service account that expires at exp (zero: no exp).
func saToken(t testing.TB, name string, exp time.Time) string {
	t.Helper()
	claims := map[string]any{"iss": testIssuer, "sub": "system:serviceaccount:default:" + name, "aud": []string{"example.org"}}
	if !exp.IsZero() {
		claims["exp"] = exp.Unix()
	}
	return makeJWT(t, claims)
}

// fakeAPI answers TokenReviews from a table keyed by token and counts calls.
type fakeAPI struct {
	*fake.Clientset
	mu      sync.Mutex
	answers map[string]func(spec authenticationv1.TokenReviewSpec) (authenticationv1.TokenReviewStatus, error)
	specs   []authenticationv1.TokenReviewSpec
	calls   atomic.Int32
}

func newFakeAPI() *fakeAPI {
	f := &fakeAPI{Clientset: fake.NewClientset(), answers: map[string]func(authenticationv1.TokenReviewSpec) (authenticationv1.TokenReviewStatus, error){}}
	f.PrependReactor("create", "tokenreviews", func(action k8stesting.Action) (bool, runtime.Object, error) {
		tr := action.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview)
		f.calls.Add(1)
		f.mu.Lock()
		f.specs = append(f.specs, tr.Spec)
		answer, ok := f.answers[tr.Spec.Token]
		f.mu.Unlock()
		if !ok {
			return true, &authenticationv1.TokenReview{Status: authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}}, nil
		}
		st, err := answer(tr.Spec)
		if err != nil {
			return true, nil, err
		}
		return true, &authenticationv1.TokenReview{Spec: tr.Spec, Status: st}, nil
	})
	return f
}

func (f *fakeAPI) set(token string, answer func(authenticationv1.TokenReviewSpec) (authenticationv1.TokenReviewStatus, error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answers[token] = answer
}

// accept answers like an API server that knows the token is for user and
// was issued for audiences.
func accept(user string, audiences ...string) func(authenticationv1.TokenReviewSpec) (authenticationv1.TokenReviewStatus, error) {
	return func(spec authenticationv1.TokenReviewSpec) (authenticationv1.TokenReviewStatus, error) {
		var both []string
		for _, a := range spec.Audiences {
			for _, b := range audiences {
				if a == b {
					both = append(both, a)
				}
			}
		}
		if len(both) == 0 {
			return authenticationv1.TokenReviewStatus{Error: "token audiences are invalid for the target audiences"}, nil
		}
		return authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: both, User: authenticationv1.UserInfo{Username: user}}, nil
	}
}

func status(st authenticationv1.TokenReviewStatus) func(authenticationv1.TokenReviewSpec) (authenticationv1.TokenReviewStatus, error) {
	return func(authenticationv1.TokenReviewSpec) (authenticationv1.TokenReviewStatus, error) { return st, nil }
}

type reviewFixture struct {
	api *fakeAPI
	clk *clocktesting.FakeClock
	reg *prometheus.Registry
	log *bytes.Buffer
	a   *TokenReview
}

func newReviewFixture(t *testing.T, mutate func(*TokenReviewConfig)) *reviewFixture {
	t.Helper()
	f := &reviewFixture{api: newFakeAPI(), clk: clocktesting.NewFakeClock(epoch), reg: prometheus.NewRegistry(), log: &bytes.Buffer{}}
	cfg := TokenReviewConfig{
		Client:      f.api,
		TrustDomain: localTD,
		Clock:       f.clk,
		Registerer:  f.reg,
		Logger:      slog.New(slog.NewTextHandler(&lockedWriter{w: f.log}, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	a, err := NewTokenReview(cfg)
	require.NoError(t, err)
	f.a = a
	return f
}

func (f *reviewFixture) auth(token string) (Identity, error) {
	return f.a.Authenticate(context.Background(), Request{BearerToken: token, Peer: "127.0.0.1:5555"})
}

func (f *reviewFixture) reviews(result string) float64 {
	return testutil.ToFloat64(f.a.m.reviews.WithLabelValues(result))
}

type lockedWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestTokenReview(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	valid := saToken(t, "web", epoch.Add(time.Hour))
	webID := spiffeid.RequireFromString("spiffe://example.org/ns/default/sa/web")

	tests := []struct {
		name       string
		token      string
		authErr    error
		answer     func(authenticationv1.TokenReviewSpec) (authenticationv1.TokenReviewStatus, error)
		want       spiffeid.ID
		wantErr    error
		errHas     string
		wantCalls  int32
		wantResult string
	}{
		{name: "authenticated", token: valid, answer: accept("system:serviceaccount:default:web", "example.org"), want: webID, wantCalls: 1, wantResult: reviewAuthenticated},
		{name: "sa name with dots", token: valid, answer: accept("system:serviceaccount:prod:web.v2", "example.org"), want: spiffeid.RequireFromString("spiffe://example.org/ns/prod/sa/web.v2"), wantCalls: 1, wantResult: reviewAuthenticated},
		{name: "token without exp refused before review", token: saToken(t, "web", time.Time{}), answer: accept("system:serviceaccount:default:web", "example.org"), wantErr: ErrInvalidCredentials, errHas: "no exp"},
		{name: "not authenticated", token: valid, answer: status(authenticationv1.TokenReviewStatus{}), wantErr: ErrInvalidCredentials, errHas: "not authenticated", wantCalls: 1, wantResult: reviewUnauthenticated},
		{name: "status error", token: valid, answer: status(authenticationv1.TokenReviewStatus{Authenticated: true, Error: "service account deleted", Audiences: []string{"example.org"}, User: authenticationv1.UserInfo{Username: "system:serviceaccount:default:web"}}), wantErr: ErrInvalidCredentials, errHas: "service account deleted", wantCalls: 1, wantResult: reviewUnauthenticated},
		{name: "wrong audience refused by API server", token: valid, answer: accept("system:serviceaccount:default:web", "istio-ca"), wantErr: ErrInvalidCredentials, errHas: "audiences are invalid", wantCalls: 1, wantResult: reviewUnauthenticated},
		{name: "wrong audience in status", token: valid, answer: status(authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: []string{"istio-ca"}, User: authenticationv1.UserInfo{Username: "system:serviceaccount:default:web"}}), wantErr: ErrInvalidCredentials, errHas: "not confirmed", wantCalls: 1, wantResult: reviewRefused},
		{name: "no audiences in status", token: valid, answer: status(authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: "system:serviceaccount:default:web"}}), wantErr: ErrInvalidCredentials, errHas: "not confirmed", wantCalls: 1, wantResult: reviewRefused},
		{name: "user, not service account", token: valid, answer: accept("alice", "example.org"), wantErr: ErrInvalidCredentials, errHas: "not a service account", wantCalls: 1, wantResult: reviewRefused},
		{name: "node username", token: valid, answer: accept("system:node:worker-1", "example.org"), wantErr: ErrInvalidCredentials, errHas: "not a service account", wantCalls: 1, wantResult: reviewRefused},
		{name: "username missing name", token: valid, answer: accept("system:serviceaccount:default", "example.org"), wantErr: ErrInvalidCredentials, errHas: "<namespace>:<name>", wantCalls: 1, wantResult: reviewRefused},
		{name: "username extra colon", token: valid, answer: accept("system:serviceaccount:default:web:x", "example.org"), wantErr: ErrInvalidCredentials, errHas: "<namespace>:<name>", wantCalls: 1, wantResult: reviewRefused},
		{name: "invalid namespace", token: valid, answer: accept("system:serviceaccount:Default:web", "example.org"), wantErr: ErrInvalidCredentials, errHas: "namespace", wantCalls: 1, wantResult: reviewRefused},
		{name: "empty service account", token: valid, answer: accept("system:serviceaccount:default:", "example.org"), wantErr: ErrInvalidCredentials, errHas: "name", wantCalls: 1, wantResult: reviewRefused},
		{name: "service account with slash", token: valid, answer: accept("system:serviceaccount:default:a/b", "example.org"), wantErr: ErrInvalidCredentials, errHas: "name", wantCalls: 1, wantResult: reviewRefused},
		{name: "API error", token: valid, answer: func(authenticationv1.TokenReviewSpec) (authenticationv1.TokenReviewStatus, error) {
			return authenticationv1.TokenReviewStatus{}, errors.New("etcd is down")
		}, wantErr: ErrUnavailable, errHas: "etcd is down", wantCalls: 1, wantResult: reviewError},
		{name: "no token", token: "", wantErr: ErrNoCredentials},
		{name: "unusable authorization metadata", authErr: errors.New("authorization metadata has 2 values, want one"), wantErr: ErrInvalidCredentials, errHas: "2 values"},
		{name: "not a JWT", token: "0123456789abcdef0123", wantErr: ErrNoCredentials, errHas: "not a JWT"},
		{name: "JWT-looking garbage", token: "a.b.c", wantErr: ErrNoCredentials, errHas: "not a JWT"},
		{name: "expired by its exp claim", token: saToken(t, "web", epoch.Add(-time.Second)), wantErr: ErrInvalidCredentials, errHas: "expired"},
		{name: "oversized", token: makeJWT(t, map[string]any{"pad": strings.Repeat("x", MaxTokenSize)}), wantErr: ErrInvalidCredentials, errHas: "more than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newReviewFixture(t, nil)
			if tt.answer != nil {
				f.api.set(tt.token, tt.answer)
			}
			id, err := f.a.Authenticate(context.Background(), Request{BearerToken: tt.token, AuthorizationError: tt.authErr, Peer: "127.0.0.1:5555"})
			assert.Equal(t, tt.wantCalls, f.api.calls.Load(), "TokenReview calls")
			if tt.wantResult != "" {
				assert.Equal(t, 1.0, f.reviews(tt.wantResult))
			}
			if tt.token != "" {
				assert.NotContains(t, f.log.String(), tt.token, "log holds the token")
			}
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				assert.Contains(t, err.Error(), "authn: kubernetes-jwt: ")
				assert.Contains(t, err.Error(), tt.errHas)
				if tt.token != "" {
					assert.NotContains(t, err.Error(), tt.token)
				}
				assert.Zero(t, id)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, Identity{ID: tt.want, Method: MethodKubernetesJWT}, idOnly(id))
			require.Len(t, f.api.specs, 1)
			assert.Equal(t, authenticationv1.TokenReviewSpec{Token: tt.token, Audiences: []string{"example.org"}}, f.api.specs[0])
		})
	}
}

func TestTokenReviewAudienceConfig(t *testing.T) {
	f := newReviewFixture(t, func(c *TokenReviewConfig) { c.Audience = "trustbridge-ca" })
	tok := saToken(t, "web", epoch.Add(time.Hour))
	f.api.set(tok, accept("system:serviceaccount:default:web", "example.org"))
	_, err := f.auth(tok)
	require.ErrorIs(t, err, ErrInvalidCredentials, "token for the trust domain audience, authenticator wants trustbridge-ca")
	assert.Zero(t, f.api.calls.Load(), "refused by its aud claim, before any review")

	tok = makeJWT(t, map[string]any{"iss": testIssuer, "sub": "system:serviceaccount:default:web", "aud": "trustbridge-ca", "exp": epoch.Add(time.Hour).Unix()})
	f.api.set(tok, accept("system:serviceaccount:default:web", "trustbridge-ca"))
	_, err = f.auth(tok)
	require.NoError(t, err)
	require.Len(t, f.api.specs, 1)
	assert.Equal(t, []string{"trustbridge-ca"}, f.api.specs[0].Audiences)
}

// ClusterID metadata, as Istio's agents and ztunnel send it, is judged as
// istiod does: absent means the local cluster; with --cluster-id set, a
// caller claiming another cluster is refused before any review; several
// values are refused. Without --cluster-id any is accepted.
func TestTokenReviewClusterID(t *testing.T) {
	const user = "system:serviceaccount:default:web"
	f := newReviewFixture(t, func(c *TokenReviewConfig) { c.ClusterID = "east" })
	tok := saToken(t, "web", epoch.Add(time.Hour))
	f.api.set(tok, accept(user, "example.org"))
	authAs := func(a *TokenReview, ids ...string) error {
		_, err := a.Authenticate(context.Background(), Request{BearerToken: tok, Peer: "127.0.0.1:5555", ClusterIDs: ids})
		return err
	}

	err := authAs(f.a, "west")
	require.ErrorIs(t, err, ErrInvalidCredentials)
	assert.ErrorContains(t, err, `client claims to be in cluster "west", but this server only reviews tokens of cluster "east"`)
	err = authAs(f.a, "east", "west")
	require.ErrorIs(t, err, ErrInvalidCredentials)
	assert.ErrorContains(t, err, "2 values")
	assert.Zero(t, f.api.calls.Load(), "refused before any review")
	assert.Equal(t, 2.0, testutil.ToFloat64(f.a.m.local.WithLabelValues(localRefusedCluster)))

	require.NoError(t, authAs(f.a, "east"))
	require.NoError(t, authAs(f.a), "no ClusterID: the local cluster")

	any := newReviewFixture(t, nil)
	any.api.set(tok, accept(user, "example.org"))
	require.NoError(t, authAs(any.a, "Kubernetes"), "without --cluster-id the review alone decides")
}

func TestTokenReviewCache(t *testing.T) {
	const user = "system:serviceaccount:default:web"

	t.Run("hit within TTL, miss after", func(t *testing.T) {
		f := newReviewFixture(t, func(c *TokenReviewConfig) { c.CacheTTL = 30 * time.Second })
		tok := saToken(t, "web", epoch.Add(time.Hour))
		f.api.set(tok, accept(user, "example.org"))
		for range 3 {
			id, err := f.auth(tok)
			require.NoError(t, err)
			assert.Equal(t, MethodKubernetesJWT, id.Method)
		}
		assert.EqualValues(t, 1, f.api.calls.Load())
		assert.Equal(t, 2.0, testutil.ToFloat64(f.a.m.cacheHits))

		f.clk.Step(29 * time.Second)
		_, err := f.auth(tok)
		require.NoError(t, err)
		assert.EqualValues(t, 1, f.api.calls.Load(), "still cached at 29s")

		f.clk.Step(time.Second)
		_, err = f.auth(tok)
		require.NoError(t, err)
		assert.EqualValues(t, 2, f.api.calls.Load(), "reviewed again at 30s")
	})

	t.Run("revocation seen after TTL", func(t *testing.T) {
		f := newReviewFixture(t, nil)
		tok := saToken(t, "web", epoch.Add(time.Hour))
		f.api.set(tok, accept(user, "example.org"))
		_, err := f.auth(tok)
		require.NoError(t, err)
		f.api.set(tok, status(authenticationv1.TokenReviewStatus{Error: "service account default/web has been deleted"}))
		f.clk.Step(59 * time.Second)
		_, err = f.auth(tok)
		require.NoError(t, err, "cached for up to the default minute")
		f.clk.Step(time.Second)
		_, err = f.auth(tok)
		require.ErrorIs(t, err, ErrInvalidCredentials)
	})

	t.Run("token expiry bounds the cache", func(t *testing.T) {
		f := newReviewFixture(t, nil)
		tok := saToken(t, "web", epoch.Add(10*time.Second))
		f.api.set(tok, accept(user, "example.org"))
		_, err := f.auth(tok)
		require.NoError(t, err)
		f.clk.Step(9 * time.Second)
		_, err = f.auth(tok)
		require.NoError(t, err)
		assert.EqualValues(t, 1, f.api.calls.Load())
		f.clk.Step(time.Second)
		_, err = f.auth(tok)
		require.ErrorIs(t, err, ErrInvalidCredentials)
		assert.EqualValues(t, 1, f.api.calls.Load(), "expired token neither served from cache nor reviewed")
		assert.Equal(t, 1.0, testutil.ToFloat64(f.a.m.cacheHits))
	})

	t.Run("unreadable exp is never reviewed", func(t *testing.T) {
		f := newReviewFixture(t, nil)
		tok := makeJWT(t, map[string]any{"iss": testIssuer, "sub": user, "aud": "example.org", "exp": "tomorrow"})
		f.api.set(tok, accept(user, "example.org"))
		for range 2 {
			_, err := f.auth(tok)
			require.ErrorIs(t, err, ErrInvalidCredentials)
		}
		assert.Zero(t, f.api.calls.Load())
	})

	t.Run("failures are not cached", func(t *testing.T) {
		f := newReviewFixture(t, nil)
		tok := saToken(t, "web", epoch.Add(time.Hour))
		f.api.set(tok, func(authenticationv1.TokenReviewSpec) (authenticationv1.TokenReviewStatus, error) {
			return authenticationv1.TokenReviewStatus{}, errors.New("connection refused")
		})
		_, err := f.auth(tok)
		require.ErrorIs(t, err, ErrUnavailable)
		f.api.set(tok, status(authenticationv1.TokenReviewStatus{}))
		_, err = f.auth(tok)
		require.ErrorIs(t, err, ErrInvalidCredentials)
		f.api.set(tok, accept(user, "example.org"))
		_, err = f.auth(tok)
		require.NoError(t, err, "a refusal is not remembered")
		assert.EqualValues(t, 3, f.api.calls.Load())
	})

	t.Run("bounded in entries", func(t *testing.T) {
		f := newReviewFixture(t, func(c *TokenReviewConfig) { c.MaxCacheEntries = 2 })
		toks := make([]string, 3)
		for i := range toks {
			toks[i] = saToken(t, fmt.Sprintf("sa%d", i), epoch.Add(time.Hour))
			f.api.set(toks[i], accept(fmt.Sprintf("system:serviceaccount:default:sa%d", i), "example.org"))
			_, err := f.auth(toks[i])
			require.NoError(t, err)
		}
		assert.Equal(t, 2, f.a.cache.len())
		assert.Equal(t, 2.0, testutil.ToFloat64(collector(t, f.reg, "trustbridge_authn_token_review_cache_entries")))
		_, err := f.auth(toks[2])
		require.NoError(t, err)
		assert.EqualValues(t, 3, f.api.calls.Load(), "newest still cached")
		_, err = f.auth(toks[0])
		require.NoError(t, err)
		assert.EqualValues(t, 4, f.api.calls.Load(), "oldest was evicted")
	})
}

// collector reads a gauge registered on reg by name.
func collector(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "copy"})
			g.Set(mf.GetMetric()[0].GetGauge().GetValue())
			return g
		}
	}
	t.Fatalf("metric %s not registered", name)
	return nil
}

// TestTokenReviewConcurrent shows concurrent callers with one token share a
// single review, and that a caller giving up does not fail the others.
func TestTokenReviewConcurrent(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	f := newReviewFixture(t, nil)
	tok := saToken(t, "web", epoch.Add(time.Hour))
	release := make(chan struct{})
	f.api.set(tok, func(spec authenticationv1.TokenReviewSpec) (authenticationv1.TokenReviewStatus, error) {
		<-release
		return accept("system:serviceaccount:default:web", "example.org")(spec)
	})

	const n = 8
	impatient, cancel := context.WithCancel(context.Background())
	impatientErr := make(chan error, 1)
	go func() {
		_, err := f.a.Authenticate(impatient, Request{BearerToken: tok})
		impatientErr <- err
	}()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for range n {
		wg.Go(func() {
			_, err := f.auth(tok)
			errs <- err
		})
	}
	// Wait until all have joined the one review in flight.
	require.Eventually(t, func() bool {
		f.a.mu.Lock()
		defer f.a.mu.Unlock()
		for _, c := range f.a.inflight {
			return c.waiters == n
		}
		return false
	}, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-impatientErr, context.Canceled)
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.EqualValues(t, 1, f.api.calls.Load())
	_, err := f.auth(tok)
	require.NoError(t, err)
	assert.EqualValues(t, 1, f.api.calls.Load(), "result cached")
}

// TestTokenReviewTimeout runs the client against a loopback server that
// never answers: the review gives up after Timeout and reports
// ErrUnavailable. The transport sees the call's own deadline, Timeout
// after it started, and the call end at that deadline: no clock reading
// is compared with a threshold.
func TestTokenReviewTimeout(t *testing.T) {
	const timeout = 50 * time.Millisecond
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) }) // runs first: release the handler
	trips := make(chan observedTrip, 10)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
		return observingTransport{rt: rt, trips: trips}
	}})
	require.NoError(t, err)
	a, err := NewTokenReview(TokenReviewConfig{Client: cs, TrustDomain: localTD, Timeout: timeout})
	require.NoError(t, err)
	before := time.Now()
	_, err = a.Authenticate(context.Background(), Request{BearerToken: saToken(t, "web", time.Now().Add(time.Hour))})
	after := time.Now()
	require.ErrorIs(t, err, ErrUnavailable)

	var trip observedTrip
	select {
	case trip = <-trips:
	default:
		require.FailNow(t, "the review made no call")
	}
	require.True(t, trip.hasDeadline, "the call carries a deadline")
	assert.False(t, trip.deadline.Before(before.Add(timeout)), "deadline %s is less than Timeout after the call", trip.deadline)
	assert.False(t, trip.deadline.After(after.Add(timeout)), "deadline %s is more than Timeout after the call", trip.deadline)
	assert.ErrorIs(t, trip.ended, context.DeadlineExceeded, "the call ended at its deadline")
}

// observedTrip is what observingTransport saw of a call: its deadline and
// why its context ended once the round trip returned.
type observedTrip struct {
	deadline    time.Time
	hasDeadline bool
	ended       error
}

type observingTransport struct {
	rt    http.RoundTripper
	trips chan<- observedTrip
}

func (o observingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := o.rt.RoundTrip(r)
	d, ok := r.Context().Deadline()
	o.trips <- observedTrip{deadline: d, hasDeadline: ok, ended: r.Context().Err()}
	return resp, err
}

func TestNewTokenReviewConfig(t *testing.T) {
	cs := fake.NewClientset()
	tests := []struct {
		name   string
		cfg    TokenReviewConfig
		errHas string
		check  func(t *testing.T, c TokenReviewConfig)
	}{
		{name: "defaults", cfg: TokenReviewConfig{Client: cs, TrustDomain: localTD}, check: func(t *testing.T, c TokenReviewConfig) {
			assert.Equal(t, "example.org", c.Audience)
			assert.Equal(t, time.Minute, c.CacheTTL)
			assert.Equal(t, DefaultTokenReviewCacheEntries, c.MaxCacheEntries)
			assert.Equal(t, DefaultTokenReviewTimeout, c.Timeout)
			assert.Equal(t, DefaultMaxConcurrentReviews, c.MaxConcurrentReviews)
			assert.NotNil(t, c.Clock)
			assert.NotNil(t, c.Logger)
		}},
		{name: "TTL at the maximum", cfg: TokenReviewConfig{Client: cs, TrustDomain: localTD, CacheTTL: time.Minute}},
		{name: "no client", cfg: TokenReviewConfig{TrustDomain: localTD}, errHas: "client is required"},
		{name: "no trust domain", cfg: TokenReviewConfig{Client: cs}, errHas: "trust domain is required"},
		{name: "TTL above a minute", cfg: TokenReviewConfig{Client: cs, TrustDomain: localTD, CacheTTL: time.Minute + time.Second}, errHas: "cache TTL"},
		{name: "negative TTL", cfg: TokenReviewConfig{Client: cs, TrustDomain: localTD, CacheTTL: -time.Second}, errHas: "cache TTL"},
		{name: "negative entries", cfg: TokenReviewConfig{Client: cs, TrustDomain: localTD, MaxCacheEntries: -1}, errHas: "negative"},
		{name: "negative timeout", cfg: TokenReviewConfig{Client: cs, TrustDomain: localTD, Timeout: -1}, errHas: "negative"},
		{name: "negative concurrency", cfg: TokenReviewConfig{Client: cs, TrustDomain: localTD, MaxConcurrentReviews: -1}, errHas: "max concurrent reviews"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := NewTokenReview(tt.cfg)
			if tt.errHas != "" {
				require.Error(t, err)
				assert.True(t, strings.HasPrefix(err.Error(), "authn: "), err.Error())
				assert.Contains(t, err.Error(), tt.errHas)
				return
			}
			require.NoError(t, err)
			if tt.check != nil {
				tt.check(t, a.cfg)
			}
		})
	}
	t.Run("metrics registered twice", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		_, err := NewTokenReview(TokenReviewConfig{Client: cs, TrustDomain: localTD, Registerer: reg})
		require.NoError(t, err)
		_, err = NewTokenReview(TokenReviewConfig{Client: cs, TrustDomain: localTD, Registerer: reg})
		require.ErrorContains(t, err, "authn: token review metrics")
	})
}

func TestCacheUntil(t *testing.T) {
	tests := []struct {
		name string
		info jwtInfo
		ttl  time.Duration
		want time.Time
	}{
		{name: "no exp: TTL", ttl: time.Minute, want: epoch.Add(time.Minute)},
		{name: "exp after TTL", info: jwtInfo{exp: epoch.Add(time.Hour)}, ttl: time.Minute, want: epoch.Add(time.Minute)},
		{name: "exp before TTL", info: jwtInfo{exp: epoch.Add(10 * time.Second)}, ttl: time.Minute, want: epoch.Add(10 * time.Second)},
		{name: "exp now", info: jwtInfo{exp: epoch}, ttl: time.Minute},
		{name: "exp past", info: jwtInfo{exp: epoch.Add(-time.Second)}, ttl: time.Minute},
		{name: "unreadable exp", info: jwtInfo{expInvalid: true}, ttl: time.Minute},
		{name: "zero TTL", ttl: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, tt.info.cacheUntil(epoch, tt.ttl))
		})
	}
}

func TestPeekJWT(t *testing.T) {
	enc := base64.RawURLEncoding.EncodeToString
	hdr := enc([]byte(`{"alg":"RS256"}`))
	tests := []struct {
		name    string
		token   string
		wantErr bool
		want    jwtInfo
	}{
		{name: "exp integer", token: hdr + "." + enc([]byte(`{"exp":1800000000}`)) + ".sig", want: jwtInfo{exp: time.Unix(1800000000, 0)}},
		{name: "exp fraction", token: hdr + "." + enc([]byte(`{"exp":1800000000.5}`)) + ".sig", want: jwtInfo{exp: time.Unix(1800000000, 5e8)}},
		{name: "no exp", token: hdr + "." + enc([]byte(`{"sub":"x"}`)) + ".sig"},
		{name: "issuer", token: hdr + "." + enc([]byte(`{"iss":"https://west.example/","exp":1800000000}`)) + ".sig", want: jwtInfo{exp: time.Unix(1800000000, 0), iss: "https://west.example/"}},
		{name: "issuer not a string", token: hdr + "." + enc([]byte(`{"iss":["a"]}`)) + ".sig"},
		{name: "padded segments", token: hdr + "==." + enc([]byte(`{}`)) + "=.sig"},
		{name: "exp string", token: hdr + "." + enc([]byte(`{"exp":"soon"}`)) + ".sig", want: jwtInfo{expInvalid: true}},
		{name: "exp negative", token: hdr + "." + enc([]byte(`{"exp":-1}`)) + ".sig", want: jwtInfo{expInvalid: true}},
		{name: "exp huge", token: hdr + "." + enc([]byte(`{"exp":1e300}`)) + ".sig", want: jwtInfo{expInvalid: true}},
		{name: "two parts", token: hdr + "." + enc([]byte(`{}`)), wantErr: true},
		{name: "four parts", token: hdr + "." + enc([]byte(`{}`)) + ".sig.x", wantErr: true},
		{name: "empty signature", token: hdr + "." + enc([]byte(`{}`)) + ".", wantErr: true},
		{name: "header without alg", token: enc([]byte(`{"typ":"JWT"}`)) + "." + enc([]byte(`{}`)) + ".sig", wantErr: true},
		{name: "header not base64", token: "!!!." + enc([]byte(`{}`)) + ".sig", wantErr: true},
		{name: "payload array", token: hdr + "." + enc([]byte(`[1]`)) + ".sig", wantErr: true},
		{name: "payload null", token: hdr + "." + enc([]byte(`null`)) + ".sig", wantErr: true},
		{name: "opaque", token: "0123456789abcdef", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := peekJWT(tt.token)
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.True(t, tt.want.exp.Equal(got.exp), "exp %s, want %s", got.exp, tt.want.exp)
			assert.Equal(t, tt.want.expInvalid, got.expInvalid)
			assert.Equal(t, tt.want.iss, got.iss)
		})
	}
}

// TestTokenReviewConcurrencyCap floods the authenticator with distinct
// tokens while the API server is slow: beyond MaxConcurrentReviews a new
// token is refused at once with ErrUnavailable and never reaches the API
// server, while callers sharing a review in flight still join it, and the
// cap frees up once reviews finish.
func TestTokenReviewConcurrencyCap(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const limit = DefaultMaxConcurrentReviews
	// One address may take every slot here: this test is about the global
	// bound (TestTokenReviewPeerShare is about the per-address one).
	f := newReviewFixture(t, func(c *TokenReviewConfig) { c.MaxReviewsPerPeer, c.PeerReviewBurst = limit, 2*limit })
	release := make(chan struct{})
	tokens := make([]string, limit+1)
	for i := range tokens {
		tokens[i] = saToken(t, fmt.Sprintf("sa-%d", i), epoch.Add(time.Hour))
		user := fmt.Sprintf("system:serviceaccount:default:sa-%d", i)
		f.api.set(tokens[i], func(spec authenticationv1.TokenReviewSpec) (authenticationv1.TokenReviewStatus, error) {
			<-release
			return accept(user, "example.org")(spec)
		})
	}
	var wg sync.WaitGroup
	errs := make(chan error, limit+1)
	for _, tok := range tokens[:limit] {
		wg.Go(func() {
			_, err := f.auth(tok)
			errs <- err
		})
	}
	// The fake client serializes calls: one is in the API server, the
	// others queue behind it, as they would behind client-go's limiter.
	require.Eventually(t, func() bool {
		f.a.mu.Lock()
		defer f.a.mu.Unlock()
		return len(f.a.inflight) == limit
	}, 5*time.Second, time.Millisecond)

	// One more distinct token: refused without a call, well before any
	// review could time out.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err := f.a.Authenticate(ctx, Request{BearerToken: tokens[limit]})
	require.ErrorIs(t, err, ErrUnavailable)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	assert.EqualValues(t, 1, f.reviews(reviewBusy))

	// A caller with a token already under review joins it.
	wg.Go(func() {
		_, err := f.auth(tokens[0])
		errs <- err
	})
	require.Eventually(t, func() bool {
		f.a.mu.Lock()
		defer f.a.mu.Unlock()
		return f.a.inflight[tokenKey(sha256.Sum256([]byte(tokens[0])))].waiters == 1
	}, 5*time.Second, time.Millisecond)

	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		assert.NoError(t, err)
	}
	assert.EqualValues(t, limit, f.api.calls.Load(), "the refused token never reached the API server")
	id, err := f.auth(tokens[limit])
	require.NoError(t, err, "room again once the reviews finished")
	assert.Equal(t, spiffeid.RequireFromPath(localTD, fmt.Sprintf("/ns/default/sa/sa-%d", limit)), id.ID)
}

// The pod a token is bound to comes from the API server's answer (a node
// proxy proves its node through it); anything but one name and one UID is
// no pod.
func TestBoundPod(t *testing.T) {
	id := spiffeid.RequireFromString("spiffe://example.org/ns/istio-system/sa/ztunnel")
	extra := func(kv ...string) map[string]authenticationv1.ExtraValue {
		m := map[string]authenticationv1.ExtraValue{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = append(m[kv[i]], kv[i+1])
		}
		return m
	}
	assert.Equal(t, PodRef{Namespace: "istio-system", Name: "ztunnel-a", UID: "u-1"},
		boundPod(extra(extraPodName, "ztunnel-a", extraPodUID, "u-1"), id))
	assert.True(t, boundPod(extra(extraPodName, "ztunnel-a"), id).IsZero(), "no UID")
	assert.True(t, boundPod(extra(extraPodName, "a", extraPodName, "b", extraPodUID, "u"), id).IsZero(), "two names")
	assert.True(t, boundPod(nil, id).IsZero())
	assert.True(t, boundPod(extra(extraPodName, "p", extraPodUID, "u"), spiffeid.RequireFromString("spiffe://example.org/vm")).IsZero())
}

// TestTokenReviewLeavesOtherIssuers: a token of an issuer another
// authenticator verifies (a remote cluster, an OIDC issuer) is left to it
// without a review, even when its claims look like a service account
// token for our audience and its ClusterID names another cluster; tokens
// of the local issuer are still reviewed.
func TestTokenReviewLeavesOtherIssuers(t *testing.T) {
	const remote = "https://west.example/"
	f := newReviewFixture(t, func(c *TokenReviewConfig) {
		c.OtherIssuers = []string{remote}
		c.ClusterID = "east"
	})
	claims := map[string]any{"iss": remote, "sub": "system:serviceaccount:default:web", "aud": []string{"example.org"}, "exp": epoch.Add(time.Hour).Unix()}
	_, err := f.a.Authenticate(t.Context(), Request{BearerToken: makeJWT(t, claims), Peer: "127.0.0.1:5555", ClusterIDs: []string{"west"}})
	require.ErrorIs(t, err, ErrNoCredentials)
	assert.NotErrorIs(t, err, ErrInvalidCredentials)
	assert.Contains(t, err.Error(), "verified by another authenticator")
	assert.Zero(t, f.api.calls.Load(), "no TokenReview for another issuer's token")

	local := saToken(t, "web", epoch.Add(time.Hour))
	f.api.set(local, accept("system:serviceaccount:default:web", "example.org"))
	id, err := f.auth(local)
	require.NoError(t, err)
	assert.Equal(t, "spiffe://example.org/ns/default/sa/web", id.ID.String())
	assert.EqualValues(t, 1, f.api.calls.Load())
}
