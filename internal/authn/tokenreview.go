package authn

import (
	"cmp"
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
	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
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
	// DefaultMaxReviewsPerPeer is one client address's share of the
	// reviews in flight: an eighth, so that no handful of addresses can
	// take every slot from the rest.
	DefaultMaxReviewsPerPeer = 8
	// DefaultPeerReviewRate and DefaultPeerReviewBurst bound the new
	// (uncached) reviews one client address may cause. A pod renews its
	// certificate a few times a day with one token, so a few new tokens a
	// second from one address is already a whole node restarting.
	DefaultPeerReviewRate  = 5
	DefaultPeerReviewBurst = 20
	// DefaultMaxPeerLimiters bounds the per-address rate limiters kept.
	DefaultMaxPeerLimiters = 10000
)

// serviceAccountUsernamePrefix starts every service account's username.
const serviceAccountUsernamePrefix = "system:serviceaccount:"

// Results of a TokenReview, the label of trustbridge_authn_token_reviews_total.
const (
	reviewAuthenticated   = "authenticated"
	reviewUnauthenticated = "unauthenticated"   // the API server refused the token
	reviewRefused         = "refused"           // authenticated, but not for our audience or not a service account
	reviewError           = "error"             // the call failed
	reviewBusy            = "busy"              // not asked: MaxConcurrentReviews in flight
	reviewPeerBusy        = "peer_busy"         // not asked: the caller's address has MaxReviewsPerPeer in flight
	reviewPeerRateLimited = "peer_rate_limited" // not asked: the caller's address is over PeerReviewRate
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
	// ClusterID, when set, is the name of the cluster whose API server
	// reviews tokens (Istio's CLUSTER_ID, "Kubernetes" by default there):
	// a caller whose ClusterID metadata names another cluster is refused
	// before any review, as istiod refuses a cluster it does not know.
	// Empty accepts any ClusterID: the review alone decides.
	ClusterID string
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
	// MaxReviewsPerPeer bounds the reviews in flight caused by one client
	// address (an IPv4 or IPv6 address); default DefaultMaxReviewsPerPeer.
	MaxReviewsPerPeer int
	// PeerReviewRate and PeerReviewBurst bound the new reviews one client
	// address may cause per second; defaults DefaultPeerReviewRate and
	// DefaultPeerReviewBurst. Cached tokens and tokens already under
	// review cost nothing.
	PeerReviewRate  rate.Limit
	PeerReviewBurst int
	// MaxPeerLimiters bounds the addresses whose rate is remembered;
	// default DefaultMaxPeerLimiters.
	MaxPeerLimiters int
	// OtherIssuers are the "iss" values of tokens another authenticator
	// verifies (the OIDC and remote cluster issuers configured next to
	// this one): such a token is left to it (ErrNoCredentials) without a
	// review, a local check or a ClusterID check, so tokens of other
	// clusters cost the API server nothing and never count against a
	// caller's review rate.
	OtherIssuers []string
	// IssuerKeys fetches the service account issuer discovery documents
	// from the API server (see RESTFetch), so that a token whose signature
	// does not verify against the issuer's keys is refused without a
	// TokenReview. Nil turns signature checks off; claims are still
	// checked. When discovery fails (RBAC, an old cluster) tokens are left
	// to TokenReview, and the failure is logged once.
	IssuerKeys FetchFunc
	// KeysRefreshInterval is the least time between two fetches of the
	// issuer's keys; default DefaultKeysRefreshInterval.
	KeysRefreshInterval time.Duration
	// Clock; nil means the real clock.
	Clock clock.Clock
	// Logger; nil discards.
	Logger *slog.Logger
	// Registerer receives the metrics; nil means a private registry.
	Registerer prometheus.Registerer
}

// setDefaults refuses a config that cannot work, then fills in the defaults
// of the knobs left zero.
func (c *TokenReviewConfig) setDefaults() error {
	if err := c.validate(); err != nil {
		return err
	}
	c.setLimitDefaults()
	c.setReviewDefaults()
	return nil
}

