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
func (m *manager) timelineLocked() timeline {
	tl := m.cfg.timeline()
	if rec := time.Duration(m.journal.MaxWorkloadTTLSeconds) * time.Second; rec > tl.MaxWorkloadTTL {
		tl.MaxWorkloadTTL = rec
	}
	return tl
}

// rotate is Authority.Rotate.
func (m *manager) rotate() error {
	if m.cfg.Plugin != nil {
		return errors.New("ca: roots are managed outside trustbridge (--ca-dir); rotate them there")
	}
	if m.cfg.Upstream != nil {
		return errors.New("ca: the signing intermediate comes from the upstream authority and renews on its own; there is no root to rotate here")
	}
	if !m.leading() {
		return fmt.Errorf("ca: %w: only the leader rotates roots", castate.ErrNotLeader)
	}
	return m.withStateLocked(func() error {
		for _, r := range m.roots {
			if r.State == castate.StatePrepared {
				m.cfg.Logger.Info("rotation requested but a prepared root is already waiting", logattr.RootID, r.ID)
				return nil
			}
		}
		if err := m.prepareLocked(m.cfg.Clock.Now(), "forced"); err != nil {
			return err
		}
		return m.commitLocked()
	})
}

// reconcile is Authority.Reconcile.
func (m *manager) reconcile() error {
	if !m.leading() {
		err := m.reload()
		m.endOutageRenewedElsewhere()
		return err
	}
	if m.cfg.Upstream != nil {
		return m.reconcileUpstream()
	}
	return m.withStateLocked(func() error { return m.reconcileLocked(m.applyDueStepsLocked) })
}

// reconcileLocked applies the root steps due (steps), the JWT key steps
// due, and commits when anything changed.
func (m *manager) reconcileLocked(steps func() (bool, error)) error {
	changed := m.startServedLeadsLocked()
	if m.bumpSequenceLocked() {
		changed = true
	}
	if m.pruneRevokedLocked(m.cfg.Clock.Now()) {
		changed = true
	}
	stepped, err := steps()
	if err != nil {
		return err
	}
	jwtChanged, err := m.reconcileJWTLocked()
	if err != nil {
		return err
	}
	if changed || stepped || jwtChanged || m.journal.Settings == nil || *m.journal.Settings != m.settings() {
		if err := m.commitLocked(); err != nil {
			return err
		}
	}
	m.floored = true
	return nil
}

// startServedLeadsLocked moves a prepared root's PublishedAt to when
// this process began serving it, when that is later, and reports whether
// any moved. A root prepared by `ca rotate` has no PublishedAt; one that
// waited while no server ran, or that this process began serving only
// later, starts its lead when this process began serving it (see
// served).
func (m *manager) startServedLeadsLocked() bool {
	changed := false
	for _, r := range m.roots {
		if r.State != castate.StatePrepared {
			continue
		}
		if s, ok := m.served[r.ID]; ok && s.After(r.PublishedAt) {
			r.PublishedAt = s
			changed = true
		}
	}
	return changed
}

// bumpSequenceLocked moves the sequence on where the published state
// changes without a rotation step (a new refresh hint, the first write
// of this process), and reports whether it did.
func (m *manager) bumpSequenceLocked() bool {
	changed := false
	if st := m.journal.Settings; st != nil && st.RefreshHintSeconds != int64(m.cfg.RefreshHint/time.Second) && len(m.roots) > 0 {
		// The hint is part of the published document.
		m.journal.Sequence = nextSequence(m.journal.Sequence, m.cfg.Clock.Now())
		changed = true
	}
	if !m.floored && len(m.roots) > 0 {
		// The first write of this process publishes a new sequence: the
		// state may be a restored copy whose counter is below what peers
		// hold (see sequence.go).
		prev := m.journal.Sequence
		m.journal.Sequence = nextSequence(prev, m.cfg.Clock.Now())
		m.cfg.Logger.Info("CA state loaded; publishing it with a new sequence, above anything published before this start",
			logattr.OldSequence, prev, logattr.Sequence, m.journal.Sequence)
		changed = true
	}
	return changed
}

