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

// Remove stops federating with td as managed here: its endpoint, or else
// its static bundle. Its bundle is trusted no more.
func (m *Manager) Remove(_ context.Context, td spiffeid.TrustDomain, actor string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.free(td); err != nil {
		return err
	}
	next := m.state.clone()
	if i := indexEndpoint(next.Endpoints, td); i >= 0 {
		url := next.Endpoints[i].URL.String()
		next.Endpoints = slices.Delete(next.Endpoints, i, i+1)
		return m.commit(next, Change{Kind: KindRemoved, TrustDomain: td, Actor: actor, EndpointURL: url})
	}
	if i := indexBundle(next.Bundles, td); i >= 0 {
		b := next.Bundles[i]
		next.Bundles = slices.Delete(next.Bundles, i, i+1)
		return m.commit(next, Change{Kind: KindStaticUnset, TrustDomain: td, Actor: actor, Bundle: b})
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
