package managed

import (
	"context"
	"fmt"
	"slices"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/federation"
)

// AddOptions qualify Add.
type AddOptions struct {
	// Force replaces a managed endpoint of the same trust domain.
	Force bool
	// NoProbe adds the endpoint without fetching it first: a peer that
	// is down now is polled until it answers.
	NoProbe bool
	// Actor is who asks, for the audit log.
	Actor string
}

// Add federates with ep. Without a bootstrap bundle, it takes the trust
// domain's static bundle (which ep then replaces: the poller keeps it
// current) or, replacing an endpoint, that endpoint's bootstrap bundle.
// The endpoint must pass federation.CheckFirstFetch and, unless
// opts.NoProbe, its first fetch (Config.Probe).
func (m *Manager) Add(ctx context.Context, ep federation.Endpoint, opts AddOptions) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	td := ep.TrustDomain
	if err := m.free(td); err != nil {
		return err
	}
	next := m.state.clone()
	kind := KindAdded
	if i := indexEndpoint(next.Endpoints, td); i >= 0 {
		old := next.Endpoints[i]
		if !opts.Force {
			return fmt.Errorf("%w: %s is already federated by %s (added at run time); remove it first, or replace it with --force", ErrExists, td.Name(), old)
		}
		if err := CheckReplace(old, ep); err != nil {
			return err
		}
		if ep.BootstrapBundle == nil {
			ep.BootstrapBundle = old.BootstrapBundle
		}
		next.Endpoints = slices.Delete(next.Endpoints, i, i+1)
		kind = KindReplaced
	}
	if i := indexBundle(next.Bundles, td); i >= 0 {
		if ep.BootstrapBundle == nil {
			ep.BootstrapBundle = next.Bundles[i]
		}
		next.Bundles = slices.Delete(next.Bundles, i, i+1)
	}
	if err := CheckEndpoint(ctx, ep, m.anchors(ep, next.Endpoints), m.cfg.Probe, opts.NoProbe); err != nil {
		return err
	}
	next.Endpoints = append(next.Endpoints, ep)
	return m.commit(next, Change{Kind: kind, TrustDomain: td, Actor: opts.Actor, EndpointURL: ep.URL.String(), Bundle: ep.BootstrapBundle})
}

// CheckReplace refuses a replacement (federation add --force) that would
// turn an https_spiffe relationship into https_web: the add request
// carries no profile of its own when --endpoint-spiffe-id is left out, and
// a replacement that silently dropped the endpoint's authentication by its
// SPIFFE ID would be a downgrade nobody asked for. The operator states the
// profile (--endpoint-spiffe-id), or changes only what they give with
// Update (federation update --profile https_web).
func CheckReplace(old, ep federation.Endpoint) error {
	if old.Profile == federation.ProfileHTTPSSPIFFE && ep.Profile == federation.ProfileHTTPSWeb {
		return fmt.Errorf("%w: %s is federated by https_spiffe (endpoint SPIFFE ID %s), and the replacement is https_web: "+
			"pass --endpoint-spiffe-id to keep https_spiffe, or change only what you give with trustbridge federation update (--profile https_web to switch on purpose)",
			ErrExists, old.TrustDomain.Name(), old.EndpointSPIFFEID)
	}
	return nil
}

// Edit makes an updated endpoint from the one in force (Update).
type Edit func(old federation.Endpoint) (federation.Endpoint, error)

// Update changes td's managed endpoint to what edit makes of it (a
// patch: federation update), checked as Add checks a new one, probed
// unless opts.NoProbe (opts.Force means nothing here). Endpoints
// configured elsewhere are refused as Add refuses them.
func (m *Manager) Update(ctx context.Context, td spiffeid.TrustDomain, edit Edit, opts AddOptions) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.free(td); err != nil {
		return err
	}
	next := m.state.clone()
	i := indexEndpoint(next.Endpoints, td)
	if i < 0 {
		if indexBundle(next.Bundles, td) >= 0 {
			return fmt.Errorf("%w: %s has a static bundle (bundle set) and no endpoint to update: give it one with trustbridge federation add", ErrNotFound, td.Name())
		}
		return fmt.Errorf("%w: %s has no endpoint added at run time (see trustbridge federation list); add it with trustbridge federation add", ErrNotFound, td.Name())
	}
	prev := next.Endpoints[i]
	ep, err := edit(prev)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if ep.TrustDomain != td {
		return fmt.Errorf("%w: an update of %s cannot make it the endpoint of %s", ErrInvalid, td.Name(), ep.TrustDomain.Name())
	}
	next.Endpoints = slices.Delete(next.Endpoints, i, i+1)
	if err := CheckEndpoint(ctx, ep, m.anchors(ep, next.Endpoints), m.cfg.Probe, opts.NoProbe); err != nil {
		return err
	}
	next.Endpoints = append(next.Endpoints, ep)
	return m.commit(next, Updated(prev, ep, opts.Actor))
}

