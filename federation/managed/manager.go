package managed

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/federation"
)

// Errors a change is refused with; the transport maps them to its codes.
var (
	// ErrInvalid: the change is wrong as given (our own trust domain, a
	// bundle without authorities, an endpoint whose first fetch could
	// never be authenticated).
	ErrInvalid = errors.New("invalid change")
	// ErrReserved: the trust domain is configured elsewhere (flags,
	// files, resources, a relayed bundle file), where it must be changed.
	ErrReserved = errors.New("trust domain configured elsewhere")
	// ErrExists: the trust domain already has a managed endpoint; replace
	// it with AddOptions.Force.
	ErrExists = errors.New("trust domain already federated")
	// ErrNotFound: nothing managed for the trust domain.
	ErrNotFound = errors.New("trust domain not managed")
	// ErrFirstFetch: the endpoint's first fetch failed (Config.Probe), so
	// it was not added.
	ErrFirstFetch = errors.New("first fetch failed")
)

// Change kinds, as Change.Kind (and the audit log's event) names them.
const (
	KindAdded       = "federation_added"
	KindReplaced    = "federation_replaced"
	KindUpdated     = "federation_updated"
	KindRemoved     = "federation_removed"
	KindBootstrap   = "bootstrap_bundle_set"
	KindStaticSet   = "static_bundle_set"
	KindStaticUnset = "static_bundle_removed"
)

// Change is one applied and persisted change, for the audit log.
type Change struct {
	Kind        string
	TrustDomain spiffeid.TrustDomain
	// Actor is who asked (AddOptions.Actor and the like).
	Actor string
	// EndpointURL is the endpoint's URL, when there is one.
	EndpointURL string
	// Bundle is the bundle set (bootstrap or static), or the static one
	// removed; on an update, the bootstrap bundle only when it changed.
	Bundle *spiffebundle.Bundle
	// Changes, on an update, are what changed, each "field old → new".
	Changes []string
}

// Updated is the Change of an update of old to ep by actor: which of
// the endpoint URL, profile and endpoint SPIFFE ID changed, from what to
// what, and the bootstrap bundle only when it is not the one kept.
func Updated(old, ep federation.Endpoint, actor string) Change {
	c := Change{Kind: KindUpdated, TrustDomain: ep.TrustDomain, Actor: actor, EndpointURL: urlString(ep.URL)}
	was := func(field, from, to string) {
		if from != to {
			c.Changes = append(c.Changes, fmt.Sprintf("%s %s → %s", field, orNone(from), orNone(to)))
		}
	}
	was("endpoint URL", urlString(old.URL), urlString(ep.URL))
	was("profile", string(old.Profile), string(ep.Profile))
	was("endpoint SPIFFE ID", idString(old.EndpointSPIFFEID), idString(ep.EndpointSPIFFEID))
	if ep.BootstrapBundle != nil && (old.BootstrapBundle == nil || !old.BootstrapBundle.Equal(ep.BootstrapBundle)) {
		c.Bundle = ep.BootstrapBundle
		c.Changes = append(c.Changes, "bootstrap bundle replaced")
	}
	return c
}

func urlString(u *url.URL) string {
	if u == nil {
		return ""
	}
	return u.String()
}

