package federation

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/robfig/cron/v3"
	"github.com/spiffe/go-spiffe/v2/bundle/spiffebundle"
	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/schedule"
)

// Sink is the trust store: it receives every bundle the poller accepts
// (and the last-known-good ones it loads), and it is where the fetcher
// reads the roots that authenticate an https_spiffe endpoint, so a
// fetched bundle goes one way, poller to store, and every reader (the
// fetcher, SDS, the bundle endpoint) takes it from there. Source names the
// endpoint. Remove withdraws an endpoint's bundle when the endpoint is no
// longer configured.
type Sink interface {
	Set(source string, b *spiffebundle.Bundle)
	Remove(source string, td spiffeid.TrustDomain)
	BundleSource
}

// State summarizes an endpoint for operators.
type State string

// Endpoint states.
const (
	StatePending State = "pending" // no poll yet since the start (or no bundle yet)
	StateOK      State = "ok"      // last poll succeeded
	StateFailing State = "failing" // last poll failed; the last good bundle is kept
	StateStale   State = "stale"   // no success for staleAfter refresh intervals
)

// maxClockSkew is how far in the future a stored fetch time may lie and
// still count as the last success (clamped to now): replicas sharing a
// store disagree on the time by a little. Further out, the clock or the
// file went wrong, and the entry claims no success at all rather than
// hide staleness.
const maxClockSkew = 5 * time.Minute

// ErrPollInProgress is returned by Refresh while a poll of the same trust
// domain is still running.
var ErrPollInProgress = errors.New("a poll is already running")

// staleAfter is how many refresh intervals without success make a trust
// domain stale.
const staleAfter = 3

// PollerConfig configures a Poller.
type PollerConfig struct {
	Endpoints []Endpoint
	Fetcher   FetcherConfig // Roots is set by the poller: the Sink
	Policy    RefreshPolicy // server-wide clamps
	// LKG persists accepted bundles; nil keeps them in memory only.
	LKG  LastKnownGood
	Sink Sink
	// AllowEmpty applies keys: [] (revoking every key) instead of refusing it.
	AllowEmpty bool
	// OnEvent, when set, hears of every trust change: endpoints added,
	// changed and removed, bundles accepted and refused. It is called
	// without the poller's lock held, in order for each trust domain, and
	// should not block for long: polls of that trust domain wait for it.
	OnEvent    func(Event)
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Now and Rand are injected for tests; defaults time.Now, rand.Float64.
	Now  func() time.Time
	Rand func() float64
}

// EventKind names a trust change.
type EventKind string

// Event kinds.
const (
	EventEndpointAdded   EventKind = "endpoint_added"
	EventEndpointRemoved EventKind = "endpoint_removed"
	EventEndpointChanged EventKind = "endpoint_changed"
	// EventBundleAccepted: a new or changed bundle was applied (not an
	// unchanged one, not a 304).
	EventBundleAccepted EventKind = "bundle_accepted"
	// EventBundleRejected: a bundle was fetched but refused (Accept's
	// verdict, a foreign trust domain's roots). Fetches that failed before
	// a bundle arrived are not trust changes and have no event.
	EventBundleRejected EventKind = "bundle_rejected"
)

// Event is one trust change, for the audit log.
type Event struct {
	Kind        EventKind
	TrustDomain spiffeid.TrustDomain
	EndpointURL string
	// OldSequence is the held bundle's sequence before the change,
	// NewSequence the fetched (rejected) or applied one; nil when none.
	OldSequence, NewSequence *uint64
	// Added and Removed are the authorities the change added and removed
	// (an added endpoint's restored bundle; a removed endpoint's last one).
	Added, Removed []Fingerprint
	// Reason is what changed (endpoint_changed: "url", "profile", ...) or
	// the refusal kind (bundle_rejected: "sequence_regression", ...).
	Reason string
	// Err is why a bundle was rejected.
	Err error
}

