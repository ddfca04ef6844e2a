package ca

import (
	"crypto/x509"
	"fmt"
	"time"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/bundledoc"
)

// AuthorityChange is an operator's change to one of the CA's signing
// authorities (`trustbridge ca authority`), SPIRE's incident-response
// path: prepare a successor, activate it, taint the authority suspected
// of compromise (clients re-issue what it signed) and, once nothing
// depends on it, revoke it (it leaves the bundle; the bundle names it as
// revoked so that peers refuse it if it ever comes back).
type AuthorityChange struct {
	// Action is "prepare", "activate", "taint" or "revoke".
	Action string
	// JWT selects the JWT-SVID signing keys; false the X.509 authorities:
	// roots, or in upstream mode the intermediates the upstream signed.
	JWT bool
	// ID names the authority: a root's ID (hex serial) or a JWT key's kid.
	// prepare takes none; activate without one takes the prepared one.
	ID string
	// Now, with activate, skips what is left of the publication lead:
	// peers that have not fetched the bundle since the authority was
	// published refuse what it signs until they do.
	Now bool
}

// Actions of AuthorityChange.
const (
	actionPrepare  = "prepare"
	actionActivate = "activate"
	actionTaint    = "taint"
	actionRevoke   = "revoke"
)

// lifecycle is what changeAuthority needs of one authority, X.509 or
// JWT, to check and apply a change alike.
type lifecycle struct {
	kind      string // "root", "intermediate" or "JWT key"
	id        string
	state     *castate.RootState
	taintedAt *time.Time
	times     rootTimes
}

// changeAuthority is Authority.ChangeAuthority.
func (m *manager) changeAuthority(c AuthorityChange) (string, error) {
	switch c.Action {
	case actionPrepare, actionActivate, actionTaint, actionRevoke:
	default:
		return "", fmt.Errorf("ca: %w: unknown action %q (prepare, activate, taint or revoke)", castate.ErrAuthorityState, c.Action)
	}
	if !m.leading() {
		return "", fmt.Errorf("ca: %w: only the leader changes authorities; send the change to the leader", castate.ErrNotLeader)
	}
	if m.cfg.Plugin != nil {
		what := "roots come from the plug-in CA directory (--ca-dir): rotate, and stop trusting, them there"
		if c.JWT {
			what = "JWT keys of a plug-in CA rotate with `trustbridge ca rotate --jwt`; taint and revoke need a self-signed or upstream CA"
		}
		return "", fmt.Errorf("ca: %w: %s", castate.ErrAuthorityState, what)
	}
	if c.Action == actionPrepare && !c.JWT && m.cfg.Upstream != nil {
		return m.prepareIntermediate()
	}
	var id string
	err := m.withStateLocked(func() error {
		if c.Action == actionPrepare {
			if id = m.preparedLocked(c.JWT); id != "" {
				return nil // one waits already: nothing to write
			}
		}
		var err error
		if id, err = m.changeLocked(c, m.cfg.Clock.Now()); err != nil {
			return err
		}
		return m.commitLocked()
	})
	if err != nil {
		return "", err
	}
	return id, nil
}

// changeLocked applies c to the state in memory.
func (m *manager) changeLocked(c AuthorityChange, now time.Time) (string, error) {
	if c.Action == actionPrepare {
		return m.prepareNowLocked(c.JWT, now)
	}
	items := m.lifecyclesLocked(c.JWT)
	l, err := findLifecycle(items, c)
	if err != nil {
		return "", err
	}
	switch c.Action {
	case actionActivate:
		err = m.activateLocked(c, l, now)
	case actionTaint:
		err = m.taintLocked(l, now)
	case actionRevoke:
		err = m.revokeLocked(c.JWT, l, now)
	}
	return l.id, err
}

// lifecyclesLocked are the X.509 authorities, or the JWT keys.
func (m *manager) lifecyclesLocked(jwt bool) []lifecycle {
	if jwt {
		out := make([]lifecycle, len(m.jwtKeys))
		for i, k := range m.jwtKeys {
			out[i] = lifecycle{kind: "JWT key", id: k.KID, state: &k.State, taintedAt: &k.TaintedAt, times: jwtKeyTimes(k)}
		}
		return out
	}
	out := make([]lifecycle, len(m.roots))
	times := m.timesLocked()
	for i, r := range m.roots {
		kind := "root"
		if r.Upstream != nil {
			kind = "intermediate"
		}
		out[i] = lifecycle{kind: kind, id: r.ID, state: &r.State, taintedAt: &r.TaintedAt, times: times[i]}
	}
	return out
}