func idString(id spiffeid.ID) string {
	if id.IsZero() {
		return ""
	}
	return id.String()
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// Config configures a Manager.
type Config struct {
	// Dir is where the state persists (the data directory).
	Dir string
	// Local is the server's own trust domain: never managed here.
	Local spiffeid.TrustDomain
	// Reserved says where else td is configured ("--federate", "the
	// ClusterFederatedTrustDomain x", ...), "" when nowhere.
	Reserved func(td spiffeid.TrustDomain) string
	// Others are the endpoints configured elsewhere, the set in which
	// federation.CheckFirstFetch judges a managed endpoint.
	Others func() []federation.Endpoint
	// Held reports whether a bundle of td is held (the poller's Holds).
	Held func(td spiffeid.TrustDomain) bool
	// Revoked is the revoked set held for td (the poller's Revoked):
	// SetBundle refuses a bundle carrying one of them. Nil knows none.
	Revoked func(td spiffeid.TrustDomain) []federation.Revoked
	// Apply makes a state the one in force: endpoints polled, static
	// bundles trusted. An error leaves the previous state in force.
	Apply func(State) error
	// Probe, when set, fetches a new endpoint's bundle once, as its
	// first poll would, before it is added.
	Probe func(ctx context.Context, ep federation.Endpoint) error
	// OnChange hears of each change once applied and persisted.
	OnChange func(Change)
}

// Manager applies and persists the managed federation. Its methods are
// safe for concurrent use; changes are serialized.
type Manager struct {
	cfg Config
	mu  sync.Mutex // serializes changes (a change may wait on a probe)
	// state is the state in force, written under mu; view is a copy of
	// it that readers take without waiting for a change in progress.
	state State
	view  atomic.Pointer[State]
}

// setState makes s the state in force.
func (m *Manager) setState(s State) {
	m.state = s
	v := s.clone()
	m.view.Store(&v)
}

// New loads the state persisted in cfg.Dir, checks it as a change would
// be checked and applies it. A state that does not load or apply is an
// error naming the file: it is configuration, like --federation-config.
func New(cfg Config) (*Manager, []string, error) {
	if cfg.Apply == nil {
		return nil, nil, errors.New("managed: Apply is required")
	}
	if cfg.Reserved == nil {
		cfg.Reserved = func(spiffeid.TrustDomain) string { return "" }
	}
	if cfg.Others == nil {
		cfg.Others = func() []federation.Endpoint { return nil }
	}
	s, warnings, err := Load(cfg.Dir)
	if err != nil {
		return nil, nil, fmt.Errorf("managed: %w", err)
	}
	m := &Manager{cfg: cfg}
	if err := m.check(s); err != nil {
		return nil, nil, fmt.Errorf("managed: %s: %w; fix it with trustbridge federation remove once the server runs without it, or edit the file with the server stopped", cfg.Dir, err)
	}
	if err := cfg.Apply(s); err != nil {
		return nil, nil, fmt.Errorf("managed: %w", err)
	}
	m.setState(s)
	return m, warnings, nil
}

// check applies the rules of a change to every entry of a loaded state.
func (m *Manager) check(s State) error {
	for _, ep := range s.Endpoints {
		if err := m.free(ep.TrustDomain); err != nil {
			return fmt.Errorf("%s: %w", EndpointsFile, err)
		}
		if err := checkFirstFetch(ep, m.anchors(ep, s.Endpoints)); err != nil {
			return fmt.Errorf("%s: %w", EndpointsFile, err)
		}
	}
	for _, b := range s.Bundles {
		if err := m.free(b.TrustDomain()); err != nil {
			return fmt.Errorf("%s: %w", BundlesFile, err)
		}
	}
	return nil
}

// State is the managed state in force. It does not wait for a change in
// progress (whose first-fetch probe may take --federation-timeout).
func (m *Manager) State() State {
	return m.view.Load().clone()
}

// free refuses our own trust domain and those configured elsewhere.
func (m *Manager) free(td spiffeid.TrustDomain) error {
	return CheckFree(td, m.cfg.Local, m.cfg.Reserved(td))
}

// CheckFree refuses, with the errors of a change, td when it is local
// (this server's own trust domain) or configured elsewhere (where, ""
// when nowhere): the rule of every storage's manager.
func CheckFree(td, local spiffeid.TrustDomain, where string) error {
	if td == local {
		return fmt.Errorf("%w: %s is this server's own trust domain; its bundle comes from our CA", ErrInvalid, td.Name())
	}
	if where != "" {
		return fmt.Errorf("%w: %s is configured by %s; change it there", ErrReserved, td.Name(), where)
	}
	return nil
}

// anchors are those of ep's first fetch among the managed endpoints eps
// (which may hold ep) and the others.
func (m *Manager) anchors(ep federation.Endpoint, eps []federation.Endpoint) *federation.Anchors {
	set := append([]federation.Endpoint{ep}, slices.Concat(eps, m.cfg.Others())...)
	return &federation.Anchors{Local: m.cfg.Local, Endpoints: set, Held: m.cfg.Held}
}

// checkFirstFetch is federation.CheckFirstFetch, refusing with ErrInvalid.
func checkFirstFetch(ep federation.Endpoint, a *federation.Anchors) error {
	if err := federation.CheckFirstFetch(ep, a); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return nil
}

// commit applies next, then persists it; when it cannot be persisted the
// previous state is applied again, so what runs is what a restart loads.
func (m *Manager) commit(next State, change Change) error {
	next.sort()
	if err := m.cfg.Apply(next); err != nil {
		return fmt.Errorf("managed: %w", err)
	}
	if err := Save(m.cfg.Dir, next); err != nil {
		if rerr := m.cfg.Apply(m.state); rerr != nil {
			err = errors.Join(err, fmt.Errorf("restoring the previous state: %w", rerr))
		}
		// One file may hold next already: put the previous state back on
		// disk too, so that a restart loads what runs.
		if rerr := Save(m.cfg.Dir, m.state); rerr != nil {
			err = errors.Join(err, fmt.Errorf("restoring the previous files: %w", rerr))
		}
		return fmt.Errorf("managed: not saved in %s, not applied: %w", m.cfg.Dir, err)
	}
	m.setState(next)
	if m.cfg.OnChange != nil {
		m.cfg.OnChange(change)
	}
	return nil
}

func indexEndpoint(eps []federation.Endpoint, td spiffeid.TrustDomain) int {
	return slices.IndexFunc(eps, func(ep federation.Endpoint) bool { return ep.TrustDomain == td })
}

func indexBundle(bs []*spiffebundle.Bundle, td spiffeid.TrustDomain) int {
	return slices.IndexFunc(bs, func(b *spiffebundle.Bundle) bool { return b.TrustDomain() == td })
}
