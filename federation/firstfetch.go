package federation

import (
	"errors"
	"fmt"

	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// ErrNoBootstrapBundle: a self-serving https_spiffe endpoint has neither a
// bootstrap bundle nor a held bundle of its trust domain, so its first
// fetch could never be authenticated and it would fail forever ("no X.509
// roots held").
var ErrNoBootstrapBundle = errors.New("no bundle to authenticate the first fetch from a self-serving https_spiffe endpoint")

// CheckFirstFetch is the one rule every way of configuring an endpoint
// (--federate and SPIFFE_BUNDLE_ENDPOINTS, the YAML files, the
// ClusterFederatedTrustDomain resources, `trustbridge config check`)
// applies before the endpoint is polled: an https_spiffe endpoint whose
// SPIFFE ID is in its own trust domain (self-serving, §5.2.2.2) is
// authenticated with that trust domain's bundle, which the operator gives
// for the first fetch (BootstrapBundle) unless one is already held
// (held(td): a last-known-good entry, or a bundle the poller fetched; nil
// means none). Without either it is refused with ErrNoBootstrapBundle, in
// the same words on every path, naming how to fix it.
//
// Other endpoints need nothing of the operator: https_web uses Web PKI,
// and an https_spiffe endpoint served by another trust domain (a hub, or
// our own) is authenticated with that trust domain's bundle from the trust
// store.
func CheckFirstFetch(ep Endpoint, held func(spiffeid.TrustDomain) bool) error {
	if ep.Profile != ProfileHTTPSSPIFFE || !ep.EndpointSPIFFEID.MemberOf(ep.TrustDomain) || ep.BootstrapBundle != nil {
		return nil
	}
	if held != nil && held(ep.TrustDomain) {
		return nil
	}
	td := ep.TrustDomain.Name()
	return fmt.Errorf("federation: %w: %s is an identity of %s, whose bundle is neither given as a bootstrap bundle nor held from an earlier fetch; "+
		"get %s's bundle from its operator over a channel you trust and give it as trustDomainBundleFile (or trustDomainBundle) in the federation entry or ClusterFederatedTrustDomain, "+
		"or as the fourth field of the --federate (SPIFFE_BUNDLE_ENDPOINTS) tuple: %q",
		ErrNoBootstrapBundle, ep.EndpointSPIFFEID, td, td, ep.String()+"|"+td+".json")
}

// StoreHolds reports whether lkg holds an entry for td that loads (a nil
// lkg holds nothing): restoring it authenticates the first fetch.
func StoreHolds(lkg LastKnownGood, td spiffeid.TrustDomain) bool {
	if lkg == nil {
		return false
	}
	e, err := lkg.Load(td)
	return err == nil && e != nil
}

// Holds reports whether a bundle of td is held for CheckFirstFetch: one
// the poller fetched or restored (not a bootstrap bundle, which a changed
// configuration may take away), else an entry of the last-known-good
// store, which adding the endpoint restores. The store is read without the
// poller's lock.
func (p *Poller) Holds(td spiffeid.TrustDomain) bool {
	p.mu.Lock()
	st, ok := p.states[td]
	fetched := ok && st.held != nil && st.held != st.ep.BootstrapBundle
	p.mu.Unlock()
	return fetched || StoreHolds(p.cfg.LKG, td)
}
