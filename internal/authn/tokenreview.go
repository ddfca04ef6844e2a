package authn

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/logattr"
)

// TokenReview defaults and limits.
const (
	// MaxTokenReviewCacheTTL is the longest a successful review is reused:
	// a deleted service account or pod stops authenticating within it.
	MaxTokenReviewCacheTTL = time.Minute
	// DefaultTokenReviewCacheEntries bounds the cache when
	// TokenReviewConfig.MaxCacheEntries is 0.
	DefaultTokenReviewCacheEntries = 10000
	// DefaultTokenReviewTimeout bounds one TokenReview call when
	// TokenReviewConfig.Timeout is 0.
	DefaultTokenReviewTimeout = 5 * time.Second
	// DefaultMaxConcurrentReviews bounds the TokenReviews in flight when
	// TokenReviewConfig.MaxConcurrentReviews is 0.
	DefaultMaxConcurrentReviews = 64
)

// serviceAccountUsernamePrefix starts every service account's username.
const serviceAccountUsernamePrefix = "system:serviceaccount:"

// Results of a TokenReview, the label of trustbridge_authn_token_reviews_total.
const (
	reviewAuthenticated   = "authenticated"
	reviewUnauthenticated = "unauthenticated" // the API server refused the token
	reviewRefused         = "refused"         // authenticated, but not for our audience or not a service account
	reviewError           = "error"           // the call failed
	reviewBusy            = "busy"            // not asked: MaxConcurrentReviews in flight
)

// TokenReviewConfig configures NewTokenReview.
type TokenReviewConfig struct {
	// Client calls the API server. Required. client-go throttles each
	// client (5 QPS, burst 10 by default): give it a rest.Config with QPS
	// and Burst sized for the expected rate of new tokens, or reviews queue
	// behind the limiter until Timeout.
	Client kubernetes.Interface
	// TrustDomain names the identities: spiffe://<td>/ns/<ns>/sa/<sa>. Required.
	TrustDomain spiffeid.TrustDomain
	// Audience is required of every token; default the trust domain name.
	Audience string
	// CacheTTL is how long a successful review is reused, never past the
	// token's exp claim; default and maximum MaxTokenReviewCacheTTL.
	// Failures are never cached.
	CacheTTL time.Duration
	// MaxCacheEntries bounds the cache; default
	// DefaultTokenReviewCacheEntries.
	MaxCacheEntries int
	// Timeout bounds each TokenReview call; default
	// DefaultTokenReviewTimeout.
	Timeout time.Duration
	// MaxConcurrentReviews bounds the TokenReviews in flight (callers with
	// the same token share one); a new token beyond it is refused at once
	// with ErrUnavailable, so a flood of distinct tokens costs neither
	// unbounded goroutines nor unbounded calls queued on the API server.
	// Cached tokens are unaffected. Default DefaultMaxConcurrentReviews.
	MaxConcurrentReviews int
	// Clock; nil means the real clock.
	Clock clock.Clock
	// Logger; nil discards.
	Logger *slog.Logger
	// Registerer receives the metrics; nil means a private registry.
	Registerer prometheus.Registerer
}

