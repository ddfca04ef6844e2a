package sds

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc/codes"
	"k8s.io/utils/clock"

	"github.com/trustbridge/trustbridge/internal/authn"
	"github.com/trustbridge/trustbridge/internal/logattr"
	retryloop "github.com/trustbridge/trustbridge/internal/loop"
	"github.com/trustbridge/trustbridge/internal/trustpolicy"
)

// session is what one stream or Fetch call knows about its caller: the
// proven identity, the request it was proven with (to re-authenticate at a
// refresh), the Trust and Credential it last sent from.
type session struct {
	s     *Server
	kind  string
	ident authn.Identity
	areq  authn.Request
	plain bool // ALL (and ROOTCA as ALL) as a plain trusted_ca
	entry *certEntry

	trust *Trust
	// spent is a Trust whose Changed fired without the source returning a
	// newer one: not waited on again, so a faulty source cannot make the
	// stream spin.
	spent *Trust
	cred  *Credential // nil until a tls_certificate is asked for
	// spentCred is a Credential whose Changed fired without the source
	// returning a newer one; likewise not waited on again.
	spentCred *Credential
	// decision is what the caller may trust, decided at open and again
	// when decisionCh fires or the caller re-authenticates; decisionCh is
	// nil without a policy, or once spent (Decide handed back, a second
	// time, a channel that had already fired: spentDecisionCh).
	decision        trustpolicy.Decision
	decisionCh      <-chan struct{}
	spentDecisionCh <-chan struct{}
	// deniedSent remembers which denials were counted, by resource name
	// and decision key, so that a push does not count one again.
	deniedSent map[string]string
	// timer fires when the caller must be authenticated again: at
	// cred.RefreshAt, and at the latest ReauthInterval after the last
	// authentication, or sooner to retry one that found the backend
	// unavailable; nil for Fetch.
	timer clock.Timer
	// unavailableSince is when re-authentication first failed with
	// authn.ErrUnavailable in the current run of such failures; zero while
	// the last one succeeded. unavailable counts that run.
	unavailableSince time.Time
	unavailable      int
}

// newSession starts a session for an authenticated caller. Streams pass a
// cert cache entry so that their encodings are shared; Fetch passes nil.
func (s *Server) newSession(kind string, ident authn.Identity, r authn.Request, node *corev3.Node, entry *certEntry) *session {
	ss := &session{s: s, kind: kind, ident: ident, areq: r, plain: disablesSPIFFEValidation(node), entry: entry}
	ss.loadTrust()
	ss.decide()
	if kind != typeFetch {
		ss.armTimer()
	}
	return ss
}

func (ss *session) stop() {
	ss.stopTimer()
	ss.s.validations.release(ss.decision.Key())
	ss.decision, ss.decisionCh = trustpolicy.Decision{}, nil
}

func (ss *session) stopTimer() {
	if ss.timer != nil {
		ss.timer.Stop()
	}
}

func (ss *session) log() *slog.Logger {
	return ss.s.cfg.Logger.With("type", ss.kind, logattr.SPIFFEID, ss.ident.ID.String(), logattr.Address, ss.areq.Peer)
}

func (ss *session) loadTrust() {
	ss.trust = ss.s.cfg.Trust.Trust()
	if ss.trust == nil {
		ss.trust = ss.s.empty
	}
}

// trustFired is called when the current Trust's Changed is closed.
func (ss *session) trustFired() {
	old := ss.trust
	ss.loadTrust()
	if ss.trust == old {
		ss.spent = old
	}
}

// trustChanged and credChanged are nil (never ready) when there is nothing
// to wait for.
func (ss *session) trustChanged() <-chan struct{} {
	if ss.trust == ss.spent {
		return nil
	}
	return ss.trust.Changed
}

func (ss *session) credChanged() <-chan struct{} {
	if ss.cred == nil || ss.cred == ss.spentCred {
		return nil
	}
	return ss.cred.Changed
}

func (ss *session) policyChanged() <-chan struct{} {
	return ss.decisionCh
}

