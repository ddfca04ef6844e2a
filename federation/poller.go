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
	"github.com/trustbridge/trustbridge/internal/loop"
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

// ErrPollInProgress is returned by Refresh while a poll of the same trust
// domain is still running.
var ErrPollInProgress = errors.New("a poll is already running")

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

// Poller polls every configured bundle endpoint on its own schedule
// (SPIFFE Federation §6.2): at the clamped refresh hint with jitter, with
// exponential backoff on failure, keeping the last good bundle through
// any failure or refusal. It is the manager of all relationships (SPIRE's
// bundle client manager): each trust domain's state machine is its
// relationship, each fetch the Fetcher's; the Poller schedules the polls,
// and carries out what a relationship decides.
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
	rels    map[spiffeid.TrustDomain]*relationship
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
	p := &Poller{cfg: cfg, rels: map[spiffeid.TrustDomain]*relationship{}}
	for _, ep := range cfg.Endpoints {
		p.rels[ep.TrustDomain] = p.newRelationship(ep)
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

// newRelationship starts following ep under the poller's rules.
func (p *Poller) newRelationship(ep Endpoint) *relationship {
	return newRelationship(ep, p.cfg.Policy, p.cfg.AllowEmpty)
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
		r, ok := p.rels[td]
		switch {
		case !ok:
			// Removed meanwhile by SetEndpoints.
			p.mu.Unlock()
			continue
		case err != nil:
			errs = append(errs, err)
		case e != nil:
			err := p.restoreLocked(r, e)
			if err == nil {
				p.mu.Unlock()
				continue
			}
			// A refused entry (one bringing back an authority revoked)
			// is treated as a corrupt one: the bootstrap bundle, if
			// nothing else is held.
			errs = append(errs, err)
		}
		p.holdBootstrapLocked(r)
		p.mu.Unlock()
	}
	return errs
}

// LoadLastKnownGoodFor is LoadLastKnownGood for one trust domain, for a
// watch that says which entry changed. A trust domain this poller does not
// federate is ignored: its entry adds no trust here.
func (p *Poller) LoadLastKnownGoodFor(td spiffeid.TrustDomain) error {
	p.mu.Lock()
	_, ok := p.rels[td]
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
	r, ok := p.rels[td]
	if !ok {
		return nil // removed meanwhile
	}
	return p.restoreLocked(r, e)
}

// restoreLocked has r take a stored entry, and the trust store with it.
func (p *Poller) restoreLocked(r *relationship, e *LKGEntry) error {
	took, err := r.restore(e, p.cfg.Now())
	if !took {
		return err
	}
	td := r.ep.TrustDomain
	p.cfg.Sink.Set(SourceName(td), e.Bundle)
	p.cfg.Logger.Info("restored last-known-good bundle", logattr.TrustDomain, td.Name(),
		logattr.Sequence, seqString(e.Bundle), "fetched_at", e.FetchedAt)
	return nil
}

// holdBootstrapLocked has r hold its bootstrap bundle when it holds
// nothing, and the trust store with it.
func (p *Poller) holdBootstrapLocked(r *relationship) {
	held, dropped := r.holdBootstrap()
	if len(dropped) > 0 {
		p.cfg.Logger.Warn("bootstrap bundle carries authorities its trust domain revoked; trusting it without them",
			logattr.TrustDomain, r.ep.TrustDomain.Name(), "revoked", dropped)
	}
	switch {
	case held:
		p.cfg.Sink.Set(SourceName(r.ep.TrustDomain), r.held)
	case len(dropped) > 0:
		// NewPoller put the whole bootstrap bundle in the store for the
		// first fetch; none of it may stay.
		p.cfg.Sink.Remove(SourceName(r.ep.TrustDomain), r.ep.TrustDomain)
	}
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
		r := p.rels[td]
		r.entry = 0  // an entry of an earlier Run's cron
		r.next = now // first poll at once
		p.scheduleLocked(r)
	}
	p.mu.Unlock()
	c.Start()
	<-ctx.Done()
	<-c.Stop().Done()
	p.mu.Lock()
	if p.cron == c {
		p.cron = nil
		for _, r := range p.rels {
			r.entry = 0
		}
	}
	p.mu.Unlock()
	return nil
}

