package ca

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"time"

	"github.com/spiffe/go-spiffe/v2/spiffeid"

	"github.com/trustbridge/trustbridge/ca/castate"
	"github.com/trustbridge/trustbridge/internal/logattr"
)

// timelineLocked is the configured timeline, with the maximum workload TTL
// raised to the largest ever recorded in the journal: leaves signed under
// an earlier, longer maximum may still be out there.
func (a *Authority) timelineLocked() timeline {
	tl := a.cfg.timeline()
	if rec := time.Duration(a.journal.MaxWorkloadTTLSeconds) * time.Second; rec > tl.MaxWorkloadTTL {
		tl.MaxWorkloadTTL = rec
	}
	return tl
}

// Rotate publishes a successor root now, unless one is already waiting.
// The successor signs only after the usual publication lead.
func (a *Authority) Rotate() error {
	if a.cfg.Plugin != nil {
		return errors.New("ca: roots are managed outside trustbridge (--ca-dir); rotate them there")
	}
	if a.cfg.Upstream != nil {
		return errors.New("ca: the signing intermediate comes from the upstream authority and renews on its own; there is no root to rotate here")
	}
	if !a.leading() {
		return fmt.Errorf("ca: %w: only the leader rotates roots", castate.ErrNotLeader)
	}
	return a.withStateLocked(func() error {
		for _, r := range a.roots {
			if r.State == castate.StatePrepared {
				a.cfg.Logger.Info("rotation requested but a prepared root is already waiting", logattr.RootID, r.ID)
				return nil
			}
		}
		if err := a.prepareLocked(a.cfg.Clock.Now(), "forced"); err != nil {
			return err
		}
		return a.commitLocked()
	})
}

// Reconcile applies every rotation step due now and persists the result.
// On a follower (Config.Leader says it does not lead) it only reloads the
// state and publishes what it found.
func (a *Authority) Reconcile() error {
	if !a.leading() {
		err := a.Reload()
		a.endOutageRenewedElsewhere()
		return err
	}
	if a.cfg.Upstream != nil {
		return a.reconcileUpstream()
	}
	return a.withStateLocked(func() error { return a.reconcileLocked(a.applyDueStepsLocked) })
}

// reconcileLocked applies the root steps due (steps), the JWT key steps
// due, and commits when anything changed.
func (a *Authority) reconcileLocked(steps func() (bool, error)) error {
	changed := a.startServedLeadsLocked()
	if a.bumpSequenceLocked() {
		changed = true
	}
	stepped, err := steps()
	if err != nil {
		return err
	}
	jwtChanged, err := a.reconcileJWTLocked()
	if err != nil {
		return err
	}
	if changed || stepped || jwtChanged || a.journal.Settings == nil || *a.journal.Settings != a.settings() {
		if err := a.commitLocked(); err != nil {
			return err
		}
	}
	a.floored = true
	return nil
}

// startServedLeadsLocked moves a prepared root's PublishedAt to when
// this process began serving it, when that is later, and reports whether
// any moved. A root prepared by `ca rotate` has no PublishedAt; one that
// waited while no server ran, or that this process began serving only
// later, starts its lead when this process began serving it (see
// served).
func (a *Authority) startServedLeadsLocked() bool {
	changed := false
	for _, r := range a.roots {
		if r.State != castate.StatePrepared {
			continue
		}
		if s, ok := a.served[r.ID]; ok && s.After(r.PublishedAt) {
			r.PublishedAt = s
			changed = true
		}
	}
	return changed
}

// bumpSequenceLocked moves the sequence on where the published state
// changes without a rotation step (a new refresh hint, the first write
// of this process), and reports whether it did.
func (a *Authority) bumpSequenceLocked() bool {
	changed := false
	if st := a.journal.Settings; st != nil && st.RefreshHintSeconds != int64(a.cfg.RefreshHint/time.Second) && len(a.roots) > 0 {
		// The hint is part of the published document.
		a.journal.Sequence = nextSequence(a.journal.Sequence, a.cfg.Clock.Now())
		changed = true
	}
	if !a.floored && len(a.roots) > 0 {
		// The first write of this process publishes a new sequence: the
		// state may be a restored copy whose counter is below what peers
		// hold (see sequence.go).
		prev := a.journal.Sequence
		a.journal.Sequence = nextSequence(prev, a.cfg.Clock.Now())
		a.cfg.Logger.Info("CA state loaded; publishing it with a new sequence, above anything published before this start",
			logattr.OldSequence, prev, logattr.Sequence, a.journal.Sequence)
		changed = true
	}
	return changed
}

// applyDueStepsLocked applies the rotation steps the timeline plans for
// now, one after another, and reports whether it applied any. Several
// can be due at once, after the server was down past more than one.
func (a *Authority) applyDueStepsLocked() (bool, error) {
	return a.applyDue(a.timelineLocked, a.timesLocked, a.applyLocked)
}

