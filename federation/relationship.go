package federation

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"

	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// State summarizes an endpoint for operators.
type State string

// Endpoint states (stateOf decides which).
const (
	StatePending State = "pending" // not polled yet, or no bundle yet within the first polls
	StateOK      State = "ok"      // last poll succeeded
	StateFailing State = "failing" // last poll failed; the last good bundle, if any, is kept
	StateStale   State = "stale"   // no success for staleAfter refresh intervals
)

// staleAfter is how many refresh intervals without success make a trust
// domain stale; and how many failed polls, or refresh intervals since the
// first one, an endpoint that never served a bundle has to answer before
// it counts as failing (or stale, when a bootstrap bundle is held).
const staleAfter = 3

// maxClockSkew is how far in the future a stored fetch time may lie and
// still count as the last success (clamped to now): replicas sharing a
// store disagree on the time by a little. Further out, the clock or the
// file went wrong, and the entry claims no success at all rather than
// hide staleness.
const maxClockSkew = 5 * time.Minute

// Status is one federated trust domain's polling state, as the poller
// follows it: the admin API shows it (internal/server/api maps it), the
// CRD controller writes it to ClusterFederatedTrustDomain status. Nil
// pointers are not known yet (never polled, no hint given).
type Status struct {
	TrustDomain         string
	EndpointURL         string
	Profile             Profile
	EndpointSPIFFEID    string
	State               State
	Sequence            *uint64
	RefreshHintSeconds  *int64
	LastAttempt         *time.Time
	LastSuccess         *time.Time
	LastError           string
	NextRefresh         *time.Time
	ConsecutiveFailures int
	// Refusals counts failed and refused polls since the process started,
	// by kind (the trustbridge_federation_fetches_total result label).
	Refusals    map[string]uint64
	Authorities []AuthorityInfo
	// Held says what the bundle held is: HeldFetched, HeldBootstrap, or
	// "" when none is.
	Held string
	// Revoked are the authorities the trust domain revoked that are held
	// against its bundles (issue 38), sorted; nil when none.
	Revoked []Revoked
}

// What a relationship's held bundle is (Status.Held).
const (
	// HeldFetched: served by the endpoint, polled by this process or
	// restored from the last-known-good store.
	HeldFetched = "fetched"
	// HeldBootstrap: the operator's bootstrap bundle, not yet confirmed
	// by a fetch.
	HeldBootstrap = "bootstrap"
)

// AuthorityInfo describes one authority of a held bundle.
type AuthorityInfo struct {
	Kind     AuthorityKind
	SHA256   string
	Subject  string
	KeyID    string
	NotAfter *time.Time
}

// relationship is one federated trust domain as the poller follows it
// (SPIRE's bundle updater): the bundle held, its entity tag, the last
// attempt and success, the failures since, and the state an operator was
// last told of. Its methods are that trust domain's state machine: they
// take the time and a fetch's outcome as arguments and change nothing but
// the relationship, so they are table-tested without a server, a store or
// a clock. The Poller carries out what they decide (the trust store, the
// last-known-good store, metrics, logs, events), schedules the next poll,
// and guards every field with its lock.
type relationship struct {
	ep Endpoint
	// policy is the server-wide refresh clamps; ep.Refresh overrides them.
	policy RefreshPolicy
	// allowEmpty applies keys: [] (revoking every key) instead of refusing it.
	allowEmpty bool

	held    *spiffebundle.Bundle // last good, nil when none
	fromLKG bool
	// bootstrap is what r holds of its bootstrap bundle when that carried
	// authorities revoked since (withoutRevoked): held while it is this is
	// not a fetched bundle either.
	bootstrap *spiffebundle.Bundle
	// revoked is the union of what every bundle accepted from the
	// endpoint listed as revoked, less what expired: a bundle carrying one
	// is refused. It is replaced, never modified, since saved entries
	// share it.
	revoked []Revoked
	etag    string
	// lastAttempt is when the last poll started, firstAttempt when the
	// first one of this process did (stateOf's "never answered" counts
	// refresh intervals from it).
	lastAttempt, firstAttempt time.Time
	// lastSuccess is when the endpoint last served a good bundle: a poll
	// of this process, or the fetch time a restored entry records.
	lastSuccess time.Time
	// savedAt is the fetch time the last-known-good store holds for held.
	savedAt  time.Time
	lastErr  error
	failures int
	next     time.Time
	refusals map[string]uint64
	// state is the state last logged; "" until the first poll outcome,
	// which counts as pending.
	state State

	// The poller's scheduling: the cron entry of the next poll, and
	// whether a poll runs.
	entry   cron.EntryID
	polling bool
}

