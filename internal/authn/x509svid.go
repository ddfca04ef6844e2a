package authn

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/ratelimit"
	"github.com/trustbridge/trustbridge/internal/svidcheck"
)

// maxPeerChain bounds the certificates a client may send. SVID chains are a
// leaf and a few intermediates; nested SPIRE deployments add one per
// level, so the bound is not lower. With checkChainBounds (distinct
// subjects, CA intermediates, bounded keys) the work of verifying a chain
// grows linearly with its length, so eight costs at most a few
// milliseconds of CPU.
const maxPeerChain = 8

// Default bounds on verifications in flight: a verification is a few
// signature checks of CPU, so a handful per client address is plenty for
// agents that renew several workloads at once, and the global bound keeps
// unauthenticated work to a few cores' worth however many addresses an
// attacker has.
const (
	DefaultMaxVerificationsPerPeer = 4
	DefaultMaxVerifications        = 32
)

// X509SVID authenticates a caller by its mTLS client certificate: an
// X509-SVID of the local trust domain that verifies against the local roots
// as they are at the time of the call. SVIDs of federated trust domains
// never authenticate, even if their roots are in the source: only the local
// trust domain's bundle is asked for.
//
// Verifying a chain the caller sent is work done before the caller proved
// anything, so it is bounded four ways: checkChainBounds refuses chains
// that would be expensive before any signature is checked; successes and
// failures are cached by the chain's digest and the bundle pointer, so a
// replayed chain costs a map lookup; at most MaxVerificationsPerPeer
// verifications run at once per client address (an IPv4 or IPv6 address)
// and MaxVerifications in total, beyond which a call is refused at once
// with ErrUnavailable (the client retries); and callers whose chain is
// cached never wait for those slots.
//
// The caches also make verification once per connection and bundle: TLS
// fixes the client's chain for the life of a connection (session tickets
// are off and renegotiation is not offered), so every call on it presents
// the same digest and, until the local roots change, hits the entry the
// first call left. Memoizing on the connection itself would save only the
// digest, and would need the transport's credentials wrapped.
type X509SVID struct {
	td          spiffeid.TrustDomain
	roots       x509bundle.Source
	clk         clock.PassiveClock
	cacheSize   int
	cache       *verifyCache
	failureSize int
	failureTTL  time.Duration
	failures    *failureCache
	perPeer     int
	global      int
	gate        *peerGate
	logger      *slog.Logger
	logLim      *ratelimit.LogLimiter
	m           *x509Metrics
	// ownIssuer, when set, says whether a leaf's issuer is one of this
	// server's own signing certificates (WithOwnIssuers).
	ownIssuer func(*x509.Certificate) bool
	// verify is svidcheck.Verify, trustbridge's one X509-SVID chain
	// check (federation/trust's Verifier runs the same); tests count the
	// calls.
	verify func([]*x509.Certificate, x509bundle.Source, x509.ExtKeyUsage, ...x509svid.VerifyOption) (spiffeid.ID, [][]*x509.Certificate, error)
}

var _ Authenticator = (*X509SVID)(nil)

// X509SVIDOption changes how NewX509SVID builds an authenticator.
type X509SVIDOption interface {
	apply(*X509SVID)
}

type x509SVIDOption func(*X509SVID)

func (o x509SVIDOption) apply(a *X509SVID) { o(a) }

// WithVerifyCacheSize bounds the verified chains remembered (default
// DefaultVerifyCacheSize); zero or less turns the cache off, so that every
// call verifies its chain.
func WithVerifyCacheSize(n int) X509SVIDOption {
	return x509SVIDOption(func(a *X509SVID) { a.cacheSize = n })
}

// WithFailureCache bounds the failed chains remembered and for how long
// (defaults DefaultFailureCacheSize, DefaultFailureCacheTTL); a size or
// TTL of zero or less turns it off.
func WithFailureCache(size int, ttl time.Duration) X509SVIDOption {
	return x509SVIDOption(func(a *X509SVID) { a.failureSize, a.failureTTL = size, ttl })
}

