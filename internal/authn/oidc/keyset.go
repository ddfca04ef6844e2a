package oidc

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// Errors of keySet.Keys.
var (
	// ErrUnknownKey: the token's kid is not in the issuer's key set, even
	// after the refetch allowed now.
	ErrUnknownKey = errors.New("unknown key id")
	// ErrKeysUnavailable: the keys were never fetched successfully, or the
	// last success is older than the key set's maxKeyAge.
	ErrKeysUnavailable = errors.New("issuer keys unavailable")
)

// Defaults and limits of a remote issuer's key set.
const (
	// wellKnownPath is where OpenID Connect Discovery §4 puts the
	// configuration, below the issuer URL.
	wellKnownPath = "/.well-known/openid-configuration"
	// defaultKeyRefreshInterval is the least time between two fetches
	// that unknown kids or failures cause: a stream of tokens with junk
	// kids costs the issuer one request per interval.
	defaultKeyRefreshInterval = 30 * time.Second
	// defaultMaxKeyAge is how long keys are used after the last fetch
	// that brought them while fetches fail; past it tokens are refused
	// (fail closed), since a key the issuer revoked would otherwise stay
	// trusted for as long as the outage lasts.
	defaultMaxKeyAge = 24 * time.Hour
	// defaultKeyFreshness applies when the JWKS response has no cache
	// headers; maxKeyFreshness caps what the headers ask for.
	defaultKeyFreshness = 5 * time.Minute
	maxKeyFreshness     = 24 * time.Hour
)

// keySetConfig configures a keySet. Zero durations take the defaults.
type keySetConfig struct {
	name, issuer    string         // issuer: https URL exactly as configured (tokens' iss)
	roots           *x509.CertPool // nil: system roots
	allowPrivate    bool
	refreshInterval time.Duration // least time between fetches caused by unknown kids / failed fetches
	maxKeyAge       time.Duration
	clock           clock.PassiveClock
	logger          *slog.Logger
	metrics         *keyMetrics  // may be nil
	client          *http.Client // nil: built from roots/allowPrivate
}

// keySet holds one remote issuer's signing keys, fetched through OpenID
// Connect Discovery and kept as long as the JWKS response's cache
// headers allow. It starts no goroutine of its own: a fetch runs when a
// caller needs one, and every caller needing it waits for that one fetch.
type keySet struct {
	cfg       keySetConfig
	wellKnown string // discovery document URL

	mu          sync.Mutex
	keys        []jose.JSONWebKey // empty: none usable
	lastFetch   time.Time         // start of the last fetch; zero: never
	lastSuccess time.Time         // start of the last fetch that succeeded
	freshUntil  time.Time         // keys are refetched on the first use after it
	lastErr     error             // of the last fetch
	fetching    chan struct{}     // closed when the fetch in flight ends; nil: none
	logged      keySetState       // the state last logged
}

// keySetStatus is a key set's state, for status pages.
type keySetStatus struct {
	Keys                               int
	LastFetch, LastSuccess, FreshUntil time.Time
	LastError                          string
}

// newKeySet checks cfg and applies its defaults; it fetches nothing.
func newKeySet(cfg keySetConfig) (*keySet, error) {
	if err := checkKeySetIssuer(cfg.issuer); err != nil {
		return nil, err
	}
	if cfg.refreshInterval <= 0 {
		cfg.refreshInterval = defaultKeyRefreshInterval
	}
	if cfg.maxKeyAge <= 0 {
		cfg.maxKeyAge = defaultMaxKeyAge
	}
	if cfg.clock == nil {
		cfg.clock = clock.RealClock{}
	}
	if cfg.logger == nil {
		cfg.logger = slog.New(slog.DiscardHandler)
	}
	if cfg.client == nil {
		cfg.client = newKeyClient(cfg.roots, cfg.allowPrivate)
	}
	cfg.metrics.init(cfg.name)
	return &keySet{cfg: cfg, wellKnown: strings.TrimSuffix(cfg.issuer, "/") + wellKnownPath}, nil
}

