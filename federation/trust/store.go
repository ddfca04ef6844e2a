package trust

import (
	"cmp"
	"crypto"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/spiffe/go-spiffe/v2/bundle/jwtbundle"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/bundle/x509bundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"
)

// Store holds, per trust domain and per source, the bundle each source
// last set, and publishes the per-trust-domain union as an immutable
// Snapshot. Readers load the current snapshot with one atomic read and never
// lock, so a handshake never waits behind a bundle update. The zero value is
// not usable; call NewStore.
type Store struct {
	mu sync.Mutex // serializes writers; readers never take it
	// published is what each source set, per trust domain; snap is its
	// per-trust-domain union. Both are replaced, never changed.
	published atomic.Pointer[Published]
	snap      atomic.Pointer[Snapshot]

	subsMu sync.Mutex
	subs   map[*subscriber]struct{}
}

type subscriber struct {
	ch   chan struct{}
	once sync.Once
	// everySource: woken by every change of what a source set, not only
	// by changes of the union (SubscribePublished).
	everySource bool
}

// NewStore returns an empty store.
func NewStore() *Store {
	s := &Store{subs: make(map[*subscriber]struct{})}
	s.snap.Store(emptySnapshot())
	s.published.Store(&Published{})
	return s
}

// Set records b as source's bundle for b's trust domain, replacing what the
// same source set before for that trust domain. The trust domain is always
// b.TrustDomain(): a source cannot place keys under another trust domain's
// name. b is cloned, so the caller may keep changing its copy. Setting a
// bundle equal to the one the source already holds changes nothing and
// notifies no one. A nil bundle, or one without a trust domain, is a
// programming error and panics.
func (s *Store) Set(source string, b *spiffebundle.Bundle) {
	if b == nil || b.TrustDomain().IsZero() {
		panic(fmt.Sprintf("trust: Set(%q): nil bundle or bundle without trust domain", source))
	}
	td := b.TrustDomain()
	s.mu.Lock()
	defer s.mu.Unlock()
	current := s.published.Load().bySource[td]
	if old, ok := current[source]; ok && old.Equal(b) {
		return
	}
	bySource := maps.Clone(current)
	if bySource == nil {
		bySource = make(map[string]*spiffebundle.Bundle, 1)
	}
	bySource[source] = b.Clone()
	s.publishLocked(td, bySource)
}

// Remove forgets what source set for td. The trust domain disappears from
// the store when its last source is removed. Removing what is not there
// changes nothing and notifies no one.
func (s *Store) Remove(source string, td spiffeid.TrustDomain) {
	s.mu.Lock()
	defer s.mu.Unlock()
	current := s.published.Load().bySource[td]
	if _, ok := current[source]; !ok {
		return
	}
	bySource := maps.Clone(current)
	delete(bySource, source)
	s.publishLocked(td, bySource)
}

// Sources returns the names of the sources holding a bundle for td, sorted.
func (s *Store) Sources(td spiffeid.TrustDomain) []string {
	return slices.Sorted(maps.Keys(s.published.Load().bySource[td]))
}

// Published returns what every source last set, as it set it. It never
// changes; later updates publish a new one.
func (s *Store) Published() *Published { return s.published.Load() }

// publishLocked publishes td's new sources, bySource (a fresh map, never
// changed after; empty removes td): always to Published, since a source's
// bundle changed, and to a new Snapshot when the union changed.
// The new snapshot shares every other entry with the old one: an update
// costs one union, not one per trust domain.
//
// A source change that leaves the union as it was (a new sequence number
// on the same keys, a key another source already supplies) publishes no
// snapshot, so Subscribe's subscribers only wake for changes they can
// see; SubscribePublished's wake for it.
func (s *Store) publishLocked(td spiffeid.TrustDomain, bySource map[string]*spiffebundle.Bundle) {
	s.published.Store(s.published.Load().with(td, bySource))
	unionChanged := s.publishSnapshotLocked(td, bySource)
	s.notify(unionChanged)
}

func (s *Store) publishSnapshotLocked(td spiffeid.TrustDomain, bySource map[string]*spiffebundle.Bundle) bool {
	old := s.snap.Load()
	var e *entry
	if len(bySource) > 0 {
		e = newEntry(td, bySource)
		if prev, ok := old.entries[td]; ok && prev.bundle.Equal(e.bundle) {
			return false
		}
	}
	next := &Snapshot{
		generation: old.generation + 1,
		entries:    maps.Clone(old.entries),
		superseded: make(chan struct{}),
	}
	if e != nil {
		next.entries[td] = e
	} else {
		delete(next.entries, td)
	}
	s.snap.Store(next)
	close(old.superseded)
	return true
}

// Snapshot returns the current snapshot. It never changes; later updates
// publish a new one.
func (s *Store) Snapshot() *Snapshot { return s.snap.Load() }

// Bundle returns the effective bundle of td (the union over its sources).
// The bundle is shared: Clone it before changing it.
func (s *Store) Bundle(td spiffeid.TrustDomain) (*spiffebundle.Bundle, bool) {
	return s.Snapshot().Bundle(td)
}