// WithMaxVerifications bounds the verifications in flight per client
// address and in total (defaults DefaultMaxVerificationsPerPeer,
// DefaultMaxVerifications); values below 1 mean the default.
func WithMaxVerifications(perPeer, global int) X509SVIDOption {
	return x509SVIDOption(func(a *X509SVID) { a.perPeer, a.global = perPeer, global })
}

// WithLogger sets where throttled calls are reported (rate-limited, the
// rest at Debug); nil discards.
func WithLogger(l *slog.Logger) X509SVIDOption {
	return x509SVIDOption(func(a *X509SVID) { a.logger = l })
}

// WithOwnIssuers makes the grant record (GrantOID) of a leaf count only
// when own reports that the leaf's issuer, the certificate above it in the
// verified chain, is one of this server's own signing certificates (a CA's
// IssuedHere). Every certificate that verifies against the local roots
// authenticates, but not every one was signed by this server: a downstream
// intermediate of the trust domain, or in upstream mode the upstream
// itself, can write any grant record into a leaf of any identity. Such a
// leaf authenticates with a GrantErr wrapping ErrNotIssuedHere, so a
// GrantPolicy refuses it what needs a grant. own is asked on every call,
// cached chains included, so a rotation of the server's signing
// certificates takes effect at once; it must be cheap and safe for
// concurrent use. Without the option every verified leaf's grant is read,
// for verifiers with no CA of their own.
func WithOwnIssuers(own func(issuer *x509.Certificate) bool) X509SVIDOption {
	return x509SVIDOption(func(a *X509SVID) { a.ownIssuer = own })
}

// NewX509SVID returns an authenticator for X509-SVIDs of td. roots is asked
// for td's bundle on every call, so rotated roots take effect at once. A nil
// clk means the real clock. Its metrics exist from the start; Register
// publishes them.
//
// Successful verifications are cached, keyed by the presented chain (every
// certificate's DER) and by the *x509bundle.Bundle pointer roots returned,
// until the earliest NotAfter in the verified chain, checked against clk on
// every call. This relies on a contract with roots: it returns the same
// pointer for as long as td's roots are unchanged, a new one when they
// change, and never changes a bundle it has returned (x509bundle.Set
// behaves so when whole bundles are replaced with Add). A source that
// builds a new bundle on every call is still correct, it just never hits
// the cache. The root that anchored a cached chain is also looked up in
// the current bundle on every hit, so a root removed from the bundle stops
// authenticating at once even if the pointer stayed the same. Failures are
// cached under the same key for a short TTL: new roots are a new pointer,
// so a chain refused under the old roots is verified again.
func NewX509SVID(td spiffeid.TrustDomain, roots x509bundle.Source, clk clock.PassiveClock, opts ...X509SVIDOption) *X509SVID {
	if clk == nil {
		clk = clock.RealClock{}
	}
	a := &X509SVID{
		td: td, roots: roots, clk: clk, verify: svidcheck.Verify,
		cacheSize: DefaultVerifyCacheSize, failureSize: DefaultFailureCacheSize, failureTTL: DefaultFailureCacheTTL,
	}
	for _, o := range opts {
		o.apply(a)
	}
	if a.perPeer < 1 {
		a.perPeer = DefaultMaxVerificationsPerPeer
	}
	if a.global < 1 {
		a.global = DefaultMaxVerifications
	}
	if a.logger == nil {
		a.logger = slog.New(slog.DiscardHandler)
	}
	a.cache = newVerifyCache(a.cacheSize)
	a.failures = newFailureCache(a.failureSize, a.failureTTL)
	a.gate = newPeerGate(a.perPeer, a.global)
	a.logLim = ratelimit.NewDefaultLogLimiter()
	a.m = newX509Metrics(a.failures.len)
	return a
}

// Register publishes the authenticator's metrics on reg, labelled with the
// trust domain.
func (a *X509SVID) Register(reg prometheus.Registerer) error {
	reg = prometheus.WrapRegistererWith(prometheus.Labels{"trust_domain": a.td.Name()}, reg)
	for _, c := range a.m.collectors() {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("authn: %s metrics: %w", MethodX509SVID, err)
		}
	}
	return nil
}