// CheckEndpoint is what an endpoint must pass to be added, with either
// storage: a valid endpoint (federation.MergeEndpoints) whose first fetch
// can be authenticated with a (federation.CheckFirstFetch) and, with
// probe and unless noProbe, succeeds (ErrFirstFetch).
func CheckEndpoint(ctx context.Context, ep federation.Endpoint, a *federation.Anchors, probe func(context.Context, federation.Endpoint) error, noProbe bool) error {
	if _, err := federation.MergeEndpoints([]federation.Endpoint{ep}); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if err := checkFirstFetch(ep, a); err != nil {
		return err
	}
	if probe != nil && !noProbe {
		if err := probe(ctx, ep); err != nil {
			return fmt.Errorf("%w: %s: %w; nothing was changed: fix the URL, endpoint SPIFFE ID or bundle, or add it with --no-fetch to poll it until it answers", ErrFirstFetch, ep, err)
		}
	}
	return nil
}

// RemoveOptions qualify Remove.
type RemoveOptions struct {
	// Actor is who asks, for the audit log.
	Actor string
	// BundleOnly removes a static bundle (bundle delete) and refuses a
	// trust domain federated by an endpoint, whose bundle comes from it.
	BundleOnly bool
}

// Remove stops federating with td as managed here: its endpoint, or else
// its static bundle. Its bundle is trusted no more.
func (m *Manager) Remove(_ context.Context, td spiffeid.TrustDomain, opts RemoveOptions) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.free(td); err != nil {
		return err
	}
	next := m.state.clone()
	if i := indexEndpoint(next.Endpoints, td); i >= 0 {
		ep := next.Endpoints[i]
		if opts.BundleOnly {
			return fmt.Errorf("%w: %s is federated by its endpoint %s (added at run time), where its bundle comes from: stop federating with it with trustbridge federation remove", ErrExists, td.Name(), ep)
		}
		next.Endpoints = slices.Delete(next.Endpoints, i, i+1)
		return m.commit(next, Change{Kind: KindRemoved, TrustDomain: td, Actor: opts.Actor, EndpointURL: ep.URL.String()})
	}
	if i := indexBundle(next.Bundles, td); i >= 0 {
		b := next.Bundles[i]
		next.Bundles = slices.Delete(next.Bundles, i, i+1)
		return m.commit(next, Change{Kind: KindStaticUnset, TrustDomain: td, Actor: opts.Actor, Bundle: b})
	}
	if opts.BundleOnly {
		return fmt.Errorf("%w: %s has no bundle set at run time with bundle set (see trustbridge bundle list)", ErrNotFound, td.Name())
	}
	return fmt.Errorf("%w: %s has no endpoint or bundle added at run time (see trustbridge federation list)", ErrNotFound, td.Name())
}

// SetBundle sets b as its trust domain's bundle: the bootstrap bundle of
// its managed endpoint, which authenticates that endpoint's first fetch
// (a held, fetched bundle stays in force), or else a static bundle,
// trusted as is until set again or removed. kind says which.
func (m *Manager) SetBundle(_ context.Context, b *spiffebundle.Bundle, actor string) (kind string, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	td := b.TrustDomain()
	if err := m.free(td); err != nil {
		return "", err
	}
	if b.Empty() {
		return "", fmt.Errorf("%w: the bundle for %s has no X.509 or JWT authority", ErrInvalid, td.Name())
	}
	if m.cfg.Revoked != nil {
		// The operator's bundle may be older than a revocation the
		// endpoint published since; trusting it would undo that.
		if err := federation.CheckRevoked(b, m.cfg.Revoked(td)); err != nil {
			return "", fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	next := m.state.clone()
	if i := indexEndpoint(next.Endpoints, td); i >= 0 {
		ep := next.Endpoints[i]
		ep.BootstrapBundle = b
		if _, err := federation.MergeEndpoints([]federation.Endpoint{ep}); err != nil {
			return "", fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		next.Endpoints[i] = ep
		return KindBootstrap, m.commit(next, Change{Kind: KindBootstrap, TrustDomain: td, Actor: actor, EndpointURL: ep.URL.String(), Bundle: b})
	}
	if i := indexBundle(next.Bundles, td); i >= 0 {
		next.Bundles[i] = b
	} else {
		next.Bundles = append(next.Bundles, b)
	}
	return KindStaticSet, m.commit(next, Change{Kind: KindStaticSet, TrustDomain: td, Actor: actor, Bundle: b})
}

// Has reports whether td is managed here, by an endpoint or a bundle.
func (m *Manager) Has(td spiffeid.TrustDomain) bool {
	s := m.view.Load()
	return indexEndpoint(s.Endpoints, td) >= 0 || indexBundle(s.Bundles, td) >= 0
}