// decide asks the policy what the caller may trust and reports whether
// the effect changed. The cache keeps the encodings of the new decision
// before it may drop the old one's.
func (ss *session) decide() bool {
	if ss.s.cfg.Policy == nil {
		return false
	}
	d, ch := ss.s.cfg.Policy.Decide(ss.ident)
	if closedChan(ch) {
		// The policy changed while deciding (the stream's loop wakes at
		// once and decides again), or a faulty policy hands back a
		// channel that already fired: the second time the same closed
		// channel comes back it is not waited on, so the stream cannot
		// spin. An open channel, even the same one as before (nothing
		// changed, as at a re-authentication), is always waited on.
		if ch == ss.spentDecisionCh {
			ch = nil
		} else {
			ss.spentDecisionCh = ch
		}
	}
	old := ss.decision
	ss.decision, ss.decisionCh = d, ch
	if d.Key() == old.Key() {
		return false
	}
	ss.s.validations.acquire(d.Key())
	ss.s.validations.release(old.Key())
	ss.log().Debug("sds trust policy decided", "decision", d.Key(), "rules", len(d.Matched), "grants", len(d.Grants))
	return true
}

func (ss *session) refreshDue() <-chan time.Time {
	if ss.timer == nil {
		return nil
	}
	return ss.timer.C()
}

// checkSubscription refuses names the caller may not have: another
// identity's certificate, or any certificate when there is no credential
// source. It never asks the source. Unknown names are logged when the
// client subscribes (logUnknown), not at every push.
func (ss *session) checkSubscription(names []string, logUnknown bool) *refusal {
	for _, n := range names {
		p := ss.s.parse(n)
		switch p.kind {
		case kindCert:
			if !p.id.IsZero() && p.id != ss.ident.ID {
				return &refusal{codes.PermissionDenied, "foreign_identity",
					fmt.Sprintf("resource %q is not the certificate of the authenticated identity %s", n, ss.ident.ID), nil}
			}
			if ss.s.cfg.Credentials == nil {
				return &refusal{codes.PermissionDenied, "no_credentials", "this server hands out no certificates; ask for validation contexts only", nil}
			}
		case kindUnknown:
			if !logUnknown {
				continue
			}
			ss.log().Debug("unknown resource name ignored", "resource", n)
		}
	}
	return nil
}

// resources returns the encodings of those names that exist now, sorted
// by name. names must be sorted and passed checkSubscription.
func (ss *session) resources(ctx context.Context, names []string) ([]*encoded, error) {
	if ref := ss.checkSubscription(names, false); ref != nil {
		return nil, ref
	}
	// Always the newest Trust: a stream that has not seen Changed yet
	// must not make the shared cache encode an older one again.
	ss.loadTrust()
	if closedChan(ss.decisionCh) {
		ss.decide()
	}
	out := make([]*encoded, 0, len(names))
	for _, n := range names {
		p := ss.s.parse(n)
		var e *encoded
		var err error
		switch p.kind {
		case kindCert:
			if ss.cred == nil {
				if err := ss.loadCredential(ctx); err != nil {
					return nil, err
				}
			}
			e, err = ss.s.certs.get(ss.entry, ss.cred, n)
		case kindTrustDomain, kindAll:
			e, err = ss.s.validations.get(ss.trust, n, p, ss.plain, ss.decision)
		}
		if err != nil {
			return nil, &refusal{codes.Internal, "encoding", "internal error", err}
		}
		if e != nil {
			ss.noteDenial(e, p)
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b *encoded) int { return cmp.Compare(a.name, b.name) })
	return out, nil
}

// noteDenial counts and logs a denial the first time this session sends
// it under its current decision.
func (ss *session) noteDenial(e *encoded, p parsedName) {
	if !e.denied {
		return
	}
	if k, seen := ss.deniedSent[e.name]; seen && k == ss.decision.Key() {
		return
	}
	if ss.deniedSent == nil {
		ss.deniedSent = make(map[string]string)
	}
	ss.deniedSent[e.name] = ss.decision.Key()
	ss.s.metrics.policyDenials.WithLabelValues(p.td.Name()).Inc()
	ss.log().Debug("trust domain denied by the trust policy", logattr.TrustDomain, p.td.Name(), "resource", e.name,
		"decision", ss.decision.Key())
}