// findLifecycle is the authority c names; activate without an ID takes
// the prepared one.
func findLifecycle(items []lifecycle, c AuthorityChange) (lifecycle, error) {
	what := "X.509 authority"
	if c.JWT {
		what = "JWT key"
	}
	if c.ID == "" && c.Action == actionActivate {
		for _, l := range items {
			if *l.state == castate.StatePrepared {
				return l, nil
			}
		}
		return lifecycle{}, fmt.Errorf("ca: %w: no %s is prepared; prepare one first", castate.ErrAuthorityNotFound, what)
	}
	if c.ID == "" {
		return lifecycle{}, fmt.Errorf("ca: %w: name the %s to %s (see `trustbridge ca authority list`)", castate.ErrAuthorityNotFound, what, c.Action)
	}
	for _, l := range items {
		if l.id == c.ID {
			return l, nil
		}
	}
	return lifecycle{}, fmt.Errorf("ca: %w: %s %q is not in use here (see `trustbridge ca authority list`)", castate.ErrAuthorityNotFound, what, c.ID)
}

// preparedLocked is the ID of the prepared X.509 authority, or JWT key;
// "" when none waits.
func (m *manager) preparedLocked(jwt bool) string {
	for _, l := range m.lifecyclesLocked(jwt) {
		if *l.state == castate.StatePrepared {
			return l.id
		}
	}
	return ""
}

// prepareNowLocked publishes a successor now: it signs after the usual
// publication lead, or at once with activate --now.
func (m *manager) prepareNowLocked(jwt bool, now time.Time) (string, error) {
	if jwt {
		if err := m.newJWTKeyLocked(now, castate.StatePrepared, "forced"); err != nil {
			return "", err
		}
		return m.jwtKeys[len(m.jwtKeys)-1].KID, nil
	}
	if err := m.newRootLocked(now, castate.StatePrepared, "forced"); err != nil {
		return "", err
	}
	return m.roots[len(m.roots)-1].ID, nil
}

// activateLocked makes the prepared authority l the one that signs, and
// retires the active one.
func (m *manager) activateLocked(c AuthorityChange, l lifecycle, now time.Time) error {
	if *l.state != castate.StatePrepared {
		return fmt.Errorf("ca: %w: %s %s is %s; only a prepared one can be activated", castate.ErrAuthorityState, l.kind, l.id, *l.state)
	}
	tl := m.timelineLocked()
	if c.JWT {
		tl = m.jwtTimelineLocked()
	}
	at := tl.activateAt(l.times)
	switch {
	case at.IsZero():
		return fmt.Errorf("ca: %w: %s %s has not been published by a running server yet; start the server (it publishes it at once) and activate it then",
			castate.ErrAuthorityState, l.kind, l.id)
	case now.Before(at) && !c.Now:
		return fmt.Errorf("ca: %w: %s %s signs from %s, %d refresh hints after it was published, so that peers hold it first; it activates on its own then, or activate it with --now (peers that have not fetched the bundle since %s refuse what it signs until they do)",
			castate.ErrAuthorityState, l.kind, l.id, stamp(at), PublishLead, stamp(l.times.PublishedAt))
	}
	if c.JWT {
		return m.applyJWTLocked(now, stepActivate, m.jwtIndexLocked(l.id))
	}
	m.retireActiveLocked(now)
	r := m.roots[m.rootIndexLocked(l.id)]
	r.State, r.ActivatedAt = castate.StateActive, now
	m.event(now, "activated (operator)", r.ID)
	return nil
}

// taintLocked marks l tainted: clients re-issue what it signed. The
// active authority cannot be: every new certificate would be refused.
func (m *manager) taintLocked(l lifecycle, now time.Time) error {
	switch {
	case !l.taintedAt.IsZero():
		return fmt.Errorf("ca: %w: %s %s has been tainted since %s; revoke it once its workloads were re-issued",
			castate.ErrAuthorityState, l.kind, l.id, stamp(*l.taintedAt))
	case *l.state == castate.StateActive:
		return fmt.Errorf("ca: %w: %s %s is active: it signs every new certificate, and tainting it would leave nothing to re-issue from; prepare and activate a successor first (`ca authority prepare`, then `ca authority activate --now`), then taint %s",
			castate.ErrAuthorityState, l.kind, l.id, l.id)
	case *l.state == castate.StatePrepared:
		return fmt.Errorf("ca: %w: %s %s is prepared and has signed nothing: revoke it instead",
			castate.ErrAuthorityState, l.kind, l.id)
	}
	*l.taintedAt = now
	m.authorityEvent(now, l, "tainted")
	return nil
}