// saveLKG persists r's bundle, unless td stopped being followed by r
// since the poll (then Forget may have deleted what this would write).
func (p *Poller) saveLKG(td spiffeid.TrustDomain, r *relationship, e *LKGEntry, log *slog.Logger) {
	mu := p.saveMu(td)
	mu.Lock()
	defer mu.Unlock()
	p.mu.Lock()
	current := p.rels[td] == r
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
	_, followed := p.rels[td]
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

// ErrCannotForget: the last-known-good store cannot delete a stored bundle.
var ErrCannotForget = errors.New("the last-known-good store cannot delete a stored bundle")

// scheduleLocked (re)adds r's cron entry for r.next. The entry parks
// itself after firing; the job re-adds it with the time the poll's
// outcome decides.
func (p *Poller) scheduleLocked(r *relationship) {
	if p.cron == nil {
		return
	}
	if r.entry != 0 {
		p.cron.Remove(r.entry)
	}
	r.entry = p.cron.Schedule(loop.Once(r.next), cron.FuncJob(func() { _ = p.poll(p.runCtx, r.ep.TrustDomain) }))
}

// Refresh polls td now (trustbridge federation refresh). The poll does
// not end when the caller goes away: an aborted request must not count
// as the endpoint's failure and push its next poll back.
func (p *Poller) Refresh(ctx context.Context, td spiffeid.TrustDomain) error {
	p.mu.Lock()
	_, ok := p.rels[td]
	p.mu.Unlock()
	if !ok {
		return fmt.Errorf("federation: trust domain %q is not federated", td.Name())
	}
	return p.poll(context.WithoutCancel(ctx), td)
}

// poll fetches one endpoint once and applies the result.
func (p *Poller) poll(ctx context.Context, td spiffeid.TrustDomain) error {
	r, ep, etag, err := p.startPoll(td)
	if err != nil {
		return err
	}
	start := p.cfg.Now()
	res, err := p.fetcher.Fetch(ctx, ep, etag)
	log := p.cfg.Logger.With(logattr.TrustDomain, td.Name(), logattr.EndpointURL, ep.URL.String())
	out := p.endPoll(r, start, res, err, log)
	// Persist after releasing p.mu: the store may be an API server that
	// does not answer, and Status, other polls' TLS handshakes and
	// followers' reloads must not wait for it. r.polling stays set until
	// then, so saves of one trust domain stay in order.
	if out.save != nil && p.cfg.LKG != nil {
		p.saveLKG(td, r, out.save, log)
	}
	if out.event != nil && p.cfg.OnEvent != nil {
		p.cfg.OnEvent(*out.event)
	}
	p.mu.Lock()
	r.polling = false
	p.mu.Unlock()
	return out.err
}

// startPoll marks td's relationship as polled, and returns it with what
// the fetch needs, unless td is not followed or a poll of it runs.
func (p *Poller) startPoll(td spiffeid.TrustDomain) (r *relationship, ep Endpoint, etag string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r = p.rels[td]
	switch {
	case r == nil:
		// Removed by SetEndpoints after this poll was scheduled or asked for.
		return nil, Endpoint{}, "", fmt.Errorf("federation: trust domain %q is not federated", td.Name())
	case r.polling:
		// One poll per trust domain at a time; say so rather than claim a
		// refresh that did not happen.
		return nil, Endpoint{}, "", fmt.Errorf("federation: %w for %s; its result will show in the status", ErrPollInProgress, td.Name())
	}
	r.polling = true
	return r, r.ep, r.etag, nil
}

// endPoll has r take the outcome of its poll, carries out what r decides
// that must happen under p.mu (the trust store, the metric, the logs, the
// next poll), and returns the rest (the store write and the event).
func (p *Poller) endPoll(r *relationship, start time.Time, res *FetchResult, fetchErr error, log *slog.Logger) pollResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	td := r.ep.TrustDomain
	if p.rels[td] != r {
		// The endpoint was removed or reconfigured while this poll ran:
		// what it fetched answers a question nobody asks any more.
		log.Info("poll result discarded: the endpoint was reconfigured or removed meanwhile")
		return pollResult{err: fmt.Errorf("federation: %s was reconfigured or removed during the poll", td.Name())}
	}
	out := r.polled(start, p.cfg.Now(), res, fetchErr, p.cfg.Rand())
	p.reportLocked(r, out, log)
	p.scheduleLocked(r)
	return out
}

// reportLocked applies a poll's outcome to the trust store and tells the
// metrics and the logs.
func (p *Poller) reportLocked(r *relationship, out pollResult, log *slog.Logger) {
	td := r.ep.TrustDomain
	switch {
	case out.event != nil && out.event.Kind == EventBundleRejected:
		log.Error("fetched bundle refused; keeping the last good bundle", logattr.Error, out.err,
			"old_sequence", seqString(out.old), "new_sequence", seqString(out.fetched))
	case out.fetched != nil:
		for _, w := range out.warnings {
			log.Warn("bundle element ignored", logattr.Warning, w.String())
		}
	}
	if out.accepted {
		p.cfg.Sink.Set(SourceName(td), r.held)
		log.Info("bundle accepted", "old_sequence", seqString(out.old), "new_sequence", seqString(r.held),
			"added", fingerprintStrings(out.event.Added), "removed", fingerprintStrings(out.event.Removed))
	}
	p.metrics.fetches.WithLabelValues(td.Name(), out.kind).Inc()
	if out.err != nil {
		log.Warn("bundle poll failed; keeping the last good bundle", logattr.Error, out.err,
			"consecutive_failures", r.failures, "held_sequence", seqString(r.held))
	}
	if out.from != out.to {
		logTransition(log, r, out.from, out.to)
	}
}

// logTransition logs a change of r's state, once per change: a recovery
// is as much news to an operator as a failure, and a peer failing for
// days must not repeat it on every poll.
func logTransition(log *slog.Logger, r *relationship, from, to State) {
	attrs := []any{"from", string(from), "to", string(to), "reason", r.transitionReason(to)}
	switch to {
	case StateOK:
		log.Info("federation state changed", attrs...)
	case StateStale:
		log.Error("federation state changed", append(attrs, "last_success", optTime(r.lastSuccess))...)
	case StateFailing:
		if r.held == nil {
			// Never answered: nothing of the trust domain is trusted.
			log.Error("federation state changed", attrs...)
			return
		}
		log.Warn("federation state changed", attrs...)
	default:
		log.Warn("federation state changed", attrs...)
	}
}

// Status reports every trust domain, sorted by name.
func (p *Poller) Status() []Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.cfg.Now()
	out := make([]Status, 0, len(p.order))
	for _, td := range p.order {
		out = append(out, p.rels[td].status(now))
	}
	return out
}

func fingerprintStrings(fs []Fingerprint) []string {
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.String()
	}
	return out
}
