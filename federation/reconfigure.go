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
	for _, td := range slices.SortedFunc(maps.Keys(p.states), compareTrustDomains) {
		if _, ok := want[td]; !ok {
			events = append(events, p.removeLocked(td))
		}
	}
	for _, td := range slices.SortedFunc(maps.Keys(want), compareTrustDomains) {
		old, ok := p.states[td]
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
		if _, ok := p.states[td]; !ok {
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
	st := p.states[td]
	p.unscheduleLocked(st)
	delete(p.states, td)
	p.cfg.Sink.Remove(SourceName(td), td)
	p.cfg.Logger.Info("federation endpoint removed; its bundle is no longer trusted", logattr.TrustDomain, td.Name(),
		logattr.EndpointURL, st.ep.URL.String())
	return Event{Kind: EventEndpointRemoved, TrustDomain: td, EndpointURL: st.ep.URL.String(),
		OldSequence: SequenceOf(st.held), Removed: Fingerprints(st.held)}
}

// addLocked starts following ep, from its stored last-known-good bundle
// (e, if any), else its bootstrap bundle, and polls it now.
func (p *Poller) addLocked(ep Endpoint, e *LKGEntry, now time.Time) Event {
	td := ep.TrustDomain
	st := &endpointState{ep: ep}
	if e != nil {
		if err := p.restoreLocked(st, e); err != nil {
			p.cfg.Logger.Error("last-known-good bundle not restored", logattr.TrustDomain, td.Name(), logattr.Error, err)
		}
	}
	if st.held == nil && ep.BootstrapBundle != nil {
		st.held = ep.BootstrapBundle
		p.cfg.Sink.Set(SourceName(td), ep.BootstrapBundle)
	}
	p.states[td] = st
	p.startLocked(st, now)
	p.cfg.Logger.Info("federation endpoint added", logattr.TrustDomain, td.Name(), logattr.EndpointURL, ep.URL.String(),
		"profile", ep.Profile, "held_sequence", seqString(st.held))
	return Event{Kind: EventEndpointAdded, TrustDomain: td, EndpointURL: ep.URL.String(),
		NewSequence: SequenceOf(st.held), Added: Fingerprints(st.held)}
}

// changeLocked applies a new configuration ep for a followed trust domain
// and polls it now; changed is false when nothing that matters changed.
func (p *Poller) changeLocked(old *endpointState, ep Endpoint, now time.Time) (ev Event, changed bool) {
	what := endpointChanges(old.ep, ep)
	if len(what) == 0 {
		return Event{}, false
	}
	td := ep.TrustDomain
	// A new state, so that a poll running for the old configuration finds
	// itself replaced and discards its result.
	// The state last logged carries over too: the next poll's outcome
	// is a transition only if it differs from what the status showed.
	st := &endpointState{ep: ep, held: old.held, fromLKG: old.fromLKG, lastAttempt: old.lastAttempt,
		lastSuccess: old.lastSuccess, savedAt: old.savedAt, lastErr: old.lastErr, failures: old.failures, refusals: old.refusals,
		state: old.state}
	if !old.fetched() {
		// Never fetched (nor restored): the operator's new bootstrap
		// bundle (or none) replaces the old one.
		st.held, st.fromLKG = ep.BootstrapBundle, false
		if st.held != nil {
			p.cfg.Sink.Set(SourceName(td), st.held)
		} else {
			p.cfg.Sink.Remove(SourceName(td), td)
		}
	}
	p.unscheduleLocked(old)
	p.states[td] = st
	p.startLocked(st, now)
	p.cfg.Logger.Info("federation endpoint changed; polling it now", logattr.TrustDomain, td.Name(),
		logattr.EndpointURL, ep.URL.String(), "changed", what)
	return Event{Kind: EventEndpointChanged, TrustDomain: td, EndpointURL: ep.URL.String(),
		OldSequence: SequenceOf(old.held), NewSequence: SequenceOf(st.held), Reason: strings.Join(what, ",")}, true
}

// startLocked schedules a new state's first poll now, when Run runs.
func (p *Poller) startLocked(st *endpointState, now time.Time) {
	st.next = now
	p.scheduleLocked(st)
}

// unscheduleLocked removes st's cron entry.
func (p *Poller) unscheduleLocked(st *endpointState) {
	if p.cron != nil && st.entry != 0 {
		p.cron.Remove(st.entry)
	}
	st.entry = 0
}

// sortLocked rebuilds p.order from p.states.
func (p *Poller) sortLocked() {
	p.order = slices.SortedFunc(maps.Keys(p.states), compareTrustDomains)
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