func newRelationship(ep Endpoint, policy RefreshPolicy, allowEmpty bool) *relationship {
	return &relationship{ep: ep, policy: policy, allowEmpty: allowEmpty}
}

// fetched says whether r holds a bundle its endpoint served (fetched, or
// restored from the last-known-good store), not only its bootstrap one.
func (r *relationship) fetched() bool {
	return r.held != nil && r.held != r.ep.BootstrapBundle && r.held != r.bootstrap
}

// holdBootstrap holds the endpoint's bootstrap bundle when nothing else is
// held; true means it did, and the trust store must hold it too.
func (r *relationship) holdBootstrap() (held bool, dropped []string) {
	if r.held != nil || r.ep.BootstrapBundle == nil {
		return false, nil
	}
	r.held, dropped = withoutRevoked(r.ep.BootstrapBundle, r.revoked)
	r.bootstrap = r.held
	return r.held != nil, dropped
}

// reconfigured is r under ep, a new configuration of its trust domain. It
// is a new relationship, so that a poll running for the old configuration
// finds itself replaced and discards its result. The bundle carries over,
// since the trust domain is the same, unless r never fetched (nor
// restored) one: then ep's bootstrap bundle, or none, replaces the old
// one. The entity tag does not carry over. The state last logged does:
// the next poll's outcome is a transition only if it differs from what
// the status showed.
func (r *relationship) reconfigured(ep Endpoint) *relationship {
	n := &relationship{ep: ep, policy: r.policy, allowEmpty: r.allowEmpty,
		held: r.held, fromLKG: r.fromLKG, revoked: r.revoked, lastAttempt: r.lastAttempt, firstAttempt: r.firstAttempt, lastSuccess: r.lastSuccess,
		savedAt: r.savedAt, lastErr: r.lastErr, failures: r.failures, refusals: r.refusals, state: r.state}
	if !r.fetched() {
		n.fromLKG = false
		n.held, _ = withoutRevoked(ep.BootstrapBundle, r.revoked)
		n.bootstrap = n.held
	}
	return n
}

// restore takes a stored entry, unless what r holds (other than its
// bootstrap bundle, which any stored bundle supersedes) is the same or
// newer; took means r now holds e's bundle, which the trust store must
// hold too.
func (r *relationship) restore(e *LKGEntry, now time.Time) (took bool, err error) {
	// What the entry holds revoked is known whether or not its bundle is
	// taken: revocations only accumulate.
	r.revoked, _ = unionRevoked(pruneRevoked(r.revoked, now), pruneRevoked(e.Revoked, now))
	if err := checkRevoked(r.ep.TrustDomain, e.Bundle, nil, r.revoked); err != nil {
		return false, fmt.Errorf("federation: last-known-good for %q not taken, keeping sequence %s: %w", r.ep.TrustDomain.Name(), seqString(r.held), err)
	}
	if r.fetched() {
		dec, err := Accept(r.held, e.Bundle, r.allowEmpty)
		switch {
		case errors.Is(err, ErrSequenceRegression):
			return false, nil // the held bundle is newer; keep it
		case err != nil:
			return false, fmt.Errorf("federation: last-known-good for %q not taken, keeping sequence %s: %w", r.ep.TrustDomain.Name(), seqString(r.held), err)
		case dec == DecisionUnchanged:
			// The same bundle, fetched again by the replica that polls.
			r.restoredSuccess(e.FetchedAt, now)
			return false, nil
		}
	}
	r.held, r.fromLKG, r.etag = e.Bundle, true, e.ETag
	if e.EndpointURL != r.ep.URL.String() {
		// An entity tag only means something for the URL that sent it.
		r.etag = ""
	}
	r.restoredSuccess(e.FetchedAt, now)
	return true, nil
}

// restoredSuccess takes a stored entry's fetch time as r's last success
// when it is later: after a restart with the endpoint down, the status
// shows when the bundle was last fetched, and the staleness rule applies
// to it, instead of "never".
func (r *relationship) restoredSuccess(fetchedAt, now time.Time) {
	t := restoredSuccess(fetchedAt, now)
	if t.After(r.lastSuccess) {
		r.lastSuccess = t
	}
	if fetchedAt.After(r.savedAt) {
		r.savedAt = fetchedAt
	}
}

