package ca

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/ca/upstream"
	"github.com/trustbridge/trustbridge/internal/logattr"
	"github.com/trustbridge/trustbridge/internal/loop"
)

// upstreamTimeout bounds one request to the upstream.
const upstreamTimeout = time.Minute

// Retry pacing after failed upstream requests: doubling from the base
// to the maximum, and at the maximum after a refusal, which retrying
// alone does not mend.
const (
	upstreamBackoffBase = 5 * time.Second
	upstreamBackoffMax  = 5 * time.Minute
)

// upstreamRetry is the shared backoff with those bounds. No jitter: one
// CA asks one upstream, and the tests step a fake clock by exact delays.
var upstreamRetry = loop.Backoff{Base: upstreamBackoffBase, Max: upstreamBackoffMax}

// errNoIntermediate marks an upstream failure that left the CA with no
// valid intermediate to sign with.
var errNoIntermediate = errors.New("no valid intermediate to sign with")

// upstreamStatus is the upstream's health as this process saw it.
type upstreamStatus struct {
	lastSuccess time.Time
	lastErr     error
	lastErrAt   time.Time
	failures    int       // consecutive
	since       time.Time // of the first of those failures
	nextAttempt time.Time
	// refused says the last failure was a refusal (upstream.IsRefused).
	refused bool
}

// succeeded records an intermediate obtained at: any outage is over, its
// last error kept for reference.
func (s *upstreamStatus) succeeded(at time.Time) {
	*s = upstreamStatus{lastSuccess: at, lastErr: s.lastErr, lastErrAt: s.lastErrAt}
}

// upstreamBackoff is how long to wait before asking the upstream again
// after failures consecutive failures: doubling from 5s, at most 5m; 5m
// at once when the last was a refusal, so that an upstream that said no
// is not asked every few seconds for an answer only a change of
// configuration can turn.
func upstreamBackoff(failures int, refused bool) time.Duration {
	if refused {
		return upstreamBackoffMax
	}
	return upstreamRetry.Delay(failures, 0.5)
}

// renewAt is when an intermediate is renewed: at half its life, as SPIRE
// does, which leaves the other half to retry an upstream that is down.
func renewAt(c *x509.Certificate) time.Time {
	return c.NotBefore.Add(c.NotAfter.Sub(c.NotBefore) / 2)
}

// newIntermediateKey creates the key of a new intermediate, in the key
// manager when there is one (then with its reference).
func (m *manager) newIntermediateKey() (crypto.Signer, string, error) {
	return m.newKey(m.cfg.KeyType, "trustbridge "+m.cfg.TrustDomain.Name()+" intermediate "+m.cfg.Clock.Now().UTC().Format("20060102T150405Z"))
}

// reconcileUpstream is Reconcile in upstream mode: activate and remove
// intermediates as due, then ask the upstream for a new one when the
// active one passed its renewal point (or there is none). The request
// runs outside the state lock; a failure keeps the last good intermediate
// signing and is an error only once there is none.
func (m *manager) reconcileUpstream() error {
	due := false
	err := m.withStateLocked(func() error {
		if len(m.roots) == 0 {
			due = true
			return nil
		}
		return m.reconcileLocked(func() (bool, error) {
			now := m.cfg.Clock.Now()
			changed := m.upstreamStepsLocked(now)
			due = m.renewalDueLocked(now)
			return changed, nil
		})
	})
	m.endOutageRenewedElsewhere()
	if err != nil || !due {
		return err
	}
	return m.renewIntermediate()
}

// endOutageRenewedElsewhere ends this process's record of an upstream
// outage once the state holds an intermediate obtained after it began:
// another writer (the new leader after a failover) renewed it, so the
// upstream answered. Without this a replica that lost the lead mid-outage
// would report the outage, and its growing length, for ever.
func (m *manager) endOutageRenewedElsewhere() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.up.failures == 0 {
		return
	}
	for _, r := range m.roots {
		if r.Upstream != nil && r.Upstream.ObtainedAt.After(m.up.since) {
			m.up.succeeded(r.Upstream.ObtainedAt)
			signal(m.subs)
			return
		}
	}
}