// applyDue applies, one after another, the steps the timeline tl plans
// for the lifecycle items times describes (roots or JWT keys), with
// apply, and reports whether it applied any.
func (a *Authority) applyDue(tl func() timeline, times func() []rootTimes, apply func(time.Time, step, int) error) (bool, error) {
	changed := false
	for range 10 { // a handful of steps at most; the bound guards against a plan bug
		now := a.cfg.Clock.Now()
		step, index, _ := tl().plan(now, times())
		if step == stepNone {
			break
		}
		if err := apply(now, step, index); err != nil {
			return changed, err
		}
		changed = true
	}
	return changed, nil
}

func (a *Authority) timesLocked() []rootTimes {
	out := make([]rootTimes, len(a.roots))
	for i, r := range a.roots {
		out[i] = rootTimes{
			State: r.State, NotBefore: r.Cert.NotBefore, NotAfter: r.Cert.NotAfter,
			PreparedAt: r.PreparedAt, MinActivateAt: r.MinActivateAt, PublishedAt: r.PublishedAt, RemoveAfter: r.RemoveAfter,
		}
	}
	return out
}

func (a *Authority) applyLocked(now time.Time, step step, index int) error {
	switch step {
	case stepBootstrap:
		return a.newRootLocked(now, castate.StateActive, "bootstrap")
	case stepPrepare:
		return a.prepareLocked(now, "scheduled")
	case stepActivate:
		for _, r := range a.roots {
			if r.State == castate.StateActive {
				r.State = castate.StateRetired
				r.RetiredAt = now
				r.RemoveAfter = a.timelineLocked().removeAfter(rootTimes{NotAfter: r.Cert.NotAfter}, now.Add(retireMargin))
				a.event(now, "retired", r.ID)
			}
		}
		p := a.roots[index]
		p.State = castate.StateActive
		p.ActivatedAt = now
		a.event(now, "activated", p.ID)
		return nil
	case stepRemove:
		r := a.roots[index]
		a.roots = append(a.roots[:index:index], a.roots[index+1:]...)
		a.journal.Sequence = nextSequence(a.journal.Sequence, now)
		a.event(now, "removed", r.ID)
		return nil
	}
	return fmt.Errorf("ca: unknown rotation step %v", step)
}

func (a *Authority) prepareLocked(now time.Time, why string) error {
	if err := a.newRootLocked(now, castate.StatePrepared, why); err != nil {
		return err
	}
	return nil
}

func (a *Authority) newRootLocked(now time.Time, state castate.RootState, why string) error {
	cert, key, ref, err := a.newRootKeyed(now)
	if err != nil {
		return fmt.Errorf("ca: create root: %w", err)
	}
	id := cert.SerialNumber.Text(16)
	r := &castate.Root{RootRecord: castate.RootRecord{ID: id, State: state, CertSHA256: fingerprint(cert), PreparedAt: now, PublishedAt: now, KeyRef: ref}, Cert: cert, Key: key}
	if state == castate.StatePrepared {
		r.MinActivateAt = now.Add(PublishLead * a.cfg.RefreshHint)
	} else {
		r.ActivatedAt = now
	}
	a.roots = append(a.roots, r)
	a.journal.Sequence = nextSequence(a.journal.Sequence, now)
	event := "prepared (" + why + ")"
	if state == castate.StateActive {
		event = "bootstrap"
	}
	a.event(now, event, id)
	return nil
}

func (a *Authority) event(now time.Time, what, id string) {
	a.journal.Events = append(a.journal.Events, castate.JournalNote{At: now, Event: what, RootID: id})
	a.metrics.rotations.WithLabelValues(firstWord(what)).Inc()
	a.cfg.Logger.Info("CA root "+what, logattr.RootID, id, logattr.Sequence, a.journal.Sequence)
}

func firstWord(s string) string {
	for i, c := range s {
		if c == ' ' {
			return s[:i]
		}
	}
	return s
}

// mintRootCert mints a self-signed root for td, with the key newKey makes
// for the root's serial (and that key's KeyRef). Its subject carries the
// serial number so that no two roots share a subject: Go's chain builder
// gives up after a fixed number of signature checks per candidate subject,
// which broke SPIRE deployments with many same-named roots.
// With intermediates, the root leaves room for one level of them.
func mintRootCert(td spiffeid.TrustDomain, now time.Time, ttl time.Duration, intermediates bool, newKey func(serial string) (crypto.Signer, string, error)) (*x509.Certificate, crypto.Signer, string, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, nil, "", err
	}
	serial.SetBit(serial, 127, 1) // fixed length keeps ids uniform
	key, ref, err := newKey(serial.Text(16))
	if err != nil {
		return nil, nil, "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			Organization: []string{td.Name()},
			CommonName:   "trustbridge root CA",
			SerialNumber: serial.Text(16),
		},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(ttl),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        !intermediates,
		MaxPathLen:            pathLen(intermediates),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		URIs:                  []*url.URL{td.ID().URL()},
		// Verifiers that honour name constraints refuse anything this root
		// signs for another trust domain.
		PermittedURIDomains: []string{td.Name()},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, "", err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, "", err
	}
	return cert, key, ref, nil
}

func pathLen(intermediates bool) int {
	if intermediates {
		return 1
	}
	return 0
}