func (c *TokenReviewConfig) setDefaults() error {
	switch {
	case c.Client == nil:
		return errors.New("authn: token review: a Kubernetes client is required")
	case c.TrustDomain.IsZero():
		return errors.New("authn: token review: a trust domain is required")
	case c.CacheTTL < 0 || c.CacheTTL > MaxTokenReviewCacheTTL:
		return fmt.Errorf("authn: token review: cache TTL %s outside [0, %s]", c.CacheTTL, MaxTokenReviewCacheTTL)
	case c.MaxCacheEntries < 0:
		return fmt.Errorf("authn: token review: max cache entries %d is negative", c.MaxCacheEntries)
	case c.Timeout < 0:
		return fmt.Errorf("authn: token review: timeout %s is negative", c.Timeout)
	case c.MaxConcurrentReviews < 0:
		return fmt.Errorf("authn: token review: max concurrent reviews %d is negative", c.MaxConcurrentReviews)
	}
	if c.Audience == "" {
		c.Audience = c.TrustDomain.Name()
	}
	if c.CacheTTL == 0 {
		c.CacheTTL = MaxTokenReviewCacheTTL
	}
	if c.MaxCacheEntries == 0 {
		c.MaxCacheEntries = DefaultTokenReviewCacheEntries
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTokenReviewTimeout
	}
	if c.MaxConcurrentReviews == 0 {
		c.MaxConcurrentReviews = DefaultMaxConcurrentReviews
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	return nil
}

// TokenReview authenticates a Kubernetes service account JWT sent as a
// bearer token, by asking the API server (TokenReview) whether it is valid
// for Audience. Bearer tokens that are not JWTs are left to the next
// authenticator (ErrNoCredentials) and never sent to the API server, so a
// bootstrap token does not end up in its audit log.
//
// A revoked token (deleted service account or pod) stops authenticating
// within CacheTTL plus the API server's own cache of successful token
// authentications (10 seconds by default). Concurrent calls with the same
// token share one review.
type TokenReview struct {
	cfg TokenReviewConfig
	m   *tokenReviewMetrics

	mu       sync.Mutex
	cache    *reviewCache
	inflight map[tokenKey]*reviewCall
}

// reviewCall is one TokenReview shared by every concurrent caller with the
// same token.
type reviewCall struct {
	done    chan struct{}
	ident   Identity
	err     error
	waiters int // callers that joined after the first; guarded by TokenReview.mu
}

var _ Authenticator = (*TokenReview)(nil)

// NewTokenReview validates cfg, applies defaults and registers the metrics.
func NewTokenReview(cfg TokenReviewConfig) (*TokenReview, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	a := &TokenReview{
		cfg:      cfg,
		cache:    newReviewCache(cfg.MaxCacheEntries),
		inflight: make(map[tokenKey]*reviewCall),
	}
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"trust_domain": cfg.TrustDomain.Name()}, cfg.Registerer)
	m, err := newTokenReviewMetrics(reg, a.cacheLen)
	if err != nil {
		return nil, fmt.Errorf("authn: token review metrics: %w", err)
	}
	a.m = m
	return a, nil
}

// Authenticate reviews r.BearerToken, or reuses a cached review of it.
func (a *TokenReview) Authenticate(ctx context.Context, r Request) (Identity, error) {
	token := r.BearerToken
	if token == "" {
		if r.AuthorizationError != nil {
			return Identity{}, invalid(MethodKubernetesJWT, r.AuthorizationError)
		}
		return Identity{}, noCredentials(MethodKubernetesJWT, "no bearer token")
	}
	if len(token) > MaxTokenSize {
		return Identity{}, invalidf(MethodKubernetesJWT, "bearer token is %d bytes, more than %d", len(token), MaxTokenSize)
	}
	info, err := peekJWT(token)
	if err != nil {
		return Identity{}, noCredentials(MethodKubernetesJWT, "bearer token is not a JWT")
	}
	now := a.cfg.Clock.Now()
	if !info.exp.IsZero() && !now.Before(info.exp) {
		// Refused without asking: the token says it has expired. An
		// unverified claim can only make its bearer fail.
		return Identity{}, invalidf(MethodKubernetesJWT, "token expired at %s", info.exp.UTC().Format(time.RFC3339))
	}
	key := tokenKey(sha256.Sum256([]byte(token)))

	a.mu.Lock()
	if ident, ok := a.cache.get(key, now); ok {
		a.mu.Unlock()
		a.m.cacheHits.Inc()
		return ident, nil
	}
	call, shared := a.inflight[key]
	switch {
	case shared:
		call.waiters++
	case len(a.inflight) >= a.cfg.MaxConcurrentReviews:
		a.mu.Unlock()
		a.m.reviews.WithLabelValues(reviewBusy).Inc()
		return Identity{}, fmt.Errorf("authn: %s: %d token reviews in flight: %w", MethodKubernetesJWT, a.cfg.MaxConcurrentReviews, ErrUnavailable)
	default:
		call = &reviewCall{done: make(chan struct{})}
		a.inflight[key] = call
	}
	a.mu.Unlock()

	if !shared {
		// The review outlives a caller that gives up, up to Timeout, so
		// other callers waiting on it are not failed by that one.
		go a.run(context.WithoutCancel(ctx), key, token, info, call, r.Peer)
	}
	select {
	case <-call.done:
	case <-ctx.Done():
		return Identity{}, fmt.Errorf("authn: %s: waiting for token review: %w", MethodKubernetesJWT, ctx.Err())
	}
	if call.err != nil {
		return Identity{}, call.err
	}
	return call.ident, nil
}

// run performs one review, caches a success and releases the waiters.
func (a *TokenReview) run(ctx context.Context, key tokenKey, token string, info jwtInfo, call *reviewCall, peer string) {
	call.ident, call.err = a.review(ctx, token, peer)
	a.mu.Lock()
	delete(a.inflight, key)
	if call.err == nil {
		if until := info.cacheUntil(a.cfg.Clock.Now(), a.cfg.CacheTTL); !until.IsZero() {
			a.cache.put(key, call.ident, until)
		}
	}
	a.mu.Unlock()
	close(call.done)
}