// Status is what /v1/federation reports for one trust domain.
type Status struct {
	TrustDomain         string     `json:"trust_domain"`
	EndpointURL         string     `json:"endpoint_url"`
	Profile             Profile    `json:"profile"`
	EndpointSPIFFEID    string     `json:"endpoint_spiffe_id,omitempty"`
	State               State      `json:"state"`
	Sequence            *uint64    `json:"sequence"`
	RefreshHintSeconds  *int64     `json:"refresh_hint_seconds"`
	LastAttempt         *time.Time `json:"last_attempt"`
	LastSuccess         *time.Time `json:"last_success"`
	LastError           string     `json:"last_error,omitempty"`
	NextRefresh         *time.Time `json:"next_refresh"`
	ConsecutiveFailures int        `json:"consecutive_failures"`
	// Refusals counts failed and refused polls since the process started,
	// by kind (the trustbridge_federation_fetches_total result label).
	Refusals    map[string]uint64 `json:"refusals,omitempty"`
	Authorities []AuthorityInfo   `json:"authorities"`
}

// AuthorityInfo describes one authority of a held bundle.
type AuthorityInfo struct {
	Kind     AuthorityKind `json:"kind"`
	SHA256   string        `json:"sha256"`
	Subject  string        `json:"subject,omitempty"`
	KeyID    string        `json:"key_id,omitempty"`
	NotAfter *time.Time    `json:"not_after,omitempty"`
}

// endpointState is the poller's record of one endpoint.
type endpointState struct {
	ep          Endpoint
	held        *spiffebundle.Bundle // last good, nil when none
	fromLKG     bool
	etag        string
	lastAttempt time.Time
	// lastSuccess is when the endpoint last served a good bundle: a poll
	// of this process, or the fetch time a restored entry records.
	lastSuccess time.Time
	// savedAt is the fetch time the last-known-good store holds for held.
	savedAt  time.Time
	lastErr  error
	failures int
	next     time.Time
	entry    cron.EntryID
	polling  bool
	refusals map[string]uint64
	// state is the state last logged; "" until the first poll outcome,
	// which counts as pending.
	state State
}

// fetched says whether st holds a bundle its endpoint served (fetched, or
// restored from the last-known-good store), not only its bootstrap one.
func (st *endpointState) fetched() bool {
	return st.held != nil && st.held != st.ep.BootstrapBundle
}

// Poller polls every configured bundle endpoint on its own schedule
// (SPIFFE Federation §6.2): at the clamped refresh hint with jitter, with
// exponential backoff on failure, keeping the last good bundle through
// any failure or refusal.
type Poller struct {
	cfg     PollerConfig
	fetcher *Fetcher
	metrics *pollerMetrics

	// setMu serializes SetEndpoints calls.
	setMu sync.Mutex
	// saveMus order each trust domain's last-known-good writes with
	// Forget: a save decides under its trust domain's lock whether that
	// trust domain is still followed, so a bundle Forget deleted is never
	// written back by a poll that ended before. One lock per trust domain
	// (under mu; kept for the poller's life): a slow store write of one
	// peer must not hold up another's.
	saveMus map[spiffeid.TrustDomain]*sync.Mutex
	mu      sync.Mutex
	states  map[spiffeid.TrustDomain]*endpointState
	order   []spiffeid.TrustDomain // sorted by name; replaced, never changed in place
	cron    *cron.Cron
	runCtx  context.Context // Run's context: scheduled polls end with it
}

