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

// ErrNoServerBundle: an https_spiffe endpoint served by another trust
// domain (a hub) names a server whose trust domain's roots the trust store
// will never hold: not ours, not federated with a bundle given or held, so
// its first fetch, and every one after, would fail ("no X.509 roots held").
var ErrNoServerBundle = errors.New("no bundle to authenticate the first fetch from an https_spiffe endpoint served by another trust domain")

// Anchors is what the trust store will hold when an endpoint is first
// fetched, for CheckFirstFetch. A nil *Anchors holds nothing. It remembers
// Held's answers, so build one per check of a configuration set and use it
// from one goroutine.
type Anchors struct {
	// Local is this server's trust domain: its CA's roots are in the trust
	// store, so they authenticate an endpoint whose SPIFFE ID is ours.
	Local spiffeid.TrustDomain
	// Endpoints is the configuration set the endpoint is checked in (the
	// flags and files together; for the resources, those and every
	// resource). When several configure one trust domain, the first
	// counts: the one that is applied.
	Endpoints []Endpoint
	// Held reports whether a bundle of a trust domain is held from an
	// earlier fetch (a last-known-good entry, or a bundle the poller
	// fetched); nil means none is.
	Held func(spiffeid.TrustDomain) bool

	asked map[spiffeid.TrustDomain]bool // Held's answers so far
}

// CheckFirstFetch is the one rule every way of configuring an endpoint
// (--federate and SPIFFE_BUNDLE_ENDPOINTS, the YAML files, the
// ClusterFederatedTrustDomain resources, `trustbridge config check`)
// applies before the endpoint is polled: the fetcher authenticates an
// https_spiffe server with the trust store's roots of the trust domain of
// the endpoint SPIFFE ID, so those roots must be there for the first
// fetch. Whose they are decides what the operator must give:
//
//   - Self-serving (the endpoint SPIFFE ID is in the endpoint's trust
//     domain, §5.2.2.2): that trust domain's bundle, given for the first
//     fetch (BootstrapBundle) unless one is held (a.Held). Else it is
//     refused with ErrNoBootstrapBundle.
//   - Served by another trust domain S (a hub): S's roots, which the store
//     holds when S is a.Local (our CA), when a bundle of S is held, or when
//     a.Endpoints federates with S by an endpoint that brings S's roots in
//     (https_web; a bootstrap bundle; or, served by a third trust domain,
//     that one's roots, recursively, so a cycle of endpoints serving each
//     other brings none). The endpoint's own BootstrapBundle, a bundle of
//     its trust domain, does not help: the store keeps it under that trust
//     domain, never under S. Else it is refused with ErrNoServerBundle.
//
// Each refusal says, in the same words on every path, how to fix it.
// https_web endpoints need nothing: they are authenticated with Web PKI.
func CheckFirstFetch(ep Endpoint, a *Anchors) error {
	if ep.Profile != ProfileHTTPSSPIFFE {
		return nil
	}
	if a == nil {
		a = &Anchors{}
	}
	server := ep.EndpointSPIFFEID.TrustDomain()
	if server == ep.TrustDomain {
		if ep.BootstrapBundle != nil || a.held(ep.TrustDomain) {
			return nil
		}
		td := ep.TrustDomain.Name()
		return fmt.Errorf("federation: %w: %s is an identity of %s, whose bundle is neither given as a bootstrap bundle nor held from an earlier fetch; "+
			"get %s's bundle from its operator over a channel you trust and give it as trustDomainBundleFile (or trustDomainBundle) in the federation entry or ClusterFederatedTrustDomain, "+
			"or as the fourth field of the --federate (SPIFFE_BUNDLE_ENDPOINTS) tuple: %q",
			ErrNoBootstrapBundle, ep.EndpointSPIFFEID, td, td, ep.String()+"|"+td+".json")
	}
	if a.anchored(server, map[spiffeid.TrustDomain]bool{}) {
		return nil
	}
	s := server.Name()
	var own string
	if ep.BootstrapBundle != nil {
		own = fmt.Sprintf(" (the bootstrap bundle given for %s does not help: it authenticates servers of %s only)", ep.TrustDomain.Name(), ep.TrustDomain.Name())
	}
	if sep, ok := a.endpoint(server); ok {
		return fmt.Errorf("federation: %w: %q is served as %s, an identity of %s, whose bundle is neither held nor given%s; "+
			"%s is federated here by %q, but no bundle of %s is given or held to authenticate that endpoint's first fetch either; "+
			"get %s's bundle from its operator over a channel you trust and give it as trustDomainBundleFile (or trustDomainBundle) in %s's federation entry or ClusterFederatedTrustDomain, "+
			"or as the fourth field of its --federate (SPIFFE_BUNDLE_ENDPOINTS) tuple: %q",
			ErrNoServerBundle, ep.String(), ep.EndpointSPIFFEID, s, own, s, sep.String(), sep.EndpointSPIFFEID.TrustDomain().Name(), s, s, sep.String()+"|"+s+".json")
	}
	return fmt.Errorf("federation: %w: %q is served as %s, an identity of %s, whose bundle is neither held nor given%s; "+
		"%s is neither this server's trust domain nor federated here; "+
		"federate with %s too, with its bundle from its operator over a channel you trust: an entry for %s with trustDomainBundleFile (or trustDomainBundle) in the federation file or a ClusterFederatedTrustDomain, "+
		"or a --federate (SPIFFE_BUNDLE_ENDPOINTS) tuple %q",
		ErrNoServerBundle, ep.String(), ep.EndpointSPIFFEID, s, own, s, s, s, s+"|https://<"+s+" bundle endpoint>|<"+s+" endpoint SPIFFE ID>|"+s+".json")
}

// held asks Held once per trust domain for the life of a: the answer may
// cost a read of the last-known-good store (an API call with Kubernetes
// storage), and one configuration set asks about a trust domain once per
// endpoint that depends on it.
func (a *Anchors) held(td spiffeid.TrustDomain) bool {
	if a.Held == nil {
		return false
	}
	if h, ok := a.asked[td]; ok {
		return h
	}
	if a.asked == nil {
		a.asked = map[spiffeid.TrustDomain]bool{}
	}
	a.asked[td] = a.Held(td)
	return a.asked[td]
}

// endpoint returns the first endpoint of a.Endpoints for td.
func (a *Anchors) endpoint(td spiffeid.TrustDomain) (Endpoint, bool) {
	for _, ep := range a.Endpoints {
		if ep.TrustDomain == td {
			return ep, true
		}
	}
	return Endpoint{}, false
}

// anchored reports whether the trust store will hold roots of td: ours,
// held, or brought in by the endpoint federating with td. seen breaks
// cycles: a trust domain already being asked about brings nothing.
func (a *Anchors) anchored(td spiffeid.TrustDomain, seen map[spiffeid.TrustDomain]bool) bool {
	if (!a.Local.IsZero() && td == a.Local) || a.held(td) {
		return true
	}
	if seen[td] {
		return false
	}
	seen[td] = true
	ep, ok := a.endpoint(td)
	switch {
	case !ok:
		return false
	case ep.Profile == ProfileHTTPSWeb, ep.BootstrapBundle != nil:
		return true
	case ep.Profile != ProfileHTTPSSPIFFE:
		return false
	}
	return a.anchored(ep.EndpointSPIFFEID.TrustDomain(), seen)
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
	r, ok := p.rels[td]
	fetched := ok && r.fetched()
	p.mu.Unlock()
	return fetched || StoreHolds(p.cfg.LKG, td)
}
