package server

import (
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/trustbridge/trustbridge/ca"
	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/federation"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/server/audit"
)

// auditTrail turns trust changes into audit log entries: the CA's roots
// and JWT signing keys being prepared, activated, retired, tainted,
// revoked and removed,
// its checks and its upstream starting and ceasing to fail, federated bundles
// accepted and rejected, endpoints added, changed and removed. Only the
// leader writes (it is the one making the changes; followers only load
// them), but every replica follows the CA's roots, so a new leader
// reports changes from what it last saw, not from scratch.
type auditTrail struct {
	log    *audit.Log
	actor  string
	leader func() bool // nil: always
	logger *slog.Logger

	mu      sync.Mutex
	roots   map[string]rootSeen   // the CA's roots by ID, as last seen
	jwtKeys map[string]jwtKeySeen // the CA's JWT signing keys by kid, as last seen
	health  healthSeen            // the CA's health, as last recorded

	appended *prometheus.CounterVec
	failures prometheus.Counter
}

type rootSeen struct {
	state   castate.RootState
	sha256  string
	tainted bool
}

func newAuditTrail(l *audit.Log, actor string, leader func() bool, reg prometheus.Registerer, logger *slog.Logger) (*auditTrail, error) {
	t := &auditTrail{
		log: l, actor: actor, leader: leader, logger: logger,
		appended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "trustbridge_audit_entries_total",
			Help: "Entries appended to the audit log, by event.",
		}, []string{"event"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "trustbridge_audit_write_failures_total",
			Help: "Audit entries that could not be written (the change itself was applied; see the error log).",
		}),
	}
	for _, c := range []prometheus.Collector{t.appended, t.failures} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("audit metrics: %w", err)
		}
	}
	return t, nil
}

// record appends e as this replica, when it leads.
func (t *auditTrail) record(e audit.Entry) {
	if t == nil || t.log == nil || (t.leader != nil && !t.leader()) {
		return
	}
	e.Actor = t.actor
	if err := t.log.Append(e); err != nil {
		t.failures.Inc()
		t.logger.Error("audit entry not written; the trust change it records was applied",
			"event", e.Event, logattr.TrustDomain, e.TrustDomain, logattr.Error, err)
		return
	}
	t.appended.WithLabelValues(e.Event).Inc()
	// The head, logged elsewhere than the audit log itself, is what shows
	// that the log's newest entries were not cut off later.
	head, n := t.log.Head()
	t.logger.Info("audit entry appended", "event", e.Event, logattr.TrustDomain, e.TrustDomain, "audit_seq", n, "audit_head", head)
}

// baseline records, at start, what is trusted before any change: one
// entry per trust domain with its authorities, so every run of the log
// starts from a known state.
func (t *auditTrail) baseline(a *ca.Authority, fed *federationSetup) {
	t.observeCA(a, true)
	snap := fed.store.Snapshot()
	urls := map[string]string{}
	if fed.poller != nil {
		for _, st := range fed.poller.Status() {
			urls[st.TrustDomain] = st.EndpointURL
		}
	}
	for _, td := range snap.TrustDomains() {
		if td == a.TrustDomain() {
			continue
		}
		b, _ := snap.Bundle(td)
		t.record(audit.Entry{
			Event: "baseline", TrustDomain: td.Name(), SourceURL: urls[td.Name()],
			NewSequence: federation.SequenceOf(b), Added: fingerprints(federation.Fingerprints(b)),
			Reason: "trusted at start (" + fmt.Sprint(fed.store.Sources(td)) + ")",
		})
	}
}

// observeCA records how the CA's roots and JWT keys changed since last
// seen. At baseline, every root is recorded as it stands.
func (t *auditTrail) observeCA(a *ca.Authority, baseline bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	seq := a.Sequence()
	td := a.TrustDomain().Name()
	entries := t.rootEntriesLocked(a.Roots(), td, seq, baseline)
	entries = append(entries, t.jwtKeyEntriesLocked(a.JWTKeys(), td, seq, baseline)...)
	entries = append(entries, t.healthEntriesLocked(a, td)...)
	for _, e := range entries {
		t.record(e)
	}
}

// rootEntriesLocked are the entries for how the CA's roots changed since
// last seen: a state entered, a taint, a root gone. t.mu is held.
func (t *auditTrail) rootEntriesLocked(roots []ca.RootInfo, td string, seq uint64, baseline bool) []audit.Entry {
	now := map[string]rootSeen{}
	var entries []audit.Entry
	for _, r := range roots {
		seen := rootSeen{state: r.State, sha256: r.CertSHA256, tainted: !r.TaintedAt.IsZero()}
		now[r.ID] = seen
		old, ok := t.roots[r.ID]
		if !baseline && ok && old == seen {
			continue
		}
		entries = append(entries, rootEntries(r, td, seq, old, ok, baseline)...)
	}
	if !baseline {
		for _, id := range slices.Sorted(maps.Keys(t.roots)) {
			if _, ok := now[id]; !ok {
				entries = append(entries, audit.Entry{Event: "root_removed", TrustDomain: td,
					NewSequence: &seq, Removed: []string{"x509:" + t.roots[id].sha256}, Reason: "root " + id})
			}
		}
	}
	t.roots = now
	return entries
}