// NewPoller checks cfg; it starts nothing.
func NewPoller(cfg PollerConfig) (*Poller, error) {
	if cfg.Sink == nil {
		return nil, errors.New("federation: poller needs a sink")
	}
	if _, err := MergeEndpoints(cfg.Endpoints); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.Policy == (RefreshPolicy{}) {
		cfg.Policy = RefreshPolicy{Min: DefaultMinRefresh, Max: DefaultMaxRefresh}
	}
	p := &Poller{cfg: cfg, states: map[spiffeid.TrustDomain]*endpointState{}}
	for _, ep := range cfg.Endpoints {
		p.states[ep.TrustDomain] = &endpointState{ep: ep}
		// The store holds the bootstrap bundle from the start, so the
		// fetcher can authenticate the first poll with it; nothing is held
		// yet, so LoadLastKnownGood still restores any stored bundle.
		if ep.BootstrapBundle != nil {
			cfg.Sink.Set(SourceName(ep.TrustDomain), ep.BootstrapBundle)
		}
	}
	p.sortLocked()
	fc := cfg.Fetcher
	// The store authenticates an https_spiffe server with the roots of its
	// SPIFFE ID's trust domain: the bundle held for a polled one (the
	// bootstrap bundle until the first fetch), and whatever the store holds
	// for others (an endpoint served by a hub, or by our own CA).
	fc.Roots = cfg.Sink
	p.fetcher = NewFetcher(fc)
	m, err := newPollerMetrics(cfg.Registerer, p)
	if err != nil {
		return nil, fmt.Errorf("federation: %w", err)
	}
	p.metrics = m
	return p, nil
}

// SourceName is the trust-store source name of an endpoint's bundles.
func SourceName(td spiffeid.TrustDomain) string { return "federation:" + td.Name() }

// LoadLastKnownGood restores every endpoint's last good bundle (else its
// bootstrap bundle) into the sink before the first poll, so a restart
// with every remote down keeps trust. A corrupt entry is reported, not
// fatal: that endpoint starts from its bootstrap bundle.
//
// It may be called again at any time: replicas that do not poll (followers
// of the leader that does) call it when the shared store changes. A bundle
// already held is replaced only by a stored one Accept takes as newer or
// changed; an older one (a sequence going back) is skipped, so trust never
// goes backwards.
func (p *Poller) LoadLastKnownGood() []error {
	var errs []error
	// The store is read without p.mu: it may be an API server that does
	// not answer, and polls, Status and TLS handshakes must not wait for
	// it; restoreLocked never goes back.
	p.mu.Lock()
	order := p.order
	p.mu.Unlock()
	for _, td := range order {
		var (
			e   *LKGEntry
			err error
		)
		if p.cfg.LKG != nil {
			e, err = p.cfg.LKG.Load(td)
		}
		p.mu.Lock()
		st, ok := p.states[td]
		switch {
		case !ok:
			// Removed meanwhile by SetEndpoints.
			p.mu.Unlock()
			continue
		case err != nil:
			errs = append(errs, err)
		case e != nil:
			if err := p.restoreLocked(st, e); err != nil {
				errs = append(errs, err)
			}
			p.mu.Unlock()
			continue
		}
		if st.held == nil && st.ep.BootstrapBundle != nil {
			st.held = st.ep.BootstrapBundle
			p.cfg.Sink.Set(SourceName(td), st.ep.BootstrapBundle)
		}
		p.mu.Unlock()
	}
	return errs
}

// LoadLastKnownGoodFor is LoadLastKnownGood for one trust domain, for a
// watch that says which entry changed. A trust domain this poller does not
// federate is ignored: its entry adds no trust here.
func (p *Poller) LoadLastKnownGoodFor(td spiffeid.TrustDomain) error {
	p.mu.Lock()
	_, ok := p.states[td]
	p.mu.Unlock()
	if !ok || p.cfg.LKG == nil {
		return nil
	}
	// Read without p.mu, as in LoadLastKnownGood.
	e, err := p.cfg.LKG.Load(td)
	if err != nil || e == nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st, ok := p.states[td]
	if !ok {
		return nil // removed meanwhile
	}
	return p.restoreLocked(st, e)
}

