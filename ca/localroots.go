package ca

import (
	"fmt"
	"sync/atomic"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// LocalRoots is an x509bundle.Source of the CA's published roots, as they
// are at each call, for its own trust domain only: what a verifier of the
// CA's own workloads (the certificate service's mTLS authenticator) trusts.
// It hands out the same *x509bundle.Bundle until the CA publishes a new
// bundle, so a cache keyed by the bundle pointer (authn's verified client
// chains) stays valid exactly as long as the roots do.
type LocalRoots struct {
	a    *Authority
	last atomic.Pointer[localBundle]
}

// localBundle is the X.509 bundle derived from one published bundle.
type localBundle struct {
	published *spiffebundle.Bundle
	x509      *x509bundle.Bundle
}

// NewLocalRoots returns the source of a's published roots.
func NewLocalRoots(a *Authority) *LocalRoots { return &LocalRoots{a: a} }

// GetX509BundleForTrustDomain implements x509bundle.Source. Any trust
// domain but the CA's is an error: federated trust domains never
// authenticate to the CA.
func (r *LocalRoots) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if td != r.a.TrustDomain() {
		return nil, fmt.Errorf("no roots for trust domain %q: the CA serves %q", td, r.a.TrustDomain())
	}
	// The CA replaces its bundle on every publication and never changes
	// one it has published, so the pointer names the roots.
	published := r.a.Bundle()
	if published == nil {
		return nil, fmt.Errorf("the CA for %q has published no bundle yet", td)
	}
	old := r.last.Load()
	if old != nil && old.published == published {
		return old.x509, nil
	}
	next := &localBundle{published: published, x509: published.X509Bundle()}
	if !r.last.CompareAndSwap(old, next) {
		// Another call derived it first: hand out the one it stored.
		if cur := r.last.Load(); cur != nil && cur.published == published {
			return cur.x509, nil
		}
	}
	return next.x509, nil
}