// validate refuses a config without a client or trust domain, or with a
// knob out of its range.
func (c *TokenReviewConfig) validate() error {
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
	case c.MaxConcurrentReviews < 0 || c.MaxReviewsPerPeer < 0 || c.PeerReviewBurst < 0 || c.MaxPeerLimiters < 0:
		return fmt.Errorf("authn: token review: max concurrent reviews (%d), per peer (%d), per-peer burst (%d) and limiter count (%d) must not be negative",
			c.MaxConcurrentReviews, c.MaxReviewsPerPeer, c.PeerReviewBurst, c.MaxPeerLimiters)
	case !(c.PeerReviewRate >= 0) || c.KeysRefreshInterval < 0:
		// !(x >= 0) also refuses NaN, which a limiter treats as no limit.
		return fmt.Errorf("authn: token review: per-peer rate %v and keys refresh interval %s must not be negative", float64(c.PeerReviewRate), c.KeysRefreshInterval)
	}
	return nil
}

// setLimitDefaults fills in the per-peer limits and the keys refresh
// interval left zero.
func (c *TokenReviewConfig) setLimitDefaults() {
	c.MaxReviewsPerPeer = cmp.Or(c.MaxReviewsPerPeer, DefaultMaxReviewsPerPeer)
	c.PeerReviewRate = cmp.Or(c.PeerReviewRate, DefaultPeerReviewRate)
	c.PeerReviewBurst = cmp.Or(c.PeerReviewBurst, DefaultPeerReviewBurst)
	c.MaxPeerLimiters = cmp.Or(c.MaxPeerLimiters, DefaultMaxPeerLimiters)
	c.KeysRefreshInterval = cmp.Or(c.KeysRefreshInterval, DefaultKeysRefreshInterval)
}

// setReviewDefaults fills in the audience, cache, timeout and concurrency
// left zero, and the clock, logger and registerer left nil.
func (c *TokenReviewConfig) setReviewDefaults() {
	c.Audience = cmp.Or(c.Audience, c.TrustDomain.Name())
	c.CacheTTL = cmp.Or(c.CacheTTL, MaxTokenReviewCacheTTL)
	c.MaxCacheEntries = cmp.Or(c.MaxCacheEntries, DefaultTokenReviewCacheEntries)
	c.Timeout = cmp.Or(c.Timeout, DefaultTokenReviewTimeout)
	c.MaxConcurrentReviews = cmp.Or(c.MaxConcurrentReviews, DefaultMaxConcurrentReviews)
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
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
//
// A review is a call to the API server that anyone able to open a TLS
// connection can cause, so before one is made the token must look like a
// service account token for our audience (checkTokenClaims: algorithm,
// issuer, times, audience, subject) and, when the issuer's keys are known,
// carry a valid signature; random JWT-shaped tokens never reach the API
// server. What is left is shared fairly: each client address may have
// MaxReviewsPerPeer reviews in flight and start PeerReviewRate a second,
// and every refusal for want of room is ErrUnavailable at once (the
// client retries), counted, and logged at a bounded rate.
type TokenReview struct {
	cfg   TokenReviewConfig
	m     *tokenReviewMetrics
	keys  *issuerKeys
	rates *ratelimit.Keyed
	// netRates is the rate of an IPv6 /64 as a whole: netShare times an
	// address's.
	netRates *ratelimit.Keyed
	logLim   *ratelimit.LogLimiter

	mu       sync.Mutex
	cache    *reviewCache
	inflight map[tokenKey]*reviewCall
	perPeer  map[string]int // reviews in flight by peerKey; guarded by mu
}

// reviewCall is one TokenReview shared by every concurrent caller with the
// same token.
type reviewCall struct {
	done    chan struct{}
	ident   Identity
	err     error
	waiters int    // callers that joined after the first; guarded by TokenReview.mu
	peer    string // peerKey of the caller that started it, whose share it holds
	net     string // peerNet of that caller ("" for IPv4), whose share it holds too
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
		perPeer:  make(map[string]int),
		rates:    ratelimit.NewKeyed(cfg.PeerReviewRate, cfg.PeerReviewBurst, cfg.MaxPeerLimiters),
		netRates: ratelimit.NewKeyed(netShare*cfg.PeerReviewRate, netShare*cfg.PeerReviewBurst, cfg.MaxPeerLimiters),
		logLim:   ratelimit.NewDefaultLogLimiter(),
	}
	if cfg.IssuerKeys != nil {
		a.keys = newIssuerKeys(cfg.IssuerKeys, cfg.Clock, cfg.KeysRefreshInterval, cfg.Logger)
	}
	reg := prometheus.WrapRegistererWith(prometheus.Labels{"trust_domain": cfg.TrustDomain.Name()}, cfg.Registerer)
	m, err := newTokenReviewMetrics(reg, a.cacheLen, a.keys.count)
	if err != nil {
		return nil, fmt.Errorf("authn: token review metrics: %w", err)
	}
	a.m = m
	return a, nil
}