// restoreLocked takes a stored entry for st, unless what st holds (other
// than its bootstrap bundle, which any stored bundle supersedes) is the
// same or newer.
func (p *Poller) restoreLocked(st *endpointState, e *LKGEntry) error {
	td := st.ep.TrustDomain
	if st.fetched() {
		dec, err := Accept(st.held, e.Bundle, p.cfg.AllowEmpty)
		switch {
		case errors.Is(err, ErrSequenceRegression):
			return nil // the held bundle is newer; keep it
		case err != nil:
			return fmt.Errorf("federation: last-known-good for %q not taken, keeping sequence %s: %w", td.Name(), seqString(st.held), err)
		case dec == DecisionUnchanged:
			// The same bundle, fetched again by the replica that polls.
			p.restoredSuccessLocked(st, e.FetchedAt)
			return nil
		}
	}
	st.held, st.fromLKG, st.etag = e.Bundle, true, e.ETag
	if e.EndpointURL != st.ep.URL.String() {
		// An entity tag only means something for the URL that sent it.
		st.etag = ""
	}
	p.restoredSuccessLocked(st, e.FetchedAt)
	p.cfg.Sink.Set(SourceName(td), e.Bundle)
	p.cfg.Logger.Info("restored last-known-good bundle", logattr.TrustDomain, td.Name(),
		logattr.Sequence, seqString(e.Bundle), "fetched_at", e.FetchedAt)
	return nil
}