// restoredSuccess is the last success a stored fetch time stands for: none
// for a zero time or one further in the future than maxClockSkew, now for
// one a little in the future.
func restoredSuccess(fetchedAt, now time.Time) time.Time {
	switch {
	case fetchedAt.IsZero(), fetchedAt.After(now.Add(maxClockSkew)):
		return time.Time{}
	case fetchedAt.After(now):
		return now
	}
	return fetchedAt
}

// pollResult is what one poll decided, for the Poller to carry out.
type pollResult struct {
	// err is why the poll failed (the fetch, or the refusal of what it
	// fetched); nil on success.
	err error
	// kind is the trustbridge_federation_fetches_total result label: "ok",
	// or the kind of failure or refusal.
	kind string
	// old is the bundle held before the poll; fetched the one served (nil
	// after a 304 or a failed fetch).
	old, fetched *spiffebundle.Bundle
	// accepted: fetched replaced old, and the trust store must hold it.
	accepted bool
	// warnings are the elements ignored in a fetched bundle not refused.
	warnings []bundledoc.Warning
	// save is the last-known-good entry to persist, if any.
	save *LKGEntry
	// event is the trust change to report (accepted or refused), if any.
	event *Event
	// from and to are the states before and after; equal when the poll
	// changed nothing an operator sees.
	from, to State
}

// polled takes the outcome of a poll that started at start and ended at
// now, having fetched res or failed with err, and sets the next poll's
// time with rnd's jitter (see NextRefresh).
func (r *relationship) polled(start, now time.Time, res *FetchResult, err error, rnd float64) pollResult {
	r.lastAttempt = start
	if r.firstAttempt.IsZero() {
		r.firstAttempt = start
	}
	out := pollResult{old: r.held}
	if err == nil {
		out, err = r.take(res, now)
	}
	out.err = err
	if err != nil {
		out.kind = r.failed(err)
	} else {
		r.failures, r.lastErr, r.lastSuccess = 0, nil, now
		out.kind = "ok"
	}
	out.from, out.to = r.noteState(now)
	r.next = now.Add(NextRefresh(r.interval(), r.failures, rnd))
	return out
}

// take judges a fetched document as CheckDocument (bundle inspect) does: a
// 304 or the held bundle again confirms what r holds, a bundle Accept takes
// replaces it, and a refused one leaves r as it was and is the error.
func (r *relationship) take(res *FetchResult, now time.Time) (pollResult, error) {
	out := pollResult{old: r.held}
	if res.NotModified {
		out.save = r.confirmed(now)
		return out, nil
	}
	out.fetched = res.Bundle
	dec, revoked, learned, err := r.judge(res, now)
	if err != nil {
		out.event = &Event{Kind: EventBundleRejected, TrustDomain: r.ep.TrustDomain, EndpointURL: r.ep.URL.String(),
			OldSequence: SequenceOf(r.held), NewSequence: SequenceOf(res.Bundle), Reason: rejectionKind(err), Err: err}
		return out, err
	}
	out.warnings = res.Warnings
	r.etag, r.revoked = res.ETag, revoked
	if dec == DecisionUnchanged && !r.fromLKG {
		out.save = r.confirmed(now)
		if learned && out.save == nil {
			// Same keys, more revoked: a restart must not forget them.
			out.save = r.saved(now)
		}
		return out, nil
	}
	diff := Diff(r.held, res.Bundle)
	r.held, r.fromLKG = res.Bundle, false
	out.accepted = true
	out.save = r.saved(now)
	out.event = &Event{Kind: EventBundleAccepted, TrustDomain: r.ep.TrustDomain, EndpointURL: r.ep.URL.String(),
		OldSequence: SequenceOf(out.old), NewSequence: SequenceOf(res.Bundle), Added: diff.Added, Removed: diff.Removed}
	return out, nil
}