// Run fetches the issuer's keys once at start, so that whether tokens are
// checked locally is logged when the server starts rather than at the
// first caller, then waits for ctx. Without IssuerKeys it only waits.
func (a *TokenReview) Run(ctx context.Context) error {
	if a.keys != nil {
		a.keys.current(ctx, false)
	}
	<-ctx.Done()
	return nil
}

// Authenticate reviews r.BearerToken, or reuses a cached review of it.
func (a *TokenReview) Authenticate(ctx context.Context, r Request) (Identity, error) {
	token, info, err := a.precheck(r)
	if err != nil {
		return Identity{}, err
	}
	key := tokenKey(sha256.Sum256([]byte(token)))
	if ident, call, ok := a.lookup(key); ok {
		a.m.cacheHits.Inc()
		return ident, nil
	} else if call != nil {
		return a.wait(ctx, call)
	}
	lt, err := a.checkLocally(ctx, token, r.Peer)
	if err != nil {
		return Identity{}, err
	}
	call, started, err := a.start(key, r.Peer)
	if err != nil {
		return Identity{}, err
	}
	if started {
		// The review outlives a caller that gives up, up to Timeout, so
		// other callers waiting on it are not failed by that one.
		go a.run(context.WithoutCancel(ctx), key, token, info, lt.exp, call, r.Peer)
	}
	return a.wait(ctx, call)
}

// precheck takes the token out of r and refuses, without any call, what
// is not a JWT (left to the next authenticator) or cannot be a valid one.
func (a *TokenReview) precheck(r Request) (string, jwtInfo, error) {
	token := r.BearerToken
	if token == "" {
		if r.AuthorizationError != nil {
			return "", jwtInfo{}, invalid(MethodKubernetesJWT, r.AuthorizationError)
		}
		return "", jwtInfo{}, noCredentials(MethodKubernetesJWT, "no bearer token")
	}
	if len(token) > MaxTokenSize {
		return "", jwtInfo{}, invalidf(MethodKubernetesJWT, "bearer token is %d bytes, more than %d", len(token), MaxTokenSize)
	}
	info, err := peekJWT(token)
	if err != nil {
		return "", jwtInfo{}, noCredentials(MethodKubernetesJWT, "bearer token is not a JWT")
	}
	if info.iss != "" && slices.Contains(a.cfg.OtherIssuers, info.iss) {
		return "", jwtInfo{}, noCredentials(MethodKubernetesJWT, "token of an issuer verified by another authenticator")
	}
	if err := a.checkCluster(r.ClusterIDs); err != nil {
		a.m.local.WithLabelValues(localRefusedCluster).Inc()
		return "", jwtInfo{}, invalid(MethodKubernetesJWT, err)
	}
	now := a.cfg.Clock.Now()
	if !info.exp.IsZero() && !now.Before(info.exp) {
		// Refused without asking: the token says it has expired. An
		// unverified claim can only make its bearer fail.
		a.m.local.WithLabelValues(localRefusedTime).Inc()
		return "", jwtInfo{}, invalidf(MethodKubernetesJWT, "token expired at %s", info.exp.UTC().Format(time.RFC3339))
	}
	return token, info, nil
}

// checkCluster judges the caller's ClusterID metadata as istiod does: none
// means the local cluster; one naming a cluster other than ClusterID (when
// set) is refused, since only ClusterID's API server reviews tokens here.
// Several values are refused too: they would let two readers disagree.
func (a *TokenReview) checkCluster(ids []string) error {
	switch {
	case len(ids) > 1:
		return fmt.Errorf("ClusterID metadata has %d values, want one", len(ids))
	case len(ids) == 0 || a.cfg.ClusterID == "" || ids[0] == a.cfg.ClusterID:
		return nil
	}
	return fmt.Errorf("client claims to be in cluster %q, but this server only reviews tokens of cluster %q (--cluster-id)",
		truncate(ids[0], 64), a.cfg.ClusterID)
}