// checkKeySetIssuer refuses an issuer URL OpenID Connect Discovery §3
// does not allow: https, a host, no query or fragment; and no userinfo,
// which would be sent to whatever host the URL names.
func checkKeySetIssuer(s string) error {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Errorf("issuer URL: %w", err)
	case u.Scheme != "https":
		return fmt.Errorf("issuer URL %q: scheme must be https", s)
	case u.User != nil:
		return fmt.Errorf("issuer URL %q: must not contain userinfo", u.Redacted())
	case u.Hostname() == "":
		return fmt.Errorf("issuer URL %q: host is missing", s)
	case u.RawQuery != "" || u.ForceQuery:
		return fmt.Errorf("issuer URL %q: must not have a query", s)
	case u.Fragment != "" || strings.Contains(s, "#"):
		return fmt.Errorf("issuer URL %q: must not have a fragment", s)
	}
	return nil
}

// Keys returns the keys with that kid, or all of them when kid is empty.
// It fetches first when no keys are held, they are stale, or kid is not
// among them, unless a fetch started less than refreshInterval ago; a
// caller waits for at most one fetch, and no longer than ctx allows.
// Errors wrap ErrUnknownKey or ErrKeysUnavailable.
func (k *keySet) Keys(ctx context.Context, kid string) ([]jose.JSONWebKey, error) {
	if wait := k.fetchFor(kid); wait != nil {
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: gave up waiting for a key fetch: %w", ErrKeysUnavailable, ctx.Err())
		}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.expireLocked(k.cfg.clock.Now())
	return k.selectLocked(kid)
}

// fetchFor returns the fetch a caller asking for kid must wait for: the
// one in flight, or one it starts now. It returns nil when the keys held
// answer for sure, or when they do not but no fetch is allowed yet.
func (k *keySet) fetchFor(kid string) <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	now := k.cfg.clock.Now()
	k.expireLocked(now)
	if len(k.keys) > 0 && now.Before(k.freshUntil) && (kid == "" || slices.ContainsFunc(k.keys, hasKID(kid))) {
		return nil
	}
	if k.fetching == nil && (k.lastFetch.IsZero() || now.Sub(k.lastFetch) >= k.cfg.refreshInterval) {
		k.fetching, k.lastFetch = make(chan struct{}), now
		go k.fetch(k.fetching, now)
	}
	if k.fetching == nil {
		return nil
	}
	return k.fetching
}

func hasKID(kid string) func(jose.JSONWebKey) bool {
	return func(j jose.JSONWebKey) bool { return j.KeyID == kid }
}

// selectLocked answers from the keys held.
func (k *keySet) selectLocked(kid string) ([]jose.JSONWebKey, error) {
	if len(k.keys) == 0 {
		return nil, k.unavailableLocked()
	}
	if kid == "" {
		return slices.Clone(k.keys), nil
	}
	var out []jose.JSONWebKey
	for _, j := range k.keys {
		if j.KeyID == kid {
			out = append(out, j)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w %q: not one of the issuer's %d keys (fetched at %s; refetched for an unknown key id at most every %s)",
			ErrUnknownKey, clipRemote(kid, 64), len(k.keys), k.lastSuccess.UTC().Format(time.RFC3339), k.cfg.refreshInterval)
	}
	return out, nil
}

// unavailableLocked says why no keys are held.
func (k *keySet) unavailableLocked() error {
	switch {
	case k.lastSuccess.IsZero() && k.lastErr == nil:
		return fmt.Errorf("%w: not fetched yet", ErrKeysUnavailable)
	case k.lastSuccess.IsZero():
		return fmt.Errorf("%w: %v", ErrKeysUnavailable, k.lastErr)
	case k.lastErr == nil:
		return fmt.Errorf("%w: the last good keys, fetched at %s, are older than %s", ErrKeysUnavailable,
			k.lastSuccess.UTC().Format(time.RFC3339), k.cfg.maxKeyAge)
	default:
		return fmt.Errorf("%w: the last good keys, fetched at %s, are older than %s, and fetching fails: %v", ErrKeysUnavailable,
			k.lastSuccess.UTC().Format(time.RFC3339), k.cfg.maxKeyAge, k.lastErr)
	}
}

// expireLocked drops keys whose last successful fetch is maxKeyAge ago.
func (k *keySet) expireLocked(now time.Time) {
	if len(k.keys) == 0 || now.Sub(k.lastSuccess) < k.cfg.maxKeyAge {
		return
	}
	k.keys = nil
	k.cfg.metrics.held(k.cfg.name, 0)
	k.logStateLocked()
}