// Authenticate verifies r.PeerCertificates. It reports ErrNoCredentials only
// when no certificate was sent.
func (a *X509SVID) Authenticate(_ context.Context, r Request) (Identity, error) {
	certs := r.PeerCertificates
	id, err := a.precheck(certs)
	if err != nil {
		return Identity{}, err
	}
	bundle, err := a.roots.GetX509BundleForTrustDomain(a.td)
	if err != nil {
		return Identity{}, invalid(MethodX509SVID, fmt.Errorf("local roots: %w", err))
	}
	if bundle == nil || len(bundle.X509Authorities()) == 0 {
		return Identity{}, invalid(MethodX509SVID, errors.New("local trust domain has no X.509 roots"))
	}
	issuer, grant, err := a.verifyChain(certs, id, bundle, r.Peer)
	if err != nil {
		return Identity{}, err
	}
	ident := svidIdentity(id, certs[0], grant)
	if a.ownIssuer != nil && (issuer == nil || !a.ownIssuer(issuer)) {
		ident.Grant, ident.GrantErr = nil, notIssuedHere(issuer)
	}
	return ident, nil
}

// notIssuedHere is the GrantErr of a leaf whose issuer is not one of the
// server's own signing certificates. The issuer's subject is the caller's
// to choose (a downstream's CSR, an upstream's naming), so it is quoted
// and bounded.
func notIssuedHere(issuer *x509.Certificate) error {
	subject := "no certificate"
	if issuer != nil {
		subject = truncate(issuer.Subject.String(), 128)
	}
	return fmt.Errorf("%w: issued by %q, so its grant record is not this server's; renew at the CA that issued it", ErrNotIssuedHere, subject)
}

// precheck refuses, without checking any signature, what cannot be an
// X509-SVID chain of the local trust domain, or would cost too much to
// verify.
func (a *X509SVID) precheck(certs []*x509.Certificate) (spiffeid.ID, error) {
	if len(certs) == 0 {
		return spiffeid.ID{}, noCredentials(MethodX509SVID, "no client certificate")
	}
	if len(certs) > maxPeerChain {
		a.m.results.WithLabelValues(x509OutOfBounds).Inc()
		return spiffeid.ID{}, invalidf(MethodX509SVID, "client sent %d certificates, more than %d", len(certs), maxPeerChain)
	}
	if slices.Contains(certs, nil) {
		return spiffeid.ID{}, invalidf(MethodX509SVID, "client certificate chain has a nil certificate")
	}
	if a.td.IsZero() || a.roots == nil {
		return spiffeid.ID{}, invalidf(MethodX509SVID, "authenticator has no trust domain or roots")
	}
	leaf := certs[0]
	// go-spiffe's cheap reading of the ID, not svidcheck.LeafID: this
	// runs on every call, cached ones included, and only a chain that
	// passed svidcheck (canonical URI SAN included) is ever cached.
	id, err := x509svid.IDFromCert(leaf)
	if err != nil {
		return spiffeid.ID{}, invalid(MethodX509SVID, fmt.Errorf("client certificate is not an X509-SVID: %w", err))
	}
	if id.TrustDomain() != a.td {
		return spiffeid.ID{}, invalidf(MethodX509SVID, "client SVID %s is not in the local trust domain %s", id, a.td)
	}
	if id.Path() == "" {
		return spiffeid.ID{}, invalidf(MethodX509SVID, "client SVID %s has no path", id)
	}
	if !svidcheck.AllowsUsage(leaf, x509.ExtKeyUsageClientAuth) {
		return spiffeid.ID{}, invalidf(MethodX509SVID, "client SVID %s has extended key usages without clientAuth", id)
	}
	if err := checkChainBounds(certs); err != nil {
		a.m.results.WithLabelValues(x509OutOfBounds).Inc()
		return spiffeid.ID{}, invalid(MethodX509SVID, fmt.Errorf("client SVID %s: %w", id, err))
	}
	return id, nil
}