// judge is the verdict on a fetched bundle: refused when it carries an
// authority revoked (by itself or by a bundle accepted before), then
// CheckBundle's. revoked is r's set with what the bundle lists, for r to
// hold if it takes the bundle; learned says it grew.
func (r *relationship) judge(res *FetchResult, now time.Time) (dec Decision, revoked []Revoked, learned bool, err error) {
	r.revoked = pruneRevoked(r.revoked, now)
	if err := checkRevoked(r.ep.TrustDomain, res.Bundle, res.Revocations, r.revoked); err != nil {
		return 0, nil, false, err
	}
	if dec, err = CheckBundle(r.held, res.Bundle, res.Warnings, r.allowEmpty); err != nil {
		return 0, nil, false, err
	}
	revoked, learned, err = learnRevoked(r.ep.TrustDomain, r.revoked, res.Revocations, SequenceOf(res.Bundle), now)
	return dec, revoked, learned, err
}

// failed counts a failed or refused poll; kind is its label.
func (r *relationship) failed(err error) (kind string) {
	r.failures++
	r.lastErr = err
	kind = FetchErrorKind(err)
	if kind == "" || kind == "transport" {
		kind = rejectionKind(err)
	}
	if r.refusals == nil {
		r.refusals = map[string]uint64{}
	}
	r.refusals[kind]++
	return kind
}

// confirmed is the entry to save when the endpoint served the held
// bundle again (unchanged, or 304): only its fetch time is new. It is
// saved at most every half refresh interval, so the store's fetch time,
// which becomes the last success after a restart, is at most that old
// without the store being written on every operator refresh.
func (r *relationship) confirmed(now time.Time) *LKGEntry {
	if r.held == nil || now.Sub(r.savedAt) < r.interval()/2 {
		return nil
	}
	return r.saved(now)
}

// saved is the last-known-good entry of r's held bundle, fetched now.
func (r *relationship) saved(now time.Time) *LKGEntry {
	r.savedAt = now
	return &LKGEntry{TrustDomain: r.ep.TrustDomain, Bundle: r.held, ETag: r.etag,
		EndpointURL: r.ep.URL.String(), FetchedAt: now, Revoked: r.revoked}
}

// interval is the refresh interval of the held bundle's hint (the default
// without one), clamped by the policy.
func (r *relationship) interval() time.Duration {
	var hint time.Duration
	var has bool
	if r.held != nil {
		hint, has = r.held.RefreshHint()
	}
	return RefreshInterval(hint, has, r.policy.For(r.ep))
}

// stateAt is r's state at now.
func (r *relationship) stateAt(now time.Time) State {
	return stateOf(stateFacts{
		held: r.held != nil, lastSuccess: r.lastSuccess, failures: r.failures,
		firstAttempt: r.firstAttempt, interval: r.interval(),
	}, now)
}

// stateFacts are what a relationship's state is decided on.
type stateFacts struct {
	// held: a bundle is held (fetched, restored or the bootstrap one).
	held bool
	// lastSuccess is the last good poll (or the fetch time a restored
	// entry records); zero: never.
	lastSuccess time.Time
	// failures are the failed polls since the last success.
	failures int
	// firstAttempt is when this process first polled the endpoint; zero:
	// not yet (a follower never polls).
	firstAttempt time.Time
	// interval is the refresh interval.
	interval time.Duration
}

// stateOf is the state of a relationship with facts f at now:
//
//   - never polled: pending; so is one that failed its first polls
//     without a bundle held (a peer still starting, a first fetch retried)
//   - never answered: no success, and staleAfter (3) failed polls or
//     staleAfter refresh intervals since the first poll: failing with
//     nothing held (nothing of the trust domain is trusted), stale with a
//     bootstrap bundle held (trusted, never confirmed)
//   - answered once, no success for staleAfter refresh intervals: stale
//   - last poll failed: failing (a bootstrap bundle held: from the first
//     failure); else ok
func stateOf(f stateFacts, now time.Time) State {
	neverAnswered := f.lastSuccess.IsZero() && f.failures > 0 &&
		(f.failures >= staleAfter || now.Sub(f.firstAttempt) >= staleAfter*f.interval)
	switch {
	case f.firstAttempt.IsZero():
		// Only what the operator or the store gave us, if anything: not
		// confirmed by the endpoint since the start.
		return StatePending
	case !f.held && neverAnswered:
		return StateFailing
	case !f.held:
		return StatePending
	case neverAnswered, !f.lastSuccess.IsZero() && now.Sub(f.lastSuccess) > staleAfter*f.interval:
		return StateStale
	case f.failures > 0:
		return StateFailing
	}
	return StateOK
}

