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

// x509Bundle is Authority.GetX509BundleForTrustDomain.
func (s *signer) x509Bundle(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if td != s.cfg.TrustDomain {
		return nil, fmt.Errorf("no roots for trust domain %q: the CA serves %q", td, s.cfg.TrustDomain)
	}
	// The CA replaces its bundle on every publication and never changes
	// one it has published, so the pointer names the roots.
	published := s.bundle()
	if published == nil {
		return nil, fmt.Errorf("the CA for %q has published no bundle yet", td)
	}
	old := s.localRoots.Load()
	if old != nil && old.published == published {
		return old.x509, nil
	}
	next := &localBundle{published: published, x509: published.X509Bundle()}
	if !s.localRoots.CompareAndSwap(old, next) {
		// Another call derived it first: hand out the one it stored.
		if cur := s.localRoots.Load(); cur != nil && cur.published == published {
			return cur.x509, nil
		}
	}
	return next.x509, nil
}
