package authn

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"

	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
	"github.com/spiffe/go-spiffe/v2/svid/x509svid"
	"k8s.io/utils/clock"
)

// maxPeerChain bounds the certificates a client may send. SVID chains are a
// leaf and a few intermediates; a longer chain only costs verification time.
const maxPeerChain = 8

// X509SVID authenticates a caller by its mTLS client certificate: an
// X509-SVID of the local trust domain that verifies against the local roots
// as they are at the time of the call. SVIDs of federated trust domains
// never authenticate, even if their roots are in the source: only the local
// trust domain's bundle is asked for.
type X509SVID struct {
	td        spiffeid.TrustDomain
	roots     x509bundle.Source
	clk       clock.PassiveClock
	cacheSize int
	cache     *verifyCache
	// verify is x509svid.Verify; tests count the calls.
	verify func([]*x509.Certificate, x509bundle.Source, ...x509svid.VerifyOption) (spiffeid.ID, [][]*x509.Certificate, error)
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

// NewX509SVID returns an authenticator for X509-SVIDs of td. roots is asked
// for td's bundle on every call, so rotated roots take effect at once. A nil
// clk means the real clock.
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
// authenticating at once even if the pointer stayed the same.
func NewX509SVID(td spiffeid.TrustDomain, roots x509bundle.Source, clk clock.PassiveClock, opts ...X509SVIDOption) *X509SVID {
	if clk == nil {
		clk = clock.RealClock{}
	}
	a := &X509SVID{td: td, roots: roots, clk: clk, cacheSize: DefaultVerifyCacheSize, verify: x509svid.Verify}
	for _, o := range opts {
		o.apply(a)
	}
	a.cache = newVerifyCache(a.cacheSize)
	return a
}

// Authenticate verifies r.PeerCertificates. It reports ErrNoCredentials only
// when no certificate was sent.
func (a *X509SVID) Authenticate(_ context.Context, r Request) (Identity, error) {
	certs := r.PeerCertificates
	if len(certs) == 0 {
		return Identity{}, noCredentials(MethodX509SVID, "no client certificate")
	}
	if len(certs) > maxPeerChain {
		return Identity{}, invalidf(MethodX509SVID, "client sent %d certificates, more than %d", len(certs), maxPeerChain)
	}
	if slices.Contains(certs, nil) {
		return Identity{}, invalidf(MethodX509SVID, "client certificate chain has a nil certificate")
	}
	if a.td.IsZero() || a.roots == nil {
		return Identity{}, invalidf(MethodX509SVID, "authenticator has no trust domain or roots")
	}
	leaf := certs[0]
	id, err := x509svid.IDFromCert(leaf)
	if err != nil {
		return Identity{}, invalid(MethodX509SVID, fmt.Errorf("client certificate is not an X509-SVID: %w", err))
	}
	if id.TrustDomain() != a.td {
		return Identity{}, invalidf(MethodX509SVID, "client SVID %s is not in the local trust domain %s", id, a.td)
	}
	if id.Path() == "" {
		return Identity{}, invalidf(MethodX509SVID, "client SVID %s has no path", id)
	}
	if !clientAuthAllowed(leaf) {
		return Identity{}, invalidf(MethodX509SVID, "client SVID %s has extended key usages without clientAuth", id)
	}
	bundle, err := a.roots.GetX509BundleForTrustDomain(a.td)
	if err != nil {
		return Identity{}, invalid(MethodX509SVID, fmt.Errorf("local roots: %w", err))
	}
	if bundle == nil || len(bundle.X509Authorities()) == 0 {
		return Identity{}, invalid(MethodX509SVID, errors.New("local trust domain has no X.509 roots"))
	}
	now := a.clk.Now()
	var key verifyKey
	if a.cache != nil {
		key = verifyKey{chain: chainDigest(certs), bundle: bundle}
		if a.cache.hit(key, bundle, now) {
			return svidIdentity(id, leaf), nil
		}
	}
	// Verify against the local bundle alone, never the whole source.
	local := x509bundle.FromX509Authorities(a.td, bundle.X509Authorities())
	_, chains, err := a.verify(certs, local, x509svid.WithTime(now))
	if err != nil {
		return Identity{}, invalid(MethodX509SVID, fmt.Errorf("client SVID %s: %w", id, err))
	}
	a.cache.add(key, chains)
	return svidIdentity(id, leaf), nil
}

// clientAuthAllowed reports whether the leaf may be used as a TLS client
// certificate. x509svid.Verify accepts any extended key usage; a leaf that
// lists usages but not clientAuth was not meant for this, as Go's own TLS
// client verification would also decide.
func clientAuthAllowed(leaf *x509.Certificate) bool {
	if len(leaf.ExtKeyUsage) == 0 && len(leaf.UnknownExtKeyUsage) == 0 {
		return true
	}
	return slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) ||
		slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageAny)
}