// review asks the API server and checks its answer.
func (a *TokenReview) review(ctx context.Context, token, peer string) (Identity, error) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.Timeout)
	defer cancel()
	tr, err := a.cfg.Client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: []string{a.cfg.Audience}},
	}, metav1.CreateOptions{})
	if err != nil {
		a.m.reviews.WithLabelValues(reviewError).Inc()
		a.cfg.Logger.Warn("token review failed", logattr.Address, peer, logattr.Error, err)
		return Identity{}, fmt.Errorf("authn: %s: token review: %w: %w", MethodKubernetesJWT, err, ErrUnavailable)
	}
	id, result, err := a.check(tr)
	a.m.reviews.WithLabelValues(result).Inc()
	if err != nil {
		a.cfg.Logger.Debug("token refused", logattr.Address, peer, logattr.Error, err)
		return Identity{}, err
	}
	a.cfg.Logger.Debug("token authenticated", logattr.Address, peer, logattr.SPIFFEID, id.String())
	return serviceAccountIdentity(id, tr.Status.User.UID), nil
}

// check turns the API server's answer into an identity, or a refusal and
// its metric label.
func (a *TokenReview) check(tr *authenticationv1.TokenReview) (spiffeid.ID, string, error) {
	st := tr.Status
	switch {
	case st.Error != "":
		// The API server's message names the problem (expired, wrong
		// audience, unknown service account) and does not echo the token.
		return spiffeid.ID{}, reviewUnauthenticated, invalidf(MethodKubernetesJWT, "token review: %s", truncate(st.Error, 256))
	case !st.Authenticated:
		return spiffeid.ID{}, reviewUnauthenticated, invalidf(MethodKubernetesJWT, "token review: not authenticated")
	case !slices.Contains(st.Audiences, a.cfg.Audience):
		// An API server that ignores spec.audiences answers without
		// them; the token may then be meant for anyone.
		return spiffeid.ID{}, reviewRefused, invalidf(MethodKubernetesJWT, "token review: audience %q not confirmed (got %q)", a.cfg.Audience, st.Audiences)
	}
	ns, sa, err := parseServiceAccountUsername(st.User.Username)
	if err != nil {
		return spiffeid.ID{}, reviewRefused, invalid(MethodKubernetesJWT, err)
	}
	id, err := spiffeid.FromSegments(a.cfg.TrustDomain, "ns", ns, "sa", sa)
	if err != nil {
		return spiffeid.ID{}, reviewRefused, invalid(MethodKubernetesJWT, fmt.Errorf("service account %s/%s: %w", ns, sa, err))
	}
	return id, reviewAuthenticated, nil
}

// parseServiceAccountUsername splits system:serviceaccount:<ns>:<sa> and
// checks both names the way the API server validates them.
func parseServiceAccountUsername(u string) (ns, sa string, err error) {
	rest, ok := strings.CutPrefix(u, serviceAccountUsernamePrefix)
	if !ok {
		return "", "", fmt.Errorf("username %q is not a service account", truncate(u, 256))
	}
	ns, sa, ok = strings.Cut(rest, ":")
	if !ok || strings.Contains(sa, ":") {
		return "", "", fmt.Errorf("service account username %q is not system:serviceaccount:<namespace>:<name>", truncate(u, 256))
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return "", "", fmt.Errorf("service account username %q: namespace: %s", truncate(u, 256), strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(sa); len(errs) > 0 {
		return "", "", fmt.Errorf("service account username %q: name: %s", truncate(u, 256), strings.Join(errs, "; "))
	}
	return ns, sa, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func (a *TokenReview) cacheLen() float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return float64(a.cache.len())
}

type tokenReviewMetrics struct {
	reviews   *prometheus.CounterVec
	cacheHits prometheus.Counter
}

func newTokenReviewMetrics(reg prometheus.Registerer, cacheLen func() float64) (*tokenReviewMetrics, error) {
	m := &tokenReviewMetrics{
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_authn_token_reviews_total",
			Help: "TokenReview calls to the Kubernetes API server, by result (authenticated, unauthenticated, refused, error; busy: not made, too many in flight).",
		}, []string{"result"}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_authn_token_review_cache_hits_total",
			Help: "Service account tokens authenticated from a cached TokenReview.",
		}),
	}
	entries := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "trustbridge_authn_token_review_cache_entries",
		Help: "Successful TokenReviews currently cached.",
	}, cacheLen)
	for _, c := range []prometheus.Collector{m.reviews, m.cacheHits, entries} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{reviewAuthenticated, reviewUnauthenticated, reviewRefused, reviewError, reviewBusy} {
		m.reviews.WithLabelValues(r)
	}
	return m, nil
}