// X509BundleFor returns the X.509 part of td's effective bundle. The
// bundle is shared: Clone it before changing it.
func (s *Store) X509BundleFor(td spiffeid.TrustDomain) (*x509bundle.Bundle, bool) {
	return s.Snapshot().X509BundleFor(td)
}

// TrustDomains returns the trust domains in the store, sorted.
func (s *Store) TrustDomains() []spiffeid.TrustDomain { return s.Snapshot().TrustDomains() }

// GetX509BundleForTrustDomain implements x509bundle.Source.
func (s *Store) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	return s.Snapshot().GetX509BundleForTrustDomain(td)
}

// GetJWTBundleForTrustDomain implements jwtbundle.Source.
func (s *Store) GetJWTBundleForTrustDomain(td spiffeid.TrustDomain) (*jwtbundle.Bundle, error) {
	return s.Snapshot().GetJWTBundleForTrustDomain(td)
}

// GetBundleForTrustDomain implements spiffebundle.Source.
func (s *Store) GetBundleForTrustDomain(td spiffeid.TrustDomain) (*spiffebundle.Bundle, error) {
	return s.Snapshot().GetBundleForTrustDomain(td)
}

// Subscribe returns a channel that receives a value after each change of
// the Snapshot. Notifications coalesce: a subscriber that has not yet
// drained the channel receives one value for any number of changes, and
// should then read the current Snapshot. cancel stops notifications and
// closes the channel; it may be called more than once.
func (s *Store) Subscribe() (<-chan struct{}, func()) {
	return s.subscribe(false)
}

// SubscribePublished is Subscribe for readers of Published: its channel
// also receives a value when a source's bundle changed but the union did
// not (a new sequence number on the same keys).
func (s *Store) SubscribePublished() (<-chan struct{}, func()) {
	return s.subscribe(true)
}

func (s *Store) subscribe(everySource bool) (<-chan struct{}, func()) {
	sub := &subscriber{ch: make(chan struct{}, 1), everySource: everySource}
	s.subsMu.Lock()
	s.subs[sub] = struct{}{}
	s.subsMu.Unlock()
	cancel := func() {
		sub.once.Do(func() {
			s.subsMu.Lock()
			delete(s.subs, sub)
			close(sub.ch)
			s.subsMu.Unlock()
		})
	}
	return sub.ch, cancel
}

func (s *Store) notify(unionChanged bool) {
	s.subsMu.Lock()
	defer s.subsMu.Unlock()
	for sub := range s.subs {
		if !unionChanged && !sub.everySource {
			continue
		}
		select {
		case sub.ch <- struct{}{}:
		default: // a notification is already pending
		}
	}
}

// Published is an immutable view of the store's sources: per trust
// domain and source, the bundle that source last set, as it set it
// (sequence number and refresh hint included). It is what a relay serves,
// where a Snapshot's union is what a verifier trusts. The zero value is
// empty.
type Published struct {
	bySource map[spiffeid.TrustDomain]map[string]*spiffebundle.Bundle
}

// with returns p with td's sources replaced by bySource, which the result
// keeps (nil or empty removes td). p itself is not changed.
func (p *Published) with(td spiffeid.TrustDomain, bySource map[string]*spiffebundle.Bundle) *Published {
	next := maps.Clone(p.bySource)
	if next == nil {
		next = make(map[spiffeid.TrustDomain]map[string]*spiffebundle.Bundle)
	}
	if len(bySource) == 0 {
		delete(next, td)
	} else {
		next[td] = bySource
	}
	return &Published{bySource: next}
}

// Bundle returns the bundle source last set for td, as it set it. It is
// shared: Clone it before changing it.
func (p *Published) Bundle(td spiffeid.TrustDomain, source string) (*spiffebundle.Bundle, bool) {
	b, ok := p.bySource[td][source]
	return b, ok
}

// BundlesOf returns, for every trust domain in name order, the bundle the
// source named source(td) set for it, skipping trust domains that source
// set nothing for: federation.SourceName, say, gives every fetched bundle
// as its endpoint published it. The bundles are shared: Clone them before
// changing them.
func (p *Published) BundlesOf(source func(spiffeid.TrustDomain) string) []*spiffebundle.Bundle {
	tds := slices.SortedFunc(maps.Keys(p.bySource), func(a, b spiffeid.TrustDomain) int {
		return cmp.Compare(a.Name(), b.Name())
	})
	var out []*spiffebundle.Bundle
	for _, td := range tds {
		if b, ok := p.bySource[td][source(td)]; ok {
			out = append(out, b)
		}
	}
	return out
}

// Snapshot is an immutable view of the store: per trust domain, the
// effective bundle and its X.509 and JWT parts.
type Snapshot struct {
	generation uint64
	entries    map[spiffeid.TrustDomain]*entry
	superseded chan struct{} // closed when the store publishes the next

	x509sOnce sync.Once
	x509s     []*x509bundle.Bundle
}