// lookup answers from the cache, or finds a review of the same token in
// flight to join (ok false, call set).
func (a *TokenReview) lookup(key tokenKey) (Identity, *reviewCall, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ident, ok := a.cache.get(key, a.cfg.Clock.Now()); ok {
		return ident, nil, true
	}
	if call, ok := a.inflight[key]; ok {
		call.waiters++
		return Identity{}, call, false
	}
	return Identity{}, nil, false
}

// checkLocally checks the claims, then the signature when the issuer's
// keys are known, and returns what it read. A refusal is counted, logged
// at Debug (a flood of bad tokens is the caller's business, not the
// operator's) and never reaches the API server.
func (a *TokenReview) checkLocally(ctx context.Context, token, peer string) (localToken, error) {
	lt, ref := checkTokenClaims(token, a.cfg.Audience, a.cfg.Clock.Now())
	var outcome verifyOutcome
	if ref == nil {
		switch outcome, ref = a.keys.verify(ctx, token, lt); outcome {
		case sigVerified:
			a.m.local.WithLabelValues(localVerified).Inc()
		case sigUnverifiable:
			a.m.local.WithLabelValues(localUnverified).Inc()
		}
	}
	if ref != nil {
		a.m.local.WithLabelValues(ref.reason).Inc()
		a.cfg.Logger.Debug("token refused before review", logattr.Address, peer, "reason", ref.reason, logattr.Error, ref.err)
		if outcome == sigNotYet {
			return localToken{}, fmt.Errorf("authn: %s: %w: %w", MethodKubernetesJWT, ref, ErrUnavailable)
		}
		return localToken{}, invalid(MethodKubernetesJWT, ref)
	}
	return lt, nil
}

// start registers a new review of key for peer, or joins one another
// caller started meanwhile (started false). It refuses with ErrUnavailable
// when peer is over its share or rate, or every slot is taken.
func (a *TokenReview) start(key tokenKey, peer string) (*reviewCall, bool, error) {
	pk, nk := peerKey(peer), peerNet(peer)
	a.mu.Lock()
	defer a.mu.Unlock()
	if call, ok := a.inflight[key]; ok {
		call.waiters++
		return call, false, nil
	}
	now := a.cfg.Clock.Now()
	var result, why string
	switch {
	case a.perPeer[pk] >= a.cfg.MaxReviewsPerPeer:
		result, why = reviewPeerBusy, fmt.Sprintf("%d token reviews in flight for this client address", a.cfg.MaxReviewsPerPeer)
	case nk != "" && a.perPeer[nk] >= netShare*a.cfg.MaxReviewsPerPeer:
		result, why = reviewPeerBusy, fmt.Sprintf("%d token reviews in flight for this client's IPv6 network", netShare*a.cfg.MaxReviewsPerPeer)
	case len(a.inflight) >= a.cfg.MaxConcurrentReviews:
		result, why = reviewBusy, fmt.Sprintf("%d token reviews in flight", a.cfg.MaxConcurrentReviews)
	case !a.rates.Allow(pk, now) || nk != "" && !a.netRates.Allow(nk, now):
		// Last, so that a refusal for want of a slot does not also spend
		// the caller's rate.
		result, why = reviewPeerRateLimited, fmt.Sprintf("more than %v new token reviews a second from this client address", float64(a.cfg.PeerReviewRate))
	default:
		call := &reviewCall{done: make(chan struct{}), peer: pk, net: nk}
		a.inflight[key] = call
		a.perPeer[pk]++
		if nk != "" {
			a.perPeer[nk]++
		}
		return call, true, nil
	}
	a.m.reviews.WithLabelValues(result).Inc()
	a.cfg.Logger.Log(context.Background(), a.logLim.Level(slog.LevelWarn), "token review refused: no room", "reason", result, logattr.Address, peer)
	return nil, false, fmt.Errorf("authn: %s: %s: %w", MethodKubernetesJWT, why, ErrUnavailable)
}