// verifyChain verifies certs against bundle, or answers from the caches,
// and returns the leaf's issuer in the verified chain (nil when the chain
// is the leaf alone) and the grant the leaf records, read once per chain
// the cache holds. Only a chain neither cache knows takes a slot of the
// peer gate.
func (a *X509SVID) verifyChain(certs []*x509.Certificate, id spiffeid.ID, bundle *x509bundle.Bundle, peer string) (*x509.Certificate, leafGrant, error) {
	now := a.clk.Now()
	key := verifyKey{chain: chainDigest(certs), bundle: bundle}
	if issuer, grant, ok := a.cache.hit(key, bundle, now); ok {
		a.m.results.WithLabelValues(x509Cached).Inc()
		return issuer, grant, nil
	}
	if err, ok := a.failures.get(key, now); ok {
		a.m.results.WithLabelValues(x509FailedCached).Inc()
		return nil, leafGrant{}, err
	}
	if ok, scope := a.gate.acquire(peer); !ok {
		a.m.results.WithLabelValues(x509Throttled).Inc()
		a.m.throttled.WithLabelValues(scope).Inc()
		a.logger.Log(context.Background(), a.logLim.Level(slog.LevelWarn), "client certificate verification refused: too many in flight",
			"scope", scope, logattr.Address, peer, logattr.SPIFFEID, id.String())
		return nil, leafGrant{}, fmt.Errorf("authn: %s: too many client certificate verifications in flight (%s): %w", MethodX509SVID, scope, ErrUnavailable)
	}
	defer a.gate.release(peer)
	// Verify against the local bundle alone, never the whole source: the
	// bundle answers for its own trust domain only, and it is the one the
	// cache key names.
	_, chains, err := a.verify(certs, bundle, x509.ExtKeyUsageClientAuth, x509svid.WithTime(now))
	if err != nil {
		err = invalid(MethodX509SVID, fmt.Errorf("client SVID %s: %w", id, err))
		a.failures.add(key, err, now)
		a.m.results.WithLabelValues(x509Failed).Inc()
		return nil, leafGrant{}, err
	}
	grant := readLeafGrant(certs[0])
	a.cache.add(key, chains, grant)
	a.m.results.WithLabelValues(x509Verified).Inc()
	return leafIssuer(chains), grant, nil
}

// leafIssuer is the certificate that signed the leaf in the first
// verified chain, the one the verify cache remembers.
func leafIssuer(chains [][]*x509.Certificate) *x509.Certificate {
	if len(chains) == 0 || len(chains[0]) < 2 {
		return nil
	}
	return chains[0][1]
}

// Results of one X509SVID call that reached chain checks, the label of
// trustbridge_authn_x509_verifications_total.
const (
	x509Verified     = "verified"      // verified now
	x509Cached       = "cached"        // a cached success
	x509Failed       = "failed"        // verified now, and refused
	x509FailedCached = "failed_cached" // a cached failure
	x509OutOfBounds  = "out_of_bounds" // refused by checkChainBounds or length, before any signature
	x509Throttled    = "throttled"     // refused: too many verifications in flight
)

type x509Metrics struct {
	results   *prometheus.CounterVec
	throttled *prometheus.CounterVec
	failures  prometheus.GaugeFunc
}

func newX509Metrics(failures func() int) *x509Metrics {
	m := &x509Metrics{
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_authn_x509_verifications_total",
			Help: "Client certificate chains checked, by result (verified, cached, failed, failed_cached, out_of_bounds: refused before any signature check, throttled: too many in flight).",
		}, []string{"result"}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_authn_x509_throttled_total",
			Help: "Client certificate verifications refused with Unavailable because too many were in flight, by scope (peer: the client's address, global).",
		}, []string{"scope"}),
		failures: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "trustbridge_authn_x509_failure_cache_entries",
			Help: "Failed client certificate verifications currently remembered.",
		}, func() float64 { return float64(failures()) }),
	}
	for _, r := range []string{x509Verified, x509Cached, x509Failed, x509FailedCached, x509OutOfBounds, x509Throttled} {
		m.results.WithLabelValues(r)
	}
	for _, s := range []string{scopePeer, scopeGlobal} {
		m.throttled.WithLabelValues(s)
	}
	return m
}

func (m *x509Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.results, m.throttled, m.failures}
}