type entry struct {
	bundle *spiffebundle.Bundle
	x509   *x509bundle.Bundle
	jwt    *jwtbundle.Bundle
}

func emptySnapshot() *Snapshot {
	return &Snapshot{entries: map[spiffeid.TrustDomain]*entry{}, superseded: make(chan struct{})}
}

// Superseded is closed when the store publishes a newer snapshot: a reader
// that holds this one waits on it instead of subscribing.
func (sn *Snapshot) Superseded() <-chan struct{} { return sn.superseded }

// X509Bundles returns the X.509 roots of every trust domain that has
// some, one bundle per trust domain, sorted by trust domain name. The
// slice and bundles are shared and must not be changed.
func (sn *Snapshot) X509Bundles() []*x509bundle.Bundle {
	sn.x509sOnce.Do(func() {
		for _, td := range sn.TrustDomains() {
			if b := sn.entries[td].x509; len(b.X509Authorities()) > 0 {
				sn.x509s = append(sn.x509s, b)
			}
		}
	})
	return sn.x509s
}

// Generation counts the changes the store has published; it grows by one
// per change.
func (sn *Snapshot) Generation() uint64 { return sn.generation }

// Bundle returns the effective bundle of td. It is shared: Clone it before
// changing it.
func (sn *Snapshot) Bundle(td spiffeid.TrustDomain) (*spiffebundle.Bundle, bool) {
	e, ok := sn.entries[td]
	if !ok {
		return nil, false
	}
	return e.bundle, true
}

// X509BundleFor returns the X.509 roots of td. The bundle is shared: Clone
// it before changing it.
func (sn *Snapshot) X509BundleFor(td spiffeid.TrustDomain) (*x509bundle.Bundle, bool) {
	e, ok := sn.entries[td]
	if !ok {
		return nil, false
	}
	return e.x509, true
}

// TrustDomains returns the trust domains in the snapshot, sorted.
func (sn *Snapshot) TrustDomains() []spiffeid.TrustDomain {
	return slices.SortedFunc(maps.Keys(sn.entries), func(a, b spiffeid.TrustDomain) int {
		return cmp.Compare(a.Name(), b.Name())
	})
}

// GetX509BundleForTrustDomain implements x509bundle.Source.
func (sn *Snapshot) GetX509BundleForTrustDomain(td spiffeid.TrustDomain) (*x509bundle.Bundle, error) {
	if b, ok := sn.X509BundleFor(td); ok {
		return b, nil
	}
	return nil, fmt.Errorf("trust: no bundle for trust domain %q", td)
}

// GetJWTBundleForTrustDomain implements jwtbundle.Source.
func (sn *Snapshot) GetJWTBundleForTrustDomain(td spiffeid.TrustDomain) (*jwtbundle.Bundle, error) {
	if e, ok := sn.entries[td]; ok {
		return e.jwt, nil
	}
	return nil, fmt.Errorf("trust: no bundle for trust domain %q", td)
}

// GetBundleForTrustDomain implements spiffebundle.Source.
func (sn *Snapshot) GetBundleForTrustDomain(td spiffeid.TrustDomain) (*spiffebundle.Bundle, error) {
	if b, ok := sn.Bundle(td); ok {
		return b, nil
	}
	return nil, fmt.Errorf("trust: no bundle for trust domain %q", td)
}

// newEntry computes td's effective bundle: the union of its sources' X.509
// authorities (deduplicated by DER) and JWT and WIT keys. When two sources
// publish different keys under one key ID, the source whose name sorts
// first wins, so the result does not depend on update order. The union
// carries the shortest refresh hint of its sources and no sequence number:
// sequence numbers belong to one publisher's document, not to a union.
func newEntry(td spiffeid.TrustDomain, bySource map[string]*spiffebundle.Bundle) *entry {
	union := spiffebundle.New(td)
	var (
		hint    time.Duration
		hasHint bool
	)
	for _, name := range slices.Sorted(maps.Keys(bySource)) {
		b := bySource[name]
		for _, c := range b.X509Authorities() {
			union.AddX509Authority(c)
		}
		addKeys(b.JWTAuthorities(), union.HasJWTAuthority, union.AddJWTAuthority)
		addKeys(b.WITAuthorities(), union.HasWITAuthority, union.AddWITAuthority)
		if h, ok := b.RefreshHint(); ok && (!hasHint || h < hint) {
			hint, hasHint = h, true
		}
	}
	if hasHint {
		union.SetRefreshHint(hint)
	}
	return &entry{bundle: union, x509: union.X509Bundle(), jwt: union.JWTBundle()}
}

func addKeys(keys map[string]crypto.PublicKey, has func(string) bool, add func(string, crypto.PublicKey) error) {
	for _, kid := range slices.Sorted(maps.Keys(keys)) {
		if has(kid) {
			continue
		}
		// The key came out of a bundle that already accepted it, so add
		// cannot fail on an empty key ID here.
		_ = add(kid, keys[kid])
	}
}