// restoredSuccessLocked takes a stored entry's fetch time as st's last
// success when it is later: after a restart with the endpoint down, the
// status shows when the bundle was last fetched, and the staleness rule
// applies to it, instead of "never".
func (p *Poller) restoredSuccessLocked(st *endpointState, fetchedAt time.Time) {
	t := restoredSuccess(fetchedAt, p.cfg.Now())
	if t.After(st.lastSuccess) {
		st.lastSuccess = t
	}
	if fetchedAt.After(st.savedAt) {
		st.savedAt = fetchedAt
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

// Run polls every endpoint until ctx is done; each trust domain has its
// own cron entry, so a slow or dead endpoint never delays another. Run may
// be called again after it returned (a replica that leads again), not
// while it runs.
func (p *Poller) Run(ctx context.Context) error {
	c := cron.New(cron.WithLocation(time.UTC))
	p.mu.Lock()
	p.cron = c
	p.runCtx = ctx
	now := p.cfg.Now()
	for _, td := range p.order {
		st := p.states[td]
		st.entry = 0  // an entry of an earlier Run's cron
		st.next = now // first poll at once
		p.scheduleLocked(st)
	}
	p.mu.Unlock()
	c.Start()
	<-ctx.Done()
	<-c.Stop().Done()
	p.mu.Lock()
	if p.cron == c {
		p.cron = nil
		for _, st := range p.states {
			st.entry = 0
		}
	}
	p.mu.Unlock()
	return nil
}

// saveLKG persists st's bundle, unless td stopped being followed by st
// since the poll (then Forget may have deleted what this would write).
func (p *Poller) saveLKG(td spiffeid.TrustDomain, st *endpointState, e *LKGEntry, log *slog.Logger) {
	mu := p.saveMu(td)
	mu.Lock()
	defer mu.Unlock()
	p.mu.Lock()
	current := p.states[td] == st
	p.mu.Unlock()
	if !current {
		return
	}
	if err := p.cfg.LKG.Save(*e); err != nil {
		// Trust is applied; only its persistence failed. Say so loudly.
		log.Error("could not persist the last-known-good bundle", logattr.Error, err)
	}
}

// Forget deletes the stored bundle of td, a trust domain the poller no
// longer follows (SetEndpoints removed it): its trust is withdrawn from
// the store too, and adding td again starts from its bootstrap bundle.
// A store without deletion (Kubernetes' ConfigMap) keeps it; Forget says
// so with ErrCannotForget.
func (p *Poller) Forget(td spiffeid.TrustDomain) error {
	mu := p.saveMu(td)
	mu.Lock()
	defer mu.Unlock()
	p.mu.Lock()
	_, followed := p.states[td]
	p.mu.Unlock()
	if followed {
		return fmt.Errorf("federation: %s is still federated: remove its endpoint first", td.Name())
	}
	if p.cfg.LKG == nil {
		return nil
	}
	r, ok := p.cfg.LKG.(interface {
		Remove(spiffeid.TrustDomain) error
	})
	if !ok {
		return fmt.Errorf("federation: %w: %s", ErrCannotForget, td.Name())
	}
	return r.Remove(td)
}

// saveMu is td's save lock.
func (p *Poller) saveMu(td spiffeid.TrustDomain) *sync.Mutex {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.saveMus == nil {
		p.saveMus = map[spiffeid.TrustDomain]*sync.Mutex{}
	}
	mu, ok := p.saveMus[td]
	if !ok {
		mu = &sync.Mutex{}
		p.saveMus[td] = mu
	}
	return mu
}

// ErrCannotForget: the last-known-good store cannot delete a bundle.
var ErrCannotForget = errors.New("the last-known-good store cannot delete a stored bundle")

// scheduleLocked (re)adds st's cron entry for st.next. The entry parks
// itself after firing; the job re-adds it with the time the poll's
// outcome decides.
func (p *Poller) scheduleLocked(st *endpointState) {
	if p.cron == nil {
		return
	}
	if st.entry != 0 {
		p.cron.Remove(st.entry)
	}
	st.entry = p.cron.Schedule(schedule.Once(st.next), cron.FuncJob(func() { _ = p.poll(p.runCtx, st.ep.TrustDomain) }))
}

// Refresh polls td now (trustbridge federation refresh). The poll does
// not end when the caller goes away: an aborted request must not count
// as the endpoint's failure and push its next poll back.
func (p *Poller) Refresh(ctx context.Context, td spiffeid.TrustDomain) error {
	p.mu.Lock()
	_, ok := p.states[td]
	p.mu.Unlock()
	if !ok {
		return fmt.Errorf("federation: trust domain %q is not federated", td.Name())
	}
	return p.poll(context.WithoutCancel(ctx), td)
}

// poll fetches one endpoint once and applies the result.
func (p *Poller) poll(ctx context.Context, td spiffeid.TrustDomain) error {
	p.mu.Lock()
	st := p.states[td]
	if st == nil {
		// Removed by SetEndpoints after this poll was scheduled or asked for.
		p.mu.Unlock()
		return fmt.Errorf("federation: trust domain %q is not federated", td.Name())
	}
	if st.polling {
		p.mu.Unlock()
		// One poll per trust domain at a time; say so rather than claim a
		// refresh that did not happen.
		return fmt.Errorf("federation: %w for %s; its result will show in the status", ErrPollInProgress, td.Name())
	}
	st.polling = true
	ep, etag := st.ep, st.etag
	p.mu.Unlock()

	start := p.cfg.Now()
	res, err := p.fetcher.Fetch(ctx, ep, etag)

	log := p.cfg.Logger.With(logattr.TrustDomain, td.Name(), logattr.EndpointURL, ep.URL.String())
	var (
		save *LKGEntry
		ev   *Event
	)
	defer func() {
		// Persist after releasing p.mu: the store may be an API server
		// that does not answer, and Status, other polls' TLS handshakes
		// and followers' reloads must not wait for it. st.polling stays
		// set until then, so saves of one trust domain stay in order.
		if save != nil {
			p.saveLKG(td, st, save, log)
		}
		if ev != nil && p.cfg.OnEvent != nil {
			p.cfg.OnEvent(*ev)
		}
		p.mu.Lock()
		st.polling = false
		p.mu.Unlock()
	}()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.states[td] != st {
		// The endpoint was removed or reconfigured while this poll ran:
		// what it fetched answers a question nobody asks any more.
		log.Info("poll result discarded: the endpoint was reconfigured or removed meanwhile")
		return fmt.Errorf("federation: %s was reconfigured or removed during the poll", td.Name())
	}
	st.lastAttempt = start
	if err == nil {
		save, ev, err = p.applyLocked(st, res, log)
	}
	if err != nil {
		st.failures++
		st.lastErr = err
		kind := FetchErrorKind(err)
		if kind == "" || kind == "transport" {
			kind = rejectionKind(err)
		}
		if st.refusals == nil {
			st.refusals = map[string]uint64{}
		}
		st.refusals[kind]++
		p.metrics.fetches.WithLabelValues(td.Name(), kind).Inc()
		log.Warn("bundle poll failed; keeping the last good bundle", logattr.Error, err,
			"consecutive_failures", st.failures, "held_sequence", seqString(st.held))
	} else {
		st.failures = 0
		st.lastErr = nil
		st.lastSuccess = p.cfg.Now()
		p.metrics.fetches.WithLabelValues(td.Name(), "ok").Inc()
	}
	p.noteStateLocked(st, log)
	st.next = p.cfg.Now().Add(NextRefresh(p.intervalLocked(st), st.failures, p.cfg.Rand()))
	p.scheduleLocked(st)
	return err
}

// noteStateLocked logs st's state when a poll changed it, once per
// change: a recovery is as much news to an operator as a failure, and a
// peer failing for days must not repeat it on every poll. Staleness is a
// matter of time, not of a poll's outcome; it is noticed, and logged, at
// the first poll past the threshold (polls never stop while Run runs).
func (p *Poller) noteStateLocked(st *endpointState, log *slog.Logger) {
	from, to := st.state, p.stateLocked(st, p.cfg.Now())
	if from == "" {
		from = StatePending
	}
	st.state = to
	if from == to {
		return
	}
	attrs := []any{"from", string(from), "to", string(to), "reason", transitionReason(st, to)}
	switch to {
	case StateOK:
		log.Info("federation state changed", attrs...)
	case StateStale:
		log.Error("federation state changed", append(attrs, "last_success", optTime(st.lastSuccess))...)
	default:
		log.Warn("federation state changed", attrs...)
	}
}

// transitionReason says why st entered state to.
func transitionReason(st *endpointState, to State) string {
	switch {
	case to == StateOK:
		return "bundle fetched (sequence " + seqString(st.held) + ")"
	case to == StateStale && st.lastSuccess.IsZero():
		return fmt.Sprintf("no successful poll yet after %d failures; last error: %v", st.failures, st.lastErr)
	case to == StateStale:
		return fmt.Sprintf("no successful poll for %d refresh intervals; last error: %v", staleAfter, st.lastErr)
	case st.lastErr != nil:
		return st.lastErr.Error()
	}
	return "no bundle held"
}

func rejectionKind(err error) string {
	switch {
	case errors.Is(err, ErrSequenceRegression):
		return "sequence_regression"
	case errors.Is(err, ErrSequenceConflict):
		return "sequence_conflict"
	case errors.Is(err, ErrEmptyBundle):
		return "empty_bundle"
	case errors.Is(err, ErrTrustDomainMismatch):
		return "trust_domain_mismatch"
	case errors.Is(err, ErrPollInProgress):
		return "in_progress"
	default:
		return "transport"
	}
}

// applyLocked takes a fetched bundle if Accept does; save is the entry
// the caller persists and ev the event it reports, after releasing p.mu.
func (p *Poller) applyLocked(st *endpointState, res *FetchResult, log *slog.Logger) (save *LKGEntry, ev *Event, err error) {
	if res.NotModified {
		return p.confirmedLocked(st), nil, nil
	}
	rejected := func(err error) *Event {
		return &Event{Kind: EventBundleRejected, TrustDomain: st.ep.TrustDomain, EndpointURL: st.ep.URL.String(),
			OldSequence: SequenceOf(st.held), NewSequence: SequenceOf(res.Bundle), Reason: rejectionKind(err), Err: err}
	}
	// The same verdict as CheckDocument's (bundle inspect).
	dec, err := CheckBundle(st.held, res.Bundle, res.Warnings, p.cfg.AllowEmpty)
	if err == nil {
		for _, w := range res.Warnings {
			log.Warn("bundle element ignored", logattr.Warning, w.String())
		}
	}
	if err != nil {
		log.Error("fetched bundle refused; keeping the last good bundle", logattr.Error, err,
			"old_sequence", seqString(st.held), "new_sequence", seqString(res.Bundle))
		return nil, rejected(err), err
	}
	st.etag = res.ETag
	if dec == DecisionUnchanged && !st.fromLKG {
		return p.confirmedLocked(st), nil, nil
	}
	diff := Diff(st.held, res.Bundle)
	old := st.held
	st.held, st.fromLKG = res.Bundle, false
	p.cfg.Sink.Set(SourceName(st.ep.TrustDomain), res.Bundle)
	save = p.entryLocked(st)
	log.Info("bundle accepted", "old_sequence", seqString(old), "new_sequence", seqString(res.Bundle),
		"added", fingerprintStrings(diff.Added), "removed", fingerprintStrings(diff.Removed))
	ev = &Event{Kind: EventBundleAccepted, TrustDomain: st.ep.TrustDomain, EndpointURL: st.ep.URL.String(),
		OldSequence: SequenceOf(old), NewSequence: SequenceOf(res.Bundle), Added: diff.Added, Removed: diff.Removed}
	return save, ev, nil
}

// confirmedLocked is the entry to save when the endpoint served the held
// bundle again (unchanged, or 304): only its fetch time is new. It is
// saved at most every half refresh interval, so the store's fetch time,
// which becomes the last success after a restart, is at most that old
// without the store being written on every operator refresh.
func (p *Poller) confirmedLocked(st *endpointState) *LKGEntry {
	if st.held == nil || p.cfg.Now().Sub(st.savedAt) < p.intervalLocked(st)/2 {
		return nil
	}
	return p.entryLocked(st)
}

// entryLocked is the last-known-good entry of st's held bundle, fetched
// now; nil without a store.
func (p *Poller) entryLocked(st *endpointState) *LKGEntry {
	if p.cfg.LKG == nil {
		return nil
	}
	now := p.cfg.Now()
	st.savedAt = now
	return &LKGEntry{TrustDomain: st.ep.TrustDomain, Bundle: st.held, ETag: st.etag,
		EndpointURL: st.ep.URL.String(), FetchedAt: now}
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

func (p *Poller) intervalLocked(st *endpointState) time.Duration {
	var hint time.Duration
	var has bool
	if st.held != nil {
		hint, has = st.held.RefreshHint()
	}
	return RefreshInterval(hint, has, p.cfg.Policy.For(st.ep))
}

// Status reports every trust domain, sorted by name.
func (p *Poller) Status() []Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.cfg.Now()
	out := make([]Status, 0, len(p.order))
	for _, td := range p.order {
		st := p.states[td]
		s := Status{
			TrustDomain: td.Name(), EndpointURL: st.ep.URL.String(), Profile: st.ep.Profile,
			ConsecutiveFailures: st.failures, LastAttempt: optTime(st.lastAttempt),
			LastSuccess: optTime(st.lastSuccess), NextRefresh: optTime(st.next), Authorities: []AuthorityInfo{},
		}
		if len(st.refusals) > 0 {
			s.Refusals = make(map[string]uint64, len(st.refusals))
			for k, v := range st.refusals {
				s.Refusals[k] = v
			}
		}
		if !st.ep.EndpointSPIFFEID.IsZero() {
			s.EndpointSPIFFEID = st.ep.EndpointSPIFFEID.String()
		}
		if st.lastErr != nil {
			s.LastError = st.lastErr.Error()
		}
		s.State = p.stateLocked(st, now)
		if st.held != nil {
			if seq, ok := st.held.SequenceNumber(); ok {
				s.Sequence = &seq
			}
			if h, ok := st.held.RefreshHint(); ok {
				secs := int64(h / time.Second)
				s.RefreshHintSeconds = &secs
			}
			s.Authorities = authorityInfos(st.held)
		}
		out = append(out, s)
	}
	return out
}

// stateLocked is st's state at now.
func (p *Poller) stateLocked(st *endpointState, now time.Time) State {
	interval := p.intervalLocked(st)
	switch {
	case st.held == nil, st.lastAttempt.IsZero():
		// Nothing held, or only what the operator or the store gave
		// us: not yet confirmed by the endpoint.
		return StatePending
	case !st.lastSuccess.IsZero() && now.Sub(st.lastSuccess) > staleAfter*interval,
		st.lastSuccess.IsZero() && st.failures >= staleAfter:
		return StateStale
	case st.failures > 0:
		return StateFailing
	}
	return StateOK
}

func authorityInfos(b *spiffebundle.Bundle) []AuthorityInfo {
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

func fingerprintStrings(fs []Fingerprint) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.String()
	}
	return out
}
