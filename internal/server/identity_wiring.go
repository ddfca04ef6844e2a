package server

import (
	"sync/atomic"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/trustbridge/trustbridge/federation/trust"
)

// storeBundles is the trust store as the identity service's BundleSource:
// every trust domain's effective bundle in the current snapshot, the
// local one included, with the snapshot's Superseded channel, so every
// WatchBundles stream follows the store as SDS's do (storeTrust).
type storeBundles struct {
	store *trust.Store
	last  atomic.Pointer[storeBundlesView]
}

// storeBundlesView is the bundles of one snapshot, listed once.
type storeBundlesView struct {
	snap    *trust.Snapshot
	bundles []*spiffebundle.Bundle
}

// Bundles implements certservice.BundleSource.
func (s *storeBundles) Bundles() ([]*spiffebundle.Bundle, <-chan struct{}) {
	snap := s.store.Snapshot()
	if v := s.last.Load(); v != nil && v.snap == snap {
		return v.bundles, snap.Superseded()
	}
	v := &storeBundlesView{snap: snap}
	for _, td := range snap.TrustDomains() {
		if b, ok := snap.Bundle(td); ok {
			v.bundles = append(v.bundles, b)
		}
	}
	s.last.Store(v)
	return v.bundles, snap.Superseded()
}