// fetch loads the keys and closes done once the outcome is recorded. Its
// context is its own: the caller that started it may give up, the others
// still want the answer.
func (k *keySet) fetch(done chan struct{}, started time.Time) {
	ctx, cancel := context.WithTimeout(context.Background(), keyFetchTimeout)
	keys, freshFor, err := k.load(ctx)
	if err != nil && errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("no complete answer within %s: %w", keyFetchTimeout, err)
	}
	cancel()
	k.mu.Lock()
	k.recordLocked(started, keys, freshFor, err)
	k.fetching = nil
	k.mu.Unlock()
	close(done)
}

// recordLocked applies a fetch's outcome: a failure keeps the keys held.
func (k *keySet) recordLocked(started time.Time, keys []jose.JSONWebKey, freshFor time.Duration, err error) {
	k.lastErr = err
	if err == nil {
		k.keys, k.lastSuccess = keys, started
		k.freshUntil = k.cfg.clock.Now().Add(freshFor)
	}
	k.cfg.metrics.fetched(k.cfg.name, err, len(k.keys), k.lastSuccess)
	k.logStateLocked()
}

// load fetches the discovery document, then the key set it names.
func (k *keySet) load(ctx context.Context) ([]jose.JSONWebKey, time.Duration, error) {
	body, _, err := k.get(ctx, k.wellKnown, maxDiscoveryBytes)
	if err != nil {
		return nil, 0, err
	}
	jwksURL, err := parseDiscovery(body, k.cfg.issuer)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", k.wellKnown, err)
	}
	body, header, err := k.get(ctx, jwksURL, maxJWKSBytes)
	if err != nil {
		return nil, 0, err
	}
	keys, err := authn.ParseJWKS(body)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", jwksURL, err)
	}
	return keys, keysFreshFor(header, k.cfg.clock.Now(), k.cfg.refreshInterval), nil
}

// Status reports the key set's state.
func (k *keySet) Status() keySetStatus {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.expireLocked(k.cfg.clock.Now())
	s := keySetStatus{Keys: len(k.keys), LastFetch: k.lastFetch, LastSuccess: k.lastSuccess, FreshUntil: k.freshUntil}
	if k.lastErr != nil {
		s.LastError = k.lastErr.Error()
	}
	return s
}

// keySetState is what the logs were last told.
type keySetState int

const (
	keysNotFetched  keySetState = iota
	keysOK                      // the last fetch succeeded
	keysKept                    // the last fetch failed; the last good keys are used
	keysUnavailable             // no usable keys: tokens are refused
)

func (k *keySet) stateLocked() keySetState {
	switch {
	case len(k.keys) > 0 && k.lastErr == nil:
		return keysOK
	case len(k.keys) > 0:
		return keysKept
	case k.lastErr == nil && k.lastSuccess.IsZero():
		return keysNotFetched
	default:
		return keysUnavailable
	}
}

// logStateLocked logs a change of state once: at Warn when tokens of the
// issuer may be refused or keys are kept past a failure, at Info when
// keys arrive. Repeats of a state are at Debug.
func (k *keySet) logStateLocked() {
	state, prev := k.stateLocked(), k.logged
	k.logged = state
	log := k.cfg.logger.With(logattr.Issuer, k.cfg.name, logattr.IssuerURL, k.cfg.issuer, logattr.Keys, len(k.keys))
	switch {
	case state == prev && k.lastErr != nil:
		log.Debug("issuer key fetch failed again", logattr.Error, k.lastErr)
	case state == prev:
		log.Debug("issuer keys fetched")
	case state == keysOK && prev == keysNotFetched:
		log.Info("issuer keys fetched")
	case state == keysOK:
		log.Info("issuer keys fetched again: the issuer's tokens are checked against its current keys")
	case state == keysKept:
		log.Warn("issuer key fetch failed: its tokens are checked against the last good keys until they are "+k.cfg.maxKeyAge.String()+" old",
			logattr.Error, k.lastErr)
	case state == keysUnavailable:
		log.Warn("issuer keys unavailable: its tokens are refused until a key fetch succeeds", logattr.Error, k.unavailableLocked())
	}
}
