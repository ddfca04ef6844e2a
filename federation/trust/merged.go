package trust

import (
	"crypto/x509"
	"sync/atomic"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/spifferoot"
)

// MergedRoots returns a function listing the store's roots as one flat
// list, for a client that takes a single root list (the certificate
// service's --ca-response-roots merged): local's roots first, then each
// other trust domain's in name order; the caller drops duplicates. A
// federated root that names, in its spiffe://<td> URI SAN, a trust domain
// other than the one it was published for is left out: a client that tells
// roots apart by that SAN would take a peer's root claiming
// spiffe://<local> for one of ours. Roots naming no trust domain (plug-in
// CAs) stay. The list is rebuilt only when the store publishes a new
// snapshot, and the same slice is returned until then.
func (s *Store) MergedRoots(local spiffeid.TrustDomain) func() []*x509.Certificate {
	type cached struct {
		snap  *Snapshot
		roots []*x509.Certificate
	}
	var last atomic.Pointer[cached]
	return func() []*x509.Certificate {
		snap := s.Snapshot()
		if c := last.Load(); c != nil && c.snap == snap {
			return c.roots
		}
		var roots []*x509.Certificate
		if b, ok := snap.X509BundleFor(local); ok {
			roots = append(roots, b.X509Authorities()...)
		}
		for _, other := range snap.TrustDomains() {
			if other == local {
				continue
			}
			if b, ok := snap.X509BundleFor(other); ok {
				for _, r := range b.X509Authorities() {
					if named, ok := spifferoot.TrustDomain(r); !ok || named == other {
						roots = append(roots, r)
					}
				}
			}
		}
		last.Store(&cached{snap: snap, roots: roots})
		return roots
	}
}