// loadCredential asks the source for the caller's credential and arms the
// refresh timer.
func (ss *session) loadCredential(ctx context.Context) error {
	var cred *Credential
	var err error
	if src, ok := ss.s.cfg.Credentials.(IdentityCredentialSource); ok {
		cred, err = src.CredentialFor(ctx, ss.ident)
	} else {
		cred, err = ss.s.cfg.Credentials.Credential(ctx, ss.ident.ID)
	}
	if err == nil {
		if cred == nil {
			err = errors.New("credential source returned no credential")
		} else if cerr := checkCredential(cred.Chain, cred.Key, ss.ident.ID); cerr != nil {
			// Defence in depth: a source bug must not hand one workload
			// another's key.
			err = fmt.Errorf("credential source returned an unusable credential: %w", cerr)
		}
	}
	if err != nil {
		if errors.Is(err, ErrNoCredential) {
			return &refusal{codes.Unavailable, "no_credential", "no certificate for this identity yet; retry later", err}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &refusal{codes.Unavailable, "credential_source", "certificate not available; retry later", err}
	}
	if cred == ss.cred && closedChan(cred.Changed) {
		ss.spentCred = cred
	}
	ss.cred = cred
	ss.armTimer()
	return nil
}

// armTimer sets the next re-authentication: ReauthInterval from now, or
// the credential's refresh point when that comes first.
func (ss *session) armTimer() {
	ss.stopTimer()
	d := ss.s.cfg.ReauthInterval
	if ss.cred != nil && !ss.cred.RefreshAt.IsZero() {
		d = min(d, max(ss.cred.RefreshAt.Sub(ss.s.cfg.Clock.Now()), minRefreshDelay))
	}
	ss.timer = ss.s.cfg.Clock.NewTimer(d)
}

func closedChan(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// refreshCredential re-authenticates the caller with the request that
// opened the stream, then asks the source again: a caller whose
// credentials were revoked gets no new certificate, and a stream of
// validation contexts only ends too.
//
// A re-authentication that cannot be decided (authn.ErrUnavailable: the
// API server is down or busy, or the authenticators are shedding load
// under a flood of bad credentials) is not a refusal: ending healthy
// streams then would turn an attack on the authenticators into an outage
// of every Envoy. The stream keeps its credential and retries with
// backoff, and ends only on a definitive refusal, or when the grace runs
// out (reauthGraceEnd).
func (ss *session) refreshCredential(ctx context.Context) error {
	ident, err := ss.s.cfg.Authenticator.Authenticate(ctx, ss.areq)
	if err == nil && ident.ID != ss.ident.ID {
		err = fmt.Errorf("re-authentication proved %q, not %s", ident.ID.String(), ss.ident.ID)
	}
	if err != nil && errors.Is(err, authn.ErrUnavailable) && ctx.Err() == nil {
		return ss.reauthUnavailable(ctx, err)
	}
	if err != nil {
		ss.s.metrics.authFails.Inc()
		return &refusal{codes.Unauthenticated, "reauthentication_failed", "credentials no longer valid; reconnect with fresh credentials", err}
	}
	// The same SPIFFE ID, but perhaps new service account labels or grant:
	// the policy decides on what was proved last.
	ss.ident = ident
	ss.decide()
	if ss.unavailable > 0 {
		ss.log().Info("sds re-authentication succeeded again", "failures", ss.unavailable)
		ss.unavailableSince, ss.unavailable = time.Time{}, 0
		// The credential kept meanwhile may have a newer one waiting.
		ss.spentCred = nil
	}
	if ss.cred == nil {
		ss.armTimer()
		return nil
	}
	return ss.loadCredential(ctx)
}

// reauthUnavailable keeps the stream after a re-authentication the
// backend could not decide, and schedules the next try, unless the grace
// is over.
func (ss *session) reauthUnavailable(ctx context.Context, err error) error {
	now := ss.s.cfg.Clock.Now()
	if ss.unavailable == 0 {
		ss.unavailableSince = now
	}
	ss.unavailable++
	end := reauthGraceEnd(ss.unavailableSince, ss.s.cfg.ReauthInterval, ss.cred)
	if !now.Before(end) {
		ss.s.metrics.authFails.Inc()
		return &refusal{codes.Unavailable, "authn_unavailable", "authentication backend unavailable; retry later", err}
	}
	ss.s.metrics.reauthRetries.Inc()
	delay := min(reauthRetryDelay(ss.unavailable), end.Sub(now))
	ss.log().Log(ctx, ss.s.refuseLog.Level(slog.LevelWarn), "sds re-authentication unavailable; stream kept with its current credential",
		"failures", ss.unavailable, "retry_in", delay.String(), "grace_until", end.UTC().Format(time.RFC3339), logattr.Error, err)
	// A newer credential may be waiting (Changed closed): it is not
	// handed out until the caller is authenticated again, and the closed
	// channel must not wake the stream meanwhile.
	if ss.cred != nil && closedChan(ss.cred.Changed) {
		ss.spentCred = ss.cred
	}
	ss.stopTimer()
	ss.timer = ss.s.cfg.Clock.NewTimer(delay)
	return nil
}

// reauthGraceEnd is how long a stream whose re-authentication keeps
// finding the backend unavailable is kept: while its certificate is
// valid, since that certificate is what the caller last proved it may
// hold, or one ReauthInterval after the first failure for a stream of
// validation contexts only, which holds none.
func reauthGraceEnd(since time.Time, interval time.Duration, cred *Credential) time.Time {
	if cred != nil && len(cred.Chain) > 0 && cred.Chain[0] != nil {
		return cred.Chain[0].NotAfter
	}
	return since.Add(interval)
}

// reauthRetry spaces re-authentication retries: from minRefreshDelay,
// doubling, at most a minute apart. No jitter: each stream retries on its
// own schedule, started by its own failure.
var reauthRetry = retryloop.Backoff{Base: minRefreshDelay, Max: time.Minute}

// reauthRetryDelay is the wait before retry number failures (1 for the
// first retry).
func reauthRetryDelay(failures int) time.Duration {
	return reauthRetry.Delay(failures, 0.5)
}

// loop serves a stream after its first request until it ends: each
// request goes to onRequest, and every change of what the stream sends
// (trust, policy, credential, a refresh due) is pushed with push. Updates
// are not queued: push sends the newest state.
func loop[R any](ctx context.Context, ss *session, reqs <-chan R, errc <-chan error, onRequest func(R) error, push func(context.Context) error) error {
	for {
		var err error
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-errc:
			return recvEnd(err)
		case req := <-reqs:
			if err = onRequest(req); err == nil {
				ss.s.handled()
			}
		case <-ss.trustChanged():
			ss.trustFired()
			err = push(ctx)
		case <-ss.policyChanged():
			// Every stream wakes; only those whose decision's effect
			// changed push.
			if ss.decide() {
				err = push(ctx)
			}
		case <-ss.credChanged():
			if err = ss.refreshCredential(ctx); err == nil {
				err = push(ctx)
			}
		case <-ss.refreshDue():
			if err = ss.refreshCredential(ctx); err == nil {
				err = push(ctx)
			}
		}
		if err != nil {
			return err
		}
	}
}

// firstRequest waits for a stream's first request, which carries the
// node; nil (with recvEnd's or the context's verdict) when none came.
func firstRequest[T any](ctx context.Context, reqs <-chan *T, errc <-chan error) (*T, error) {
	select {
	case r := <-reqs:
		return r, nil
	case err := <-errc:
		return nil, recvEnd(err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// receive reads requests in their own goroutine, so that the stream's loop
// can wait for requests and changes at once. It forwards one request at a
// time: a client that sends faster than the loop handles them is held back
// by gRPC flow control, not buffered here. The goroutine ends when recv
// fails, which gRPC guarantees once the handler has returned.
func receive[T any](ctx context.Context, recv func() (T, error)) (<-chan T, <-chan error) {
	reqs := make(chan T)
	errc := make(chan error, 1)
	go func() {
		for {
			r, err := recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case reqs <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	return reqs, errc
}
