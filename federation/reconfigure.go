package federation

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/logattr"
)

// SetEndpoints replaces the set of endpoints, whether Run is running or
// not (a federation CRD edited, a relationship added or removed). It is all
// or nothing: an invalid set (a duplicate trust domain, an endpoint that
// fails validation) changes nothing.
//
//   - An added trust domain starts from its last-known-good bundle (else
//     its bootstrap bundle) and is polled at once.
//   - A removed one stops being polled and its bundle leaves the Sink: it
//     is trusted no more. Its last-known-good entry stays, so adding it back
//     restores it.
//   - A changed one (URL, profile, endpoint SPIFFE ID, refresh bounds,
//     bootstrap bundle) keeps its bundle, since its trust domain is the same,
//     forgets its entity tag and is polled at once. A poll already running
//     for its old configuration is discarded.
//   - An unchanged one is left alone.
func (p *Poller) SetEndpoints(eps []Endpoint) error {
	if _, err := MergeEndpoints(eps); err != nil {
		return fmt.Errorf("federation: %w", err)
	}
	p.setMu.Lock()
	defer p.setMu.Unlock()

	want := make(map[spiffeid.TrustDomain]Endpoint, len(eps))
	for _, ep := range eps {
		want[ep.TrustDomain] = ep
	}
	stored := p.storedBundles(want)

	var events []Event
	p.mu.Lock()
	now := p.cfg.Now()
	for _, td := range slices.SortedFunc(maps.Keys(p.rels), compareTrustDomains) {
		if _, ok := want[td]; !ok {
			events = append(events, p.removeLocked(td))
		}
	}
	for _, td := range slices.SortedFunc(maps.Keys(want), compareTrustDomains) {
		old, ok := p.rels[td]
		switch {
		case !ok:
			events = append(events, p.addLocked(want[td], stored[td], now))
		default:
			if ev, changed := p.changeLocked(old, want[td], now); changed {
				events = append(events, ev)
			}
		}
	}
	p.sortLocked()
	p.mu.Unlock()

	if p.cfg.OnEvent != nil {
		for _, ev := range events {
			p.cfg.OnEvent(ev)
		}
	}
	return nil
}

// storedBundles loads the last-known-good bundle of each trust domain in
// want that the poller does not follow yet. Stored bundles are read without
// p.mu, as in LoadLastKnownGood; setMu keeps the set from changing
// meanwhile. A bundle that cannot be loaded is logged and left out: the
// endpoint starts from its bootstrap bundle.
func (p *Poller) storedBundles(want map[spiffeid.TrustDomain]Endpoint) map[spiffeid.TrustDomain]*LKGEntry {
	p.mu.Lock()
	var added []spiffeid.TrustDomain
	for td := range want {
		if _, ok := p.rels[td]; !ok {
			added = append(added, td)
		}
	}
	p.mu.Unlock()

	stored := map[spiffeid.TrustDomain]*LKGEntry{}
	if p.cfg.LKG == nil {
		return stored
	}
	for _, td := range added {
		e, err := p.cfg.LKG.Load(td)
		if err != nil {
			p.cfg.Logger.Error("last-known-good bundle not restored; the new endpoint starts from its bootstrap bundle",
				logattr.TrustDomain, td.Name(), logattr.Error, err)
			continue
		}
		if e != nil {
			stored[td] = e
		}
	}
	return stored
}

// removeLocked stops following td: its bundle leaves the trust store.
func (p *Poller) removeLocked(td spiffeid.TrustDomain) Event {
	r := p.rels[td]
	p.unscheduleLocked(r)
	delete(p.rels, td)
	p.cfg.Sink.Remove(SourceName(td), td)
	p.cfg.Logger.Info("federation endpoint removed; its bundle is no longer trusted", logattr.TrustDomain, td.Name(),
		logattr.EndpointURL, r.ep.URL.String())
	return Event{Kind: EventEndpointRemoved, TrustDomain: td, EndpointURL: r.ep.URL.String(),
		OldSequence: SequenceOf(r.held), Removed: Fingerprints(r.held)}
}