// noteState records r's state at now as the one an operator was told of;
// from is the one told before. Staleness is a matter of time, not of a
// poll's outcome: it is noticed at the first poll past the threshold
// (polls never stop while the poller runs).
func (r *relationship) noteState(now time.Time) (from, to State) {
	from, to = r.state, r.stateAt(now)
	if from == "" {
		from = StatePending
	}
	r.state = to
	return from, to
}

// transitionReason says why r entered state to.
func (r *relationship) transitionReason(to State) string {
	switch {
	case to == StateOK:
		return "bundle fetched (sequence " + seqString(r.held) + ")"
	case to == StateFailing && r.held == nil:
		return fmt.Sprintf("the endpoint never served a bundle: %d failed polls, nothing of the trust domain is trusted; last error: %v", r.failures, r.lastErr)
	case to == StateStale && r.lastSuccess.IsZero():
		return fmt.Sprintf("no successful poll yet after %d failures; last error: %v", r.failures, r.lastErr)
	case to == StateStale:
		return fmt.Sprintf("no successful poll for %d refresh intervals; last error: %v", staleAfter, r.lastErr)
	case r.lastErr != nil:
		return r.lastErr.Error()
	}
	return "no bundle held"
}

// status is r as /v1/federation reports it at now.
func (r *relationship) status(now time.Time) Status {
	s := Status{
		TrustDomain: r.ep.TrustDomain.Name(), EndpointURL: r.ep.URL.String(), Profile: r.ep.Profile,
		ConsecutiveFailures: r.failures, LastAttempt: optTime(r.lastAttempt),
		LastSuccess: optTime(r.lastSuccess), NextRefresh: optTime(r.next), Authorities: []AuthorityInfo{},
		State: r.stateAt(now),
	}
	if len(r.refusals) > 0 {
		s.Refusals = make(map[string]uint64, len(r.refusals))
		for k, v := range r.refusals {
			s.Refusals[k] = v
		}
	}
	if !r.ep.EndpointSPIFFEID.IsZero() {
		s.EndpointSPIFFEID = r.ep.EndpointSPIFFEID.String()
	}
	if r.lastErr != nil {
		s.LastError = r.lastErr.Error()
	}
	if r.held != nil {
		s.Sequence = SequenceOf(r.held)
		if h, ok := r.held.RefreshHint(); ok {
			secs := int64(h / time.Second)
			s.RefreshHintSeconds = &secs
		}
		s.Authorities = AuthorityInfos(r.held)
		s.Held = HeldBootstrap
		if r.fetched() {
			s.Held = HeldFetched
		}
	}
	if len(r.revoked) > 0 {
		s.Revoked = slices.Clone(r.revoked)
	}
	return s
}

func rejectionKind(err error) string {
	switch {
	case errors.Is(err, ErrSequenceRegression):
		return "sequence_regression"
	case errors.Is(err, ErrSequenceConflict):
		return "sequence_conflict"
	case errors.Is(err, ErrEmptyBundle):
		return "empty_bundle"
	case errors.Is(err, ErrRevokedAuthority):
		return "revoked_authority"
	case errors.Is(err, ErrTrustDomainMismatch):
		return "trust_domain_mismatch"
	case errors.Is(err, ErrPollInProgress):
		return "in_progress"
	default:
		return "transport"
	}
}

// SequenceOf is b's spiffe_sequence, nil when b is nil or has none.
func SequenceOf(b *spiffebundle.Bundle) *uint64 {
	if b == nil {
		return nil
	}
	if s, ok := b.SequenceNumber(); ok {
		return &s
	}
	return nil
}

// AuthorityInfos describes b's authorities as Status does: its X.509
// authorities, then its JWT and WIT keys.
func AuthorityInfos(b *spiffebundle.Bundle) []AuthorityInfo {
	var out []AuthorityInfo
	for _, c := range b.X509Authorities() {
		na := c.NotAfter.UTC()
		out = append(out, AuthorityInfo{Kind: AuthorityX509, SHA256: sha256Hex(c.Raw), Subject: c.Subject.String(), NotAfter: &na})
	}
	for _, f := range Fingerprints(b) {
		if f.Kind != AuthorityX509 {
			out = append(out, AuthorityInfo{Kind: f.Kind, SHA256: f.SHA256, KeyID: f.KeyID})
		}
	}
	return out
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func seqString(b *spiffebundle.Bundle) string {
	if b == nil {
		return "none"
	}
	if s, ok := b.SequenceNumber(); ok {
		return fmt.Sprint(s)
	}
	return "unset"
}