// wait waits for call, or for the caller to give up.
func (a *TokenReview) wait(ctx context.Context, call *reviewCall) (Identity, error) {
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
// exp is the token's, as checkLocally read it: the identity's NotAfter,
// shared by every caller of the call and of the cache entry, all of whom
// presented this very token.
func (a *TokenReview) run(ctx context.Context, key tokenKey, token string, info jwtInfo, exp time.Time, call *reviewCall, peer string) {
	call.ident, call.err = a.review(ctx, token, peer)
	if call.err == nil {
		call.ident.NotAfter = exp
	}
	a.mu.Lock()
	delete(a.inflight, key)
	keys := []string{call.peer}
	if call.net != "" {
		keys = append(keys, call.net)
	}
	for _, k := range keys {
		if a.perPeer[k]--; a.perPeer[k] <= 0 {
			delete(a.perPeer, k)
		}
	}
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
		a.cfg.Logger.Log(ctx, a.logLim.Level(slog.LevelWarn), "token review failed", logattr.Address, peer, logattr.Error, err)
		return Identity{}, fmt.Errorf("authn: %s: token review: %w: %w", MethodKubernetesJWT, err, ErrUnavailable)
	}
	id, result, err := a.check(tr)
	a.m.reviews.WithLabelValues(result).Inc()
	if err != nil {
		a.cfg.Logger.Debug("token refused", logattr.Address, peer, logattr.Error, err)
		return Identity{}, err
	}
	a.cfg.Logger.Debug("token authenticated", logattr.Address, peer, logattr.SPIFFEID, id.String())
	ident := serviceAccountIdentity(id, tr.Status.User.UID)
	ident.Pod = boundPod(tr.Status.User.Extra, id)
	return ident, nil
}

// Extra keys of a TokenReview for a token bound to a pod.
const (
	extraPodName = "authentication.kubernetes.io/pod-name"
	extraPodUID  = "authentication.kubernetes.io/pod-uid"
)

// boundPod is the pod the API server says the token is bound to, in the
// service account's namespace; zero unless both name and UID are there,
// once each.
func boundPod(extra map[string]authenticationv1.ExtraValue, id spiffeid.ID) PodRef {
	name, uid := extra[extraPodName], extra[extraPodUID]
	ns, _, ok := ServiceAccountOf(id)
	if !ok || len(name) != 1 || len(uid) != 1 || name[0] == "" || uid[0] == "" {
		return PodRef{}
	}
	return PodRef{Namespace: ns, Name: name[0], UID: uid[0]}
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
	local     *prometheus.CounterVec
	cacheHits prometheus.Counter
}

func newTokenReviewMetrics(reg prometheus.Registerer, cacheLen func() float64, keys func() int) (*tokenReviewMetrics, error) {
	m := &tokenReviewMetrics{
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_authn_token_reviews_total",
			Help: "TokenReview calls to the Kubernetes API server, by result (authenticated, unauthenticated, refused, error; not made, refused with Unavailable: busy, too many in flight; peer_busy, too many in flight for the caller's address; peer_rate_limited, the caller's address over its rate).",
		}, []string{"result"}),
		local: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_authn_token_local_checks_total",
			Help: "Service account tokens checked before a TokenReview, by result (verified: signature good; unverified: claims good, no issuer keys; refused_*: never reviewed, by reason: alg, claims, time, audience, subject, unknown_key, signature).",
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
	issuerKeys := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "trustbridge_authn_token_issuer_keys",
		Help: "Service account issuer public keys known from issuer discovery; 0: signatures are not checked before TokenReview.",
	}, func() float64 { return float64(keys()) })
	for _, c := range []prometheus.Collector{m.reviews, m.local, m.cacheHits, entries, issuerKeys} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	for _, r := range []string{reviewAuthenticated, reviewUnauthenticated, reviewRefused, reviewError, reviewBusy, reviewPeerBusy, reviewPeerRateLimited} {
		m.reviews.WithLabelValues(r)
	}
	for _, r := range []string{localVerified, localUnverified, localRefusedAlg, localRefusedClaims, localRefusedTime,
		localRefusedAudience, localRefusedSubject, localRefusedKey, localRefusedSignature, localRefusedCluster} {
		m.local.WithLabelValues(r)
	}
	return m, nil
}