// revokeLocked removes l from the state and the bundle, and records it
// as revoked until it expires. Only a tainted authority that no longer
// signs, or a prepared one that never did, can be revoked.
func (m *manager) revokeLocked(jwt bool, l lifecycle, now time.Time) error {
	switch {
	case *l.state == castate.StateActive:
		return fmt.Errorf("ca: %w: %s %s is active: revoking it would leave the trust domain unable to sign; activate a successor, taint %s, then revoke it",
			castate.ErrAuthorityState, l.kind, l.id, l.id)
	case *l.state != castate.StatePrepared && l.taintedAt.IsZero():
		return fmt.Errorf("ca: %w: %s %s is not tainted: taint it first (`ca authority taint`), so that clients re-issue what it signed before it stops being trusted",
			castate.ErrAuthorityState, l.kind, l.id)
	case len(m.journal.Revoked) >= bundledoc.MaxRevocations:
		// The bundle names each until it expires; peers read that many.
		return fmt.Errorf("ca: %w: %d revoked authorities have not expired yet, as many as the bundle can name; this trust domain needs starting over, not another revocation",
			castate.ErrAuthorityState, len(m.journal.Revoked))
	}
	*l.state = castate.StateRevoked
	rec := castate.RevokedRecord{RevokedAt: now}
	if jwt {
		i := m.jwtIndexLocked(l.id)
		k := m.jwtKeys[i]
		pub, err := x509.MarshalPKIXPublicKey(k.Key.Public())
		if err != nil {
			return fmt.Errorf("ca: JWT key %s: %w", k.KID, err)
		}
		kr := k.JWTKeyRecord
		rec.JWTKey, rec.PublicKey, rec.NotAfter = &kr, pub, k.NotAfter
		m.jwtKeys = append(m.jwtKeys[:i:i], m.jwtKeys[i+1:]...)
	} else {
		i := m.rootIndexLocked(l.id)
		r := m.roots[i]
		rr := r.RootRecord
		rec.Root, rec.DER, rec.NotAfter = &rr, r.Cert.Raw, r.Cert.NotAfter
		m.roots = append(m.roots[:i:i], m.roots[i+1:]...)
	}
	m.journal.Revoked = append(m.journal.Revoked, rec)
	// The document changes even when no published key does (an
	// upstream intermediate was never in it): it now names the revoked
	// authority.
	m.journal.Sequence = nextSequence(m.journal.Sequence, now)
	m.authorityEvent(now, l, "revoked")
	return nil
}

// pruneRevokedLocked forgets revoked authorities that have expired:
// nothing they signed is valid any more. It reports whether it did.
func (m *manager) pruneRevokedLocked(now time.Time) bool {
	kept := m.journal.Revoked[:0:0]
	for _, rev := range m.journal.Revoked {
		if now.Before(rev.NotAfter) {
			kept = append(kept, rev)
		}
	}
	if len(kept) == len(m.journal.Revoked) {
		return false
	}
	m.journal.Revoked = kept
	m.journal.Sequence = nextSequence(m.journal.Sequence, now)
	return true
}

// prepareIntermediate is prepare in upstream mode: the upstream signs a
// new intermediate now. It signs at once when the upstream's roots are
// already published (they usually are), and the one it replaces retires.
func (m *manager) prepareIntermediate() (string, error) {
	m.mu.RLock()
	waiting := m.preparedLocked(false)
	m.mu.RUnlock()
	if waiting != "" {
		// One waits for its new upstream roots to be published: it is the
		// successor, as prepare's answer elsewhere.
		return waiting, nil
	}
	key, ref, chain, err := m.requestIntermediate()
	if err != nil {
		m.upstreamFailed(m.cfg.Clock.Now(), err)
		return "", err
	}
	m.upstreamOK(m.cfg.Clock.Now())
	id := chain.Chain[0].SerialNumber.Text(16)
	err = m.withStateLocked(func() error {
		if err := m.installIntermediateLocked(m.cfg.Clock.Now(), key, ref, chain); err != nil {
			return err
		}
		return m.commitLocked()
	})
	if err != nil {
		return "", err
	}
	return id, nil
}

func (m *manager) rootIndexLocked(id string) int {
	for i, r := range m.roots {
		if r.ID == id {
			return i
		}
	}
	return -1
}

func (m *manager) jwtIndexLocked(kid string) int {
	for i, k := range m.jwtKeys {
		if k.KID == kid {
			return i
		}
	}
	return -1
}

// authorityEvent records an operator's taint or revocation in the
// journal's history, the metrics and the log.
func (m *manager) authorityEvent(now time.Time, l lifecycle, what string) {
	if l.kind == "JWT key" {
		m.jwtEvent(now, what, l.id)
		return
	}
	m.event(now, what, l.id)
}

// taintedIssuer says whether cert was signed by a tainted root or
// intermediate of this CA.
func (m *manager) taintedIssuer(cert *x509.Certificate) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.taintedIssuerLocked(cert)
}

// taintedIssuerLocked says whether cert was signed by a tainted root or
// intermediate of this CA.
func (m *manager) taintedIssuerLocked(cert *x509.Certificate) bool {
	for _, r := range m.roots {
		if !r.TaintedAt.IsZero() && len(r.Cert.SubjectKeyId) > 0 && string(r.Cert.SubjectKeyId) == string(cert.AuthorityKeyId) {
			return true
		}
	}
	return false
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }
