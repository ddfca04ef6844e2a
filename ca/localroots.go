package ca

import (
	"fmt"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// localBundle is the X.509 bundle derived from one published bundle.
type localBundle struct {
	published *spiffebundle.Bundle
	x509      *x509bundle.Bundle
}

// GetX509BundleForTrustDomain makes the Authority an x509bundle.Source of
// its published roots, as they are at each call, for its own trust domain
// only: what a verifier of the CA's own workloads (the certificate
// service's mTLS authenticator) trusts. Any trust domain but the CA's is
// an error: federated trust domains never authenticate to the CA.
//
// It hands out the same *x509bundle.Bundle until the CA publishes a new
// bundle, so a cache keyed by the bundle pointer (authn's verified client
// chains) stays valid exactly as long as the roots do.
func (a *Authority) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if td != a.TrustDomain() {
		return nil, fmt.Errorf("no roots for trust domain %q: the CA serves %q", td, a.TrustDomain())
	}
	// The CA replaces its bundle on every publication and never changes
	// one it has published, so the pointer names the roots.
	published := a.Bundle()
	if published == nil {
		return nil, fmt.Errorf("the CA for %q has published no bundle yet", td)
	}
	old := a.localRoots.Load()
	if old != nil && old.published == published {
		return old.x509, nil
	}
	next := &localBundle{published: published, x509: published.X509Bundle()}
	if !a.localRoots.CompareAndSwap(old, next) {
		// Another call derived it first: hand out the one it stored.
		if cur := a.localRoots.Load(); cur != nil && cur.published == published {
			return cur.x509, nil
		}
	}
	return next.x509, nil
}