// renewIntermediate asks the upstream for an intermediate, unless the
// backoff after a failure still runs, and installs it.
func (m *manager) renewIntermediate() error {
	now := m.cfg.Clock.Now()
	m.mu.RLock()
	wait := now.Before(m.up.nextAttempt)
	m.mu.RUnlock()
	if wait {
		return m.upstreamReadyErr()
	}
	key, ref, chain, err := m.requestIntermediate()
	if err != nil {
		m.upstreamFailed(now, err)
		return m.upstreamReadyErr()
	}
	outage := m.upstreamOK(m.cfg.Clock.Now())
	err = m.withStateLocked(func() error {
		return m.reconcileLocked(func() (bool, error) {
			now := m.cfg.Clock.Now()
			changed := m.upstreamStepsLocked(now)
			if !m.renewalDueLocked(now) {
				return changed, nil // another writer renewed meanwhile
			}
			return true, m.installIntermediateLocked(now, key, ref, chain)
		})
	})
	if outage {
		// The outage ended: subscribers hear it once the intermediate it
		// brought is in place, so they see both at once.
		m.mu.Lock()
		signal(m.subs)
		m.mu.Unlock()
	}
	return err
}

// requestIntermediate makes a key and a CSR for spiffe://<td>, asks the
// upstream to sign it, and checks the answer.
func (m *manager) requestIntermediate() (crypto.Signer, string, *UpstreamChain, error) {
	name := upstreamName(m.cfg.Upstream)
	key, ref, err := m.newIntermediateKey()
	if err != nil {
		return nil, "", nil, fmt.Errorf("ca: intermediate key: %w", err)
	}
	td := m.cfg.TrustDomain
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{Organization: []string{td.Name()}, CommonName: "trustbridge intermediate CA"},
		URIs:    []*url.URL{td.ID().URL()},
	}, key)
	if err != nil {
		return nil, "", nil, fmt.Errorf("ca: intermediate request: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), upstreamTimeout)
	defer cancel()
	chain, err := m.cfg.Upstream.SignIntermediate(ctx, csr, m.cfg.UpstreamTTL)
	if err != nil {
		m.metrics.upstreamRequests.WithLabelValues(upstreamResult(err)).Inc()
		if !strings.HasPrefix(err.Error(), name) { // clients may name themselves
			err = fmt.Errorf("upstream %s: %w", name, err)
		}
		return nil, "", nil, fmt.Errorf("ca: %w", err)
	}
	if err := CheckUpstreamChain(m.cfg.Clock.Now(), td, key.Public(), name, chain); err != nil {
		m.metrics.upstreamRequests.WithLabelValues("refused").Inc()
		return nil, "", nil, upstream.Refused(err)
	}
	if err := m.checkNameConstraints(name, chain); err != nil {
		m.metrics.upstreamRequests.WithLabelValues("refused").Inc()
		return nil, "", nil, upstream.Refused(err)
	}
	m.metrics.upstreamRequests.WithLabelValues("ok").Inc()
	return key, ref, chain, nil
}

// upstreamResult is the metric label of a failed request.
func upstreamResult(err error) string {
	if upstream.IsRefused(err) {
		return "refused"
	}
	return "error"
}

// maxUpstreamErrorLen bounds the text of an upstream failure kept for
// /readyz, status, logs and the audit log: it may quote what the upstream
// said (a gRPC status message, a CSR condition's message), which is
// untrusted and unbounded.
const maxUpstreamErrorLen = 1024

// clippedError is an error whose text was cut to a bound; errors.Is and
// As still see the whole chain.
type clippedError struct {
	err error
	msg string
}

func (e *clippedError) Error() string { return e.msg }
func (e *clippedError) Unwrap() error { return e.err }

// clipError bounds err's text to n bytes of valid UTF-8 (whole
// characters; invalid bytes replaced), saying that it was cut.
func clipError(err error, n int) error {
	msg := err.Error()
	if len(msg) <= n && utf8.ValidString(msg) {
		return err
	}
	msg = strings.ToValidUTF8(msg, "\uFFFD")
	if len(msg) <= n {
		return &clippedError{err: err, msg: msg}
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return &clippedError{err: err, msg: fmt.Sprintf("%s… (%d more bytes)", msg[:cut], len(msg)-cut)}
}

// upstreamFailed records a failed request: backoff, and a warning when
// an outage starts or turns between unreachable and refused (later
// failures log at debug level).
func (m *manager) upstreamFailed(now time.Time, err error) {
	refused := upstream.IsRefused(err)
	err = clipError(err, maxUpstreamErrorLen)
	m.mu.Lock()
	m.up.failures++
	turned := m.up.failures == 1 || refused != m.up.refused
	m.up.lastErr, m.up.lastErrAt, m.up.refused = err, now, refused
	wait := upstreamBackoff(m.up.failures, refused)
	m.up.nextAttempt = now.Add(wait)
	if m.up.failures == 1 {
		m.up.since = now
	}
	if turned {
		signal(m.subs) // an outage starts, or changes nature
	}
	signing := m.activeLocked() != nil
	m.mu.Unlock()
	attrs := []any{logattr.Error, err, "refused", refused, "next_attempt_in", wait.String()}
	if turned {
		m.cfg.Logger.Warn(failedMessage(signing, refused), attrs...)
		return
	}
	m.cfg.Logger.Debug("upstream authority request failed again", attrs...)
}

// failedMessage is the warning of an upstream failure.
func failedMessage(signing, refused bool) string {
	msg := "upstream authority request failed"
	if refused {
		msg += ": refused, which asking again does not mend; fix what the error names (asked again every " + upstreamBackoffMax.String() + ")"
	}
	if signing {
		return msg + "; the current intermediate keeps signing while retrying with backoff"
	}
	return msg + "; the CA signs nothing and /readyz fails until the upstream signs an intermediate"
}

// upstreamOK records a successful request; it says whether that ended an
// outage.
func (m *manager) upstreamOK(now time.Time) bool {
	m.mu.Lock()
	outage := m.up.failures > 0
	m.up.succeeded(now)
	m.metrics.setUpstreamSuccess(now)
	m.mu.Unlock()
	if outage {
		m.cfg.Logger.Info("upstream authority answered again")
	}
	return outage
}

// warning is Authority.Warning.
func (m *manager) warning() error {
	if m.cfg.Upstream == nil {
		return nil
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.up.failures == 0 {
		return nil
	}
	until := "no valid intermediate"
	if act := m.activeLocked(); act != nil {
		until = "the current intermediate signs until " + act.Cert.NotAfter.UTC().Format(time.RFC3339)
	}
	return fmt.Errorf("upstream %s failing since %s (%d failed requests; %s): %w",
		upstreamName(m.cfg.Upstream), m.up.since.UTC().Format(time.RFC3339), m.up.failures, until, m.up.lastErr)
}

// upstreamWaitingLocked says why the CA waits for the upstream, for
// Ready: it has no valid intermediate and the upstream has failed since;
// nil otherwise (outside upstream mode, while an intermediate is valid,
// before the first request).
func (m *manager) upstreamWaitingLocked(now time.Time) error {
	if m.cfg.Upstream == nil || m.up.failures == 0 {
		return nil
	}
	act := m.activeLocked()
	if act != nil && now.Before(act.Cert.NotAfter) {
		return nil
	}
	what := "waiting for the upstream to sign our intermediate"
	if act != nil {
		what += " (the last one expired at " + stamp(act.Cert.NotAfter) + ")"
	}
	if m.up.refused {
		what = "the upstream refused to sign our intermediate, and will until what this names is fixed"
	}
	next := "next attempt now"
	if wait := m.up.nextAttempt.Sub(now); wait > 0 {
		next = "next attempt in " + wait.Round(time.Second).String()
	}
	return fmt.Errorf("upstream authority: %s: %w; %d failed requests since %s; %s",
		what, m.up.lastErr, m.up.failures, stamp(m.up.since), next)
}

// upstreamReadyErr is nil while the active intermediate is valid, else
// the last upstream error: then the CA cannot sign and Ready says why.
func (m *manager) upstreamReadyErr() error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if act := m.activeLocked(); act != nil && m.cfg.Clock.Now().Before(act.Cert.NotAfter) {
		return nil
	}
	return fmt.Errorf("ca: %w: %w", errNoIntermediate, m.up.lastErr)
}

func (m *manager) activeLocked() *castate.Root {
	for _, r := range m.roots {
		if r.State == castate.StateActive {
			return r
		}
	}
	return nil
}

// renewalDueLocked says whether to ask the upstream for an intermediate:
// there is no active one, or it passed its renewal point, and none waits
// for its roots to be published.
func (m *manager) renewalDueLocked(now time.Time) bool {
	act := m.activeLocked()
	for _, r := range m.roots {
		if r.State == castate.StatePrepared {
			return false
		}
	}
	return act == nil || !now.Before(renewAt(act.Cert))
}

// installIntermediateLocked adds a checked intermediate. It signs at once
// when every root it chains to is already published; otherwise it is
// prepared, its new roots published, and activates PublishLead refresh
// hints later while the current intermediate keeps signing.
func (m *manager) installIntermediateLocked(now time.Time, key crypto.Signer, ref string, chain *UpstreamChain) error {
	cert := chain.Chain[0]
	id := cert.SerialNumber.Text(16)
	for _, r := range m.roots {
		if r.ID == id {
			return upstreamErrorf(upstreamName(m.cfg.Upstream), "certificate serial %s repeats that of an intermediate in use", id)
		}
	}
	before := m.publishedKeyLocked()
	r := &castate.Root{
		RootRecord: castate.RootRecord{ID: id, CertSHA256: fingerprint(cert), PreparedAt: now, PublishedAt: now, KeyRef: ref,
			Upstream: upstreamRecord(upstreamName(m.cfg.Upstream), now, chain)},
		Cert: cert, Key: key, UpstreamChain: chain.Chain[1:], UpstreamRoots: chain.Roots,
	}
	act := m.activeLocked()
	if act != nil && m.newRootsLocked(chain.Roots) {
		r.State, r.MinActivateAt = castate.StatePrepared, now.Add(PublishLead*m.cfg.RefreshHint)
		m.roots = append(m.roots, r)
		m.bumpIfPublishedChangedLocked(now, before)
		m.event(now, "prepared (new upstream root)", id)
		return nil
	}
	m.retireActiveLocked(now)
	r.State, r.ActivatedAt = castate.StateActive, now
	m.roots = append(m.roots, r)
	m.bumpIfPublishedChangedLocked(now, before)
	if act == nil {
		m.event(now, "bootstrap", id)
	} else {
		m.event(now, "activated", id)
	}
	return nil
}

// upstreamStepsLocked removes retired intermediates whose leaves have all
// expired and activates a prepared one whose roots were published long
// enough, and reports whether it changed anything.
func (m *manager) upstreamStepsLocked(now time.Time) bool {
	changed := false
	before := m.publishedKeyLocked()
	kept := m.roots[:0]
	for _, r := range m.roots {
		if r.State == castate.StateRetired && !now.Before(r.RemoveAfter) {
			m.event(now, "removed", r.ID)
			changed = true
			continue
		}
		kept = append(kept, r)
	}
	m.roots = kept
	m.bumpIfPublishedChangedLocked(now, before)
	for _, r := range m.roots {
		if r.State != castate.StatePrepared {
			continue
		}
		at := m.timelineLocked().activateAt(rootTimes{PublishedAt: r.PublishedAt, MinActivateAt: r.MinActivateAt})
		if at.IsZero() || now.Before(at) {
			continue
		}
		m.retireActiveLocked(now)
		r.State, r.ActivatedAt = castate.StateActive, now
		m.event(now, "activated", r.ID)
		changed = true
	}
	return changed
}

func (m *manager) retireActiveLocked(now time.Time) {
	for _, r := range m.roots {
		if r.State == castate.StateActive {
			r.State, r.RetiredAt = castate.StateRetired, now
			r.RemoveAfter = m.timelineLocked().removeAfter(rootTimes{NotAfter: r.Cert.NotAfter}, now.Add(retireMargin))
			m.event(now, "retired", r.ID)
		}
	}
}

// newRootsLocked says whether roots holds one the bundle does not yet
// publish.
func (m *manager) newRootsLocked(roots []*x509.Certificate) bool {
	have := map[string]bool{}
	for _, r := range m.roots {
		for _, c := range r.Published() {
			have[fingerprint(c)] = true
		}
	}
	for _, c := range roots {
		if !have[fingerprint(c)] {
			return true
		}
	}
	return false
}

// publishedKeyLocked names the set of published X.509 authorities.
func (m *manager) publishedKeyLocked() string {
	set := map[string]bool{}
	for _, r := range m.roots {
		for _, c := range r.Published() {
			set[fingerprint(c)] = true
		}
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}

func (m *manager) bumpIfPublishedChangedLocked(now time.Time, before string) {
	if m.publishedKeyLocked() != before {
		m.journal.Sequence = nextSequence(m.journal.Sequence, now)
	}
}

// nextUpstreamLocked is when the upstream plan next has work: renewal of
// the active intermediate, activation of a prepared one, removal of a
// retired one, or the retry after a failure; zero when work is due.
func (m *manager) nextUpstreamLocked(now time.Time) time.Time {
	var next time.Time
	for _, r := range m.roots {
		switch r.State {
		case castate.StateActive:
			next = earliest(next, renewAt(r.Cert))
		case castate.StatePrepared:
			next = earliest(next, m.timelineLocked().activateAt(rootTimes{PublishedAt: r.PublishedAt, MinActivateAt: r.MinActivateAt}))
		case castate.StateRetired:
			next = earliest(next, r.RemoveAfter)
		}
	}
	if m.up.failures > 0 && m.renewalDueLocked(now) {
		return m.up.nextAttempt
	}
	if !next.After(now) || len(m.roots) == 0 {
		return time.Time{}
	}
	return next
}

// UpstreamStatus is the upstream's health, for status reports; zero
// outside upstream mode.
type UpstreamStatus struct {
	// Name names the upstream.
	Name string
	// LastSuccess is when the upstream last signed an intermediate: in
	// this process, or as recorded in the state.
	LastSuccess time.Time
	// LastError is the last failed request's error ("" after none), and
	// LastErrorAt when it failed; Failures counts those since the last
	// success, the first of which failed at FailingSince (zero when
	// Failures is).
	LastError    string
	LastErrorAt  time.Time
	Failures     int
	FailingSince time.Time
	// Refused says the last failure was a refusal, which retrying alone
	// does not mend: the upstream said no, or its answer failed our
	// checks. Such failures are retried at the longest backoff.
	Refused bool
	// NextAttempt is when the upstream is asked again after a failure
	// (zero when Failures is).
	NextAttempt time.Time
}

// upstreamHealth is Authority.Upstream.
func (m *manager) upstreamHealth() (st UpstreamStatus, ok bool) {
	if m.cfg.Upstream == nil {
		return st, false
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	st = UpstreamStatus{Name: upstreamName(m.cfg.Upstream), LastSuccess: m.up.lastSuccess, LastErrorAt: m.up.lastErrAt, Failures: m.up.failures, FailingSince: m.up.since,
		Refused: m.up.refused && m.up.failures > 0}
	if m.up.failures > 0 {
		st.NextAttempt = m.up.nextAttempt
	}
	if m.up.lastErr != nil {
		st.LastError = m.up.lastErr.Error()
	}
	for _, r := range m.roots {
		if r.Upstream != nil && r.Upstream.ObtainedAt.After(st.LastSuccess) {
			st.LastSuccess = r.Upstream.ObtainedAt
		}
	}
	return st, true
}

// checkMode refuses state written in another mode: a self-signed
// CA's roots under an upstream, or an upstream's intermediates without
// one. Either switch would drop what peers trust from the bundle at once.
func (m *manager) checkMode(roots []*castate.Root) error {
	for _, r := range roots {
		switch {
		case m.cfg.Upstream != nil && r.Upstream == nil:
			return fmt.Errorf("ca: %s holds self-signed roots; switching to an upstream authority would drop them from the bundle while certificates they signed are still in use; use a fresh --data-dir (or state Secret)", m.backend.Describe())
		case m.cfg.Upstream == nil && r.Upstream != nil:
			return fmt.Errorf("ca: %s holds intermediates signed by upstream %s; start with the same --upstream, or use a fresh --data-dir (or state Secret)", m.backend.Describe(), r.Upstream.Name)
		}
	}
	return nil
}