// applyDueStepsLocked applies the rotation steps the timeline plans for
// now, one after another, and reports whether it applied any. Several
// can be due at once, after the server was down past more than one.
func (m *manager) applyDueStepsLocked() (bool, error) {
	return m.applyDue(m.timelineLocked, m.timesLocked, m.applyLocked)
}

// applyDue applies, one after another, the steps the timeline tl plans
// for the lifecycle items times describes (roots or JWT keys), with
// apply, and reports whether it applied any.
func (m *manager) applyDue(tl func() timeline, times func() []rootTimes, apply func(time.Time, step, int) error) (bool, error) {
	changed := false
	for range 10 { // a handful of steps at most; the bound guards against a plan bug
		now := m.cfg.Clock.Now()
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

func (m *manager) timesLocked() []rootTimes {
	out := make([]rootTimes, len(m.roots))
	for i, r := range m.roots {
		out[i] = rootTimes{
			State: r.State, NotBefore: r.Cert.NotBefore, NotAfter: r.Cert.NotAfter,
			PreparedAt: r.PreparedAt, MinActivateAt: r.MinActivateAt, PublishedAt: r.PublishedAt, RemoveAfter: r.RemoveAfter,
		}
	}
	return out
}

func (m *manager) applyLocked(now time.Time, step step, index int) error {
	switch step {
	case stepBootstrap:
		return m.newRootLocked(now, castate.StateActive, "bootstrap")
	case stepPrepare:
		return m.prepareLocked(now, "scheduled")
	case stepActivate:
		for _, r := range m.roots {
			if r.State == castate.StateActive {
				r.State = castate.StateRetired
				r.RetiredAt = now
				r.RemoveAfter = m.timelineLocked().removeAfter(rootTimes{NotAfter: r.Cert.NotAfter}, now.Add(retireMargin))
				m.event(now, "retired", r.ID)
			}
		}
		p := m.roots[index]
		p.State = castate.StateActive
		p.ActivatedAt = now
		m.event(now, "activated", p.ID)
		return nil
	case stepRemove:
		r := m.roots[index]
		m.roots = append(m.roots[:index:index], m.roots[index+1:]...)
		m.journal.Sequence = nextSequence(m.journal.Sequence, now)
		m.event(now, "removed", r.ID)
		return nil
	}
	return fmt.Errorf("ca: unknown rotation step %v", step)
}

func (m *manager) prepareLocked(now time.Time, why string) error {
	if err := m.newRootLocked(now, castate.StatePrepared, why); err != nil {
		return err
	}
	return nil
}

func (m *manager) newRootLocked(now time.Time, state castate.RootState, why string) error {
	cert, key, ref, err := m.newRootKeyed(now)
	if err != nil {
		return fmt.Errorf("ca: create root: %w", err)
	}
	id := cert.SerialNumber.Text(16)
	r := &castate.Root{RootRecord: castate.RootRecord{ID: id, State: state, CertSHA256: fingerprint(cert), PreparedAt: now, PublishedAt: now, KeyRef: ref}, Cert: cert, Key: key}
	if state == castate.StatePrepared {
		r.MinActivateAt = now.Add(PublishLead * m.cfg.RefreshHint)
	} else {
		r.ActivatedAt = now
	}
	m.roots = append(m.roots, r)
	m.journal.Sequence = nextSequence(m.journal.Sequence, now)
	event := "prepared (" + why + ")"
	if state == castate.StateActive {
		event = "bootstrap"
	}
	m.event(now, event, id)
	return nil
}

func (m *manager) event(now time.Time, what, id string) {
	m.journal.Events = append(m.journal.Events, castate.JournalNote{At: now, Event: what, RootID: id})
	m.metrics.rotations.WithLabelValues(firstWord(what)).Inc()
	m.cfg.Logger.Info("CA root "+what, logattr.RootID, id, logattr.Sequence, m.journal.Sequence)
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