// rootEntries are the entries for root r, last seen as old (when known):
// as it stands at baseline; else the state it entered, and its taint.
func rootEntries(r ca.RootInfo, td string, seq uint64, old rootSeen, known, baseline bool) []audit.Entry {
	fp := []string{"x509:" + r.CertSHA256}
	e := audit.Entry{TrustDomain: td, NewSequence: &seq, Event: rootEvent(r.State), Reason: "root " + r.ID}
	var out []audit.Entry
	switch {
	case baseline:
		e.Event, e.Reason, e.Added = "baseline", fmt.Sprintf("root %s %s%s at start", r.ID, r.State, taintNote(r.TaintedAt)), fp
	case r.State == castate.StateRevoked && (!known || old.state != r.State):
		// It left the bundle.
		e.Removed = fp
	case !known:
		e.Added = fp
	case old.state != r.State:
		e.Reason = fmt.Sprintf("root %s %s -> %s", r.ID, old.state, r.State)
	default:
		e.Event = "" // only tainted
	}
	if e.Event != "" {
		out = append(out, e)
	}
	if !baseline && !r.TaintedAt.IsZero() && (!known || !old.tainted) {
		te := audit.Entry{Event: "root_tainted", TrustDomain: td, NewSequence: &seq,
			Reason: "root " + r.ID + taintNote(r.TaintedAt) + ": clients re-issue what it signed"}
		// The taint came first when both are seen at once.
		out = slices.Insert(out, 0, te)
	}
	if r.Upstream != nil {
		for i := range out {
			// An intermediate: say which upstream signed it.
			out[i].Reason += " (intermediate signed by upstream " + r.Upstream.Name + ")"
		}
	}
	return out
}

// taintNote says since when an authority is tainted; "" when it is not.
func taintNote(at time.Time) string {
	if at.IsZero() {
		return ""
	}
	return ", tainted since " + at.UTC().Format(time.RFC3339)
}

// rootEvent names the audit event of a root entering state.
func rootEvent(s castate.RootState) string {
	switch s {
	case castate.StatePrepared:
		return "root_prepared"
	case castate.StateActive:
		return "root_activated"
	case castate.StateRetired:
		return "root_retired"
	case castate.StateRevoked:
		return "root_revoked"
	default: // a plug-in CA's root, loaded from its directory
		return "root_loaded"
	}
}

// federationEvent records a poller event.
func (t *auditTrail) federationEvent(ev federation.Event) {
	e := audit.Entry{
		Event: string(ev.Kind), TrustDomain: ev.TrustDomain.Name(), SourceURL: ev.EndpointURL,
		OldSequence: ev.OldSequence, NewSequence: ev.NewSequence,
		Added: fingerprints(ev.Added), Removed: fingerprints(ev.Removed), Reason: ev.Reason,
	}
	if ev.Err != nil {
		e.Reason = ev.Reason + ": " + ev.Err.Error()
	}
	t.record(e)
}

func fingerprints(fs []federation.Fingerprint) []string {
	if len(fs) == 0 {
		return nil
	}
	out := make([]string, len(fs))
	for i, f := range fs {
		out[i] = f.String()
	}
	return out
}

// setupAudit opens --audit-log (default <data-dir>/audit.jsonl; "-" is
// standard output).
func setupAudit(o Config, e env, kube *kubeSetup, reg prometheus.Registerer, logger *slog.Logger) (*auditTrail, func(), error) {
	var (
		l   *audit.Log
		err error
	)
	rep := replicaOf(kube)
	actor := rep.actor
	logger = logger.With(logattr.Component, "audit")
	switch path := o.AuditLog; path {
	case "-":
		l = audit.New(e.out)
	default:
		if path == "" {
			// The data directory exists: the server made it private and
			// locked it before this.
			path = filepath.Join(o.DataDir, "audit.jsonl")
		}
		// Open moves a torn final line (a crash mid-write) into a file of
		// its own, with a warning and a log_recovered entry, leader or not:
		// it is a fact about this file, and leaving it would stop every
		// start. It also locks the file: one writer, wherever it lives.
		if l, err = audit.Open(path, audit.WithLogger(logger), audit.WithActor(actor)); err != nil {
			return nil, nil, fmt.Errorf("--audit-log: %w", err)
		}
	}
	t, err := newAuditTrail(l, actor, rep.leader, reg, logger)
	if err != nil {
		_ = l.Close()
		return nil, nil, err
	}
	if l.Recovered() != "" {
		t.appended.WithLabelValues("log_recovered").Inc()
	}
	return t, func() { _ = l.Close() }, nil
}

// OpenAuditTrail opens cfg's audit log as a start of the server does (a
// torn tail is set aside and recorded) and returns it, nil without an
// audit log, with the function that closes it.
func OpenAuditTrail(cfg Config, reg prometheus.Registerer, logger *slog.Logger) (*auditTrail, func(), error) {
	return setupAudit(cfg, env{out: cfg.Stdout}, nil, reg, logger)
}