// addLocked starts following ep, from its stored last-known-good bundle
// (e, if any), else its bootstrap bundle, and polls it now.
func (p *Poller) addLocked(ep Endpoint, e *LKGEntry, now time.Time) Event {
	td := ep.TrustDomain
	r := p.newRelationship(ep)
	if e != nil {
		if err := p.restoreLocked(r, e); err != nil {
			p.cfg.Logger.Error("last-known-good bundle not restored", logattr.TrustDomain, td.Name(), logattr.Error, err)
		}
	}
	p.holdBootstrapLocked(r)
	p.rels[td] = r
	p.startLocked(r, now)
	p.cfg.Logger.Info("federation endpoint added", logattr.TrustDomain, td.Name(), logattr.EndpointURL, ep.URL.String(),
		"profile", ep.Profile, "held_sequence", seqString(r.held))
	return Event{Kind: EventEndpointAdded, TrustDomain: td, EndpointURL: ep.URL.String(),
		NewSequence: SequenceOf(r.held), Added: Fingerprints(r.held)}
}

// changeLocked applies a new configuration ep for a followed trust domain
// and polls it now; changed is false when nothing that matters changed.
func (p *Poller) changeLocked(old *relationship, ep Endpoint, now time.Time) (ev Event, changed bool) {
	what := endpointChanges(old.ep, ep)
	if len(what) == 0 {
		return Event{}, false
	}
	td := ep.TrustDomain
	r := old.reconfigured(ep)
	if !old.fetched() {
		// Never fetched (nor restored): the operator's new bootstrap
		// bundle (or none) replaced the old one.
		if r.held != nil {
			p.cfg.Sink.Set(SourceName(td), r.held)
		} else {
			p.cfg.Sink.Remove(SourceName(td), td)
		}
	}
	p.unscheduleLocked(old)
	p.rels[td] = r
	p.startLocked(r, now)
	p.cfg.Logger.Info("federation endpoint changed; polling it now", logattr.TrustDomain, td.Name(),
		logattr.EndpointURL, ep.URL.String(), "changed", what)
	return Event{Kind: EventEndpointChanged, TrustDomain: td, EndpointURL: ep.URL.String(),
		OldSequence: SequenceOf(old.held), NewSequence: SequenceOf(r.held), Reason: strings.Join(what, ",")}, true
}

// startLocked schedules a new relationship's first poll now, when Run runs.
func (p *Poller) startLocked(r *relationship, now time.Time) {
	r.next = now
	p.scheduleLocked(r)
}

// unscheduleLocked removes r's cron entry.
func (p *Poller) unscheduleLocked(r *relationship) {
	if p.cron != nil && r.entry != 0 {
		p.cron.Remove(r.entry)
	}
	r.entry = 0
}

// sortLocked rebuilds p.order from p.rels.
func (p *Poller) sortLocked() {
	p.order = slices.SortedFunc(maps.Keys(p.rels), compareTrustDomains)
}

func compareTrustDomains(a, b spiffeid.TrustDomain) int { return cmp.Compare(a.Name(), b.Name()) }

// endpointChanges names what differs between two configurations of one
// trust domain's endpoint.
func endpointChanges(a, b Endpoint) []string {
	var what []string
	if a.URL.String() != b.URL.String() {
		what = append(what, "url")
	}
	if a.Profile != b.Profile {
		what = append(what, "profile")
	}
	if a.EndpointSPIFFEID != b.EndpointSPIFFEID {
		what = append(what, "endpoint_spiffe_id")
	}
	if a.Refresh != b.Refresh {
		what = append(what, "refresh")
	}
	switch {
	case (a.BootstrapBundle == nil) != (b.BootstrapBundle == nil):
		what = append(what, "bootstrap_bundle")
	case a.BootstrapBundle != nil && !a.BootstrapBundle.Equal(b.BootstrapBundle):
		what = append(what, "bootstrap_bundle")
	}
	return what
}
